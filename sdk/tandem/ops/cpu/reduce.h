// CPU reductions over one axis of a tensor viewed as [outer, n, inner] (a full reduction is
// outer = inner = 1): sum, max with argmax, and the argmax scatter behind max's gradient.
#pragma once

#include <cstdint>

namespace tandem::ops::cpu {

/// y[o, i] = sum_k x[o, k, i]. Accumulates in double (floating) or int64 (integers) over
/// fixed blocks, so the result does not depend on the thread count.
template <typename T>
void sum(const T* x, int64_t outer, int64_t n, int64_t inner, T* y);

/// y[o, i] = max_k x[o, k, i] and argmax[o, i] = the first k reaching it; n >= 1. Either
/// output may be null.
template <typename T>
void max(const T* x, int64_t outer, int64_t n, int64_t inner, T* y, int64_t* argmax);

/// dx[o, k, i] = g[o, i] where k == argmax[o, i], else 0 (dx is overwritten).
template <typename T>
void scatter_argmax(const T* g, const int64_t* argmax, int64_t outer, int64_t n, int64_t inner,
                    T* dx);

}  // namespace tandem::ops::cpu
