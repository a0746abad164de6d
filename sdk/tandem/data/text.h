// Text for language models: reading a corpus, and the random windows of a token sequence that
// nanoGPT's get_batch draws, as a dataset (deterministic per seed, resumable, split across
// replicas and workers as any dataset).
#pragma once

#include <cstdint>
#include <string>

#include "tandem/data/dataset.h"

namespace tandem::data {

/// The whole file `path` as bytes; raises naming the file when it cannot be read.
std::string read_text_file(const std::string& path);

/// Random windows of `tokens` (int32 or int64, [n]), nanoGPT's get_batch as a dataset: element i
/// is {x, y}, int64 [window] each, x = tokens[o, o + window) and y = tokens[o + 1, o + window + 1)
/// (each position's next token), where the offset o is uniform in [0, n - window) and a pure
/// function of (seed, i) (Philox block i of stream 0 of `seed`; 64 bits reduced modulo
/// n - window, a bias below 2^-40 for any corpus that fits in memory). `count` elements: one
/// epoch; every epoch repeats them, so make it the windows of the whole run (steps x global
/// batch). Random access, so .batch() gathers windows straight into batches, a shuffle keeps
/// indices, and an iterator's saved state is a position: a run resumes mid-epoch exactly. A
/// distributed dataset gives each replica and worker its own rows of each global batch: their
/// own windows. Needs n > window.
Dataset random_windows(const Tensor& tokens, int64_t window, int64_t count, uint64_t seed);

}  // namespace tandem::data
