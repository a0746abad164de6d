// The directory a CheckpointManager manages (internal): checkpoint file names and numbers,
// the `checkpoint` state file (TensorFlow's CheckpointState in protobuf text format), and the
// order in which a restore tries the files.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace tandem::detail {

/// The state file's name in a checkpoint directory.
inline constexpr const char* kStateFileName = "checkpoint";

/// N of "ckpt-N.h5", or std::nullopt for any other name.
std::optional<int64_t> checkpoint_number(const std::string& file_name);
/// "ckpt-<step>.h5".
std::string checkpoint_file_name(int64_t step);
/// The ckpt-N.h5 files of `directory` as (N, name), oldest first.
std::vector<std::pair<int64_t, std::string>> scan_checkpoints(const std::string& directory);

struct StateFile {
  std::string latest;            ///< model_checkpoint_path
  std::vector<std::string> all;  ///< all_model_checkpoint_paths, oldest first
};
/// The state file of `directory`, or std::nullopt when it is missing or unreadable.
std::optional<StateFile> read_state_file(const std::string& directory);
/// The state file's text for the checkpoints `kept` (oldest first; the last is the latest).
std::string format_state_file(const std::vector<std::string>& kept);
/// `name` (as the state file lists it) as a path in `directory`.
std::string resolve(const std::string& directory, const std::string& name);
/// The files a restore tries, newest first: the state file's latest, then every ckpt-N.h5 by
/// N descending; `note` (when not null) says why the state file was not used, if it was not.
std::vector<std::string> restore_candidates(const std::string& directory, std::string* note);

}  // namespace tandem::detail
