// Durable file-system steps of the checkpoint write protocol (internal): fsync of files and
// directories, temporary names, and small text files replaced atomically.
#pragma once

#include <functional>
#include <string>
#include <string_view>

namespace tandem::detail {

/// "<path>.tmp.<pid>": the name a file is written under before it is renamed into place.
std::string temp_path_for(const std::string& path);
/// True for names this layer writes as temporaries ("ckpt-7.h5.tmp.123", "checkpoint.tmp.9").
bool is_temp_name(std::string_view file_name);

/// Forces `path`'s data to stable storage; raises naming the file.
void fsync_file(const std::string& path);
/// Forces `directory`'s entries (creations, renames, deletions) to stable storage.
void fsync_directory(const std::string& directory);
/// Renames `from` to `to` (atomic on POSIX file systems); raises naming both.
void rename_file(const std::string& from, const std::string& to);
/// Replaces `path` with `contents`: written to a temporary (exclusive create), fsynced, renamed
/// over `path`, and the directory fsynced. Readers see the old or the new file, never a mix.
void write_file_atomically(const std::string& path, const std::string& contents);

/// Test hook: called with the name of each step of a save ("temp_created", "model_weights",
/// "optimizer_weights", "training_state", "temp_closed", "temp_synced", "renamed",
/// "state_written", "rotated") so that crash tests can stop a process at that point.
using SavePointHook = std::function<void(std::string_view point)>;
/// Installs `hook` (an empty function removes it) and returns the previous one.
SavePointHook set_checkpoint_save_hook(SavePointHook hook);
/// Calls the installed hook, if any.
void checkpoint_save_point(std::string_view point);

}  // namespace tandem::detail
