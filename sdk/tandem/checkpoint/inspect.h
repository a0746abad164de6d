// inspect_checkpoint: a readable summary of one checkpoint file (what `tandem-ckpt inspect`
// prints): format, step, every variable with shape and dtype, the optimizer, the training state.
#pragma once

#include <string>

namespace tandem {

/// Describes the checkpoint at `path` without needing the model that wrote it. Raises
/// tandem::Error naming the file when it is missing, damaged or not a Tandem checkpoint.
std::string inspect_checkpoint(const std::string& path);

/// Checks, without the model that wrote it, that the checkpoint at `path` would restore: a
/// regular HDF5 file of a format this build reads, with /model_weights and /training_state,
/// whose model_signature matches its own layout, every dataset read back (so every checksum
/// verified) and every value possible (finite weights and slots, Adam's v >= 0, counters in
/// [0, 2^53], metric counts >= 0, shuffle buffers without repeats). Returns "" when it does,
/// else the reason, naming the file and the dataset.
std::string verify_checkpoint(const std::string& path);

/// Whether the checkpoint at `path` declares Fletcher-32 checksums on its datasets (every file
/// Tandem writes now does; files from before the checksums restore without them).
bool checkpoint_has_checksums(const std::string& path);

}  // namespace tandem
