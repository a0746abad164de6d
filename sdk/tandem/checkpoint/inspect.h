// inspect_checkpoint: a readable summary of one checkpoint file (what `tandem-ckpt inspect`
// prints): format, step, every variable with shape and dtype, the optimizer, the training state.
#pragma once

#include <string>

namespace tandem {

/// Describes the checkpoint at `path` without needing the model that wrote it. Raises
/// tandem::Error naming the file when it is missing, damaged or not a Tandem checkpoint.
std::string inspect_checkpoint(const std::string& path);

}  // namespace tandem
