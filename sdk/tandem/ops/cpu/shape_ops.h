// CPU data movement: axis permutation and one-hot encoding (with the label check it needs).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace tandem::ops::cpu {

/// y = x with its axes permuted (y.dims[i] = dims[perm[i]]), for elements of `element_size`
/// bytes (1, 4 or 8: the data is only moved).
void transpose(size_t element_size, const std::vector<int64_t>& dims,
               const std::vector<int64_t>& perm, const void* x, void* y);

/// Index of the first label outside [0, depth), or -1 when all are valid.
template <typename L>
int64_t first_invalid_label(const L* labels, int64_t n, int64_t depth);

/// y [n, depth] = one-hot rows of labels (all valid).
template <typename L, typename T>
void one_hot(const L* labels, int64_t n, int64_t depth, T* y);

}  // namespace tandem::ops::cpu
