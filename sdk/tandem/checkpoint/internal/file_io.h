// Durable file-system steps of the checkpoint write protocol (internal): fsync of files and
// directories, temporary files, and small text files replaced atomically.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <functional>
#include <string>
#include <string_view>

namespace tandem::detail {

/// The name a file is written under before it is renamed to `path`: "<path>.tmp.<pid>" for
/// `attempt` 0; later attempts add a random suffix ("<path>.tmp.<pid>.<16 hex digits>"), a name
/// nobody can plant in advance.
std::string temp_path_for(const std::string& path, int attempt = 0);
/// How many names create_temp_beside and unused_temp_path_for try before they give up.
inline constexpr int kTempAttempts = 8;
/// A temp_path_for(path, attempt) name at which nothing exists now (no file, symbolic link,
/// FIFO): for writers that create the file themselves exclusively (HDF5), which must never be
/// handed a name another process holds. Raises naming `path` when kTempAttempts names are taken.
std::string unused_temp_path_for(const std::string& path);

/// A temporary file this process created and holds open for writing.
struct TempFile {
  int fd = -1;       ///< open for writing, close-on-exec
  std::string path;  ///< its name, beside the file it is for
};
/// Creates a new temporary file beside `path` (same directory, so that a rename replaces `path`
/// atomically) with open(O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode): never an
/// existing file, symbolic link or FIFO (no write through another user's link, no blocking
/// open); a taken name is passed over for the next temp_path_for attempt. Raises naming the
/// name and the reason when the file cannot be made. The caller closes `fd` and removes the
/// file unless it renames it.
TempFile create_temp_beside(const std::string& path, mode_t mode);
/// Writes `size` bytes at `data` to `fd` (short writes and EINTR continue); raises naming `path`.
void write_all(int fd, const char* data, size_t size, const std::string& path);
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
