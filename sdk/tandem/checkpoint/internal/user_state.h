// The program's own state in a checkpoint: float64/float32 counters
// (/training_state/counters/<name>) and TrackedState objects (/training_state/user/<name>/<key>),
// written, read and checked before a restore changes anything, then applied. Internal to the
// checkpoint layer.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "tandem/checkpoint/checkpoint.h"
#include "tandem/checkpoint/internal/file_image.h"
#include "tandem/io/internal/hdf5_file.h"

namespace tandem::detail {

/// The group of /training_state that TrackedState objects live under.
inline constexpr const char* kUserState = "user";

/// Writes the tracked double and float counters and every TrackedState's save_state() into
/// /training_state (`group`). Raises naming the entry and key of a key that is not a dataset
/// name, an undefined tensor or a dtype a checkpoint does not store.
void write_user_state(const ImageGroup& group, const std::vector<Checkpoint::Entry>& entries);

/// What a restore read of the program's state, checked and ready to apply.
struct LoadedUserState {
  std::map<std::string, double> doubles;              // tracked name -> value
  std::map<std::string, float> floats;                // tracked name -> value
  std::map<std::string, TrackedState::State> states;  // tracked name -> its state
};

/// Reads and checks (TrackedState::check_state) the program's state from /training_state
/// (`group`) of the file `path`. An entry the file lacks is logged and left out (it keeps its
/// value); a counter of another dtype, or a state check_state refuses, raises naming the file
/// and the entry.
LoadedUserState load_user_state(const h5::Group& group,
                                const std::vector<Checkpoint::Entry>& entries,
                                const std::string& path);

/// Gives the tracked objects what load_user_state read.
void apply_user_state(const LoadedUserState& loaded, const std::vector<Checkpoint::Entry>& entries);

}  // namespace tandem::detail
