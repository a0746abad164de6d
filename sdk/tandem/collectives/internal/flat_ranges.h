// The arguments of the flat reduce_scatter and all_gather (Note [flat ranges] in
// communicator.h) as every backend checks, describes and signs them.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "tandem/tensor/tensor.h"

namespace tandem::collectives {

/// What is wrong with `buffer` (called `what` in the message: "the input", "the buffer") and
/// `offsets` as the flat collectives of `ranks` ranks take them, or "" when nothing is: the
/// buffer must be defined and 1-D, numeric when `reduce`; `offsets` must have ranks + 1
/// nondecreasing entries from 0 to the buffer's numel.
std::string flat_ranges_problem(const Tensor& buffer, std::span<const int64_t> offsets, int ranks,
                                const char* what, bool reduce);

/// What is wrong with the `output` of a flat reduce_scatter for rank `rank`'s range of `input`
/// (already checked with flat_ranges_problem), or "" when it fits: 1-D, of the range's length,
/// and of the input's dtype and device.
std::string flat_output_problem(const Tensor& input, const Tensor& output,
                                std::span<const int64_t> offsets, int rank);

/// Raises "`transport` `label`: ..." unless `buffer` is a CPU tensor that `offsets` cut into
/// the ranges of `workers` workers (flat_ranges_problem): the workers' own check.
void check_worker_ranges(const Tensor& buffer, std::span<const int64_t> offsets, int workers,
                         const char* transport, const char* label, bool reduce);

/// "[0, 3, 3, 10]" (long lists elided in the middle).
std::string describe_offsets(std::span<const int64_t> offsets);

/// A digest of `offsets` for the call signatures that ranks compare before moving data.
int64_t offsets_digest(std::span<const int64_t> offsets);

/// `offsets` of global ranks restricted to groups of `group` consecutive ranks: entry k is
/// offsets[k * group], for k = 0 .. (offsets.size() - 1) / group (the workers' ranges when
/// every worker holds `group` replicas).
std::vector<int64_t> group_offsets(std::span<const int64_t> offsets, int group);

}  // namespace tandem::collectives
