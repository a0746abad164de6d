// parallel_for: splits [0, n) into one contiguous chunk per OpenMP thread of the calling
// thread's compute budget (tandem::set_compute_threads), or runs inline when the work is small.
#pragma once

#include <omp.h>

#include <algorithm>
#include <cstdint>

#include "tandem/core/threading.h"

namespace tandem::ops::cpu {

/// Elements per thread below which elementwise loops stay on the calling thread. Measured by
/// bench_parallel_grain_cpu (2 cores, AVX-512): a team of two costs about 1.3 us a call, and
/// an in-place float add over 16K elements runs as fast inline as on the team (0.97), over 32K
/// 0.83 of the time on the team; so a team is used from 2 x 16K elements.
inline constexpr int64_t kElementwiseGrain = int64_t{1} << 14;

/// The same for loops that do several times an add's work per element (the fused optimizer
/// updates: Adam's sqrt and division): the team pays from 2 x 4K elements (0.82 of inline at
/// 8K, 1.07 at 4K).
inline constexpr int64_t kHeavyElementwiseGrain = int64_t{1} << 12;

/// Calls fn(begin, end) on disjoint chunks covering [0, n), at most one chunk per thread and
/// at least `grain` elements per chunk. fn must not throw (it may run inside an OpenMP team).
template <typename Fn>
void parallel_for(int64_t n, int64_t grain, const Fn& fn) {
  if (n <= 0) return;
  const int64_t threads = std::min<int64_t>(omp_get_max_threads(), n / std::max<int64_t>(grain, 1));
  if (threads <= 1 || omp_in_parallel()) {
    fn(int64_t{0}, n);
    return;
  }
  const uint32_t mode = float_mode();  // the team computes as the calling thread does
#pragma omp parallel num_threads(static_cast <int>(threads))
  {
    set_float_mode(mode);
    const int64_t t = omp_get_thread_num(), count = omp_get_num_threads();
    // Chunks are multiples of 64 elements, so no two threads write the same cache line.
    const int64_t chunk = ((n + count - 1) / count + 63) / 64 * 64;
    const int64_t begin = std::min(n, t * chunk), end = std::min(n, begin + chunk);
    if (begin < end) fn(begin, end);
  }
}

/// For a tensor viewed as [outer, n, inner] (a reduction over n): calls fn(o, i0, i1) on
/// disjoint column ranges [i0, i1) of outer slice o, split across threads by total work.
template <typename Fn>
void parallel_for_columns(int64_t outer, int64_t n, int64_t inner, const Fn& fn) {
  const int64_t grain = std::max<int64_t>(1, kElementwiseGrain / std::max<int64_t>(n, 1));
  parallel_for(outer * inner, grain, [&](int64_t begin, int64_t end) {
    while (begin < end) {
      const int64_t o = begin / inner, i0 = begin % inner;
      const int64_t i1 = std::min(inner, i0 + (end - begin));
      fn(o, i0, i1);
      begin += i1 - i0;
    }
  });
}

}  // namespace tandem::ops::cpu
