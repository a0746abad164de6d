// CPU reductions. Rows (inner == 1) reduce with contiguous SIMD loops; otherwise each thread
// reduces a range of columns, accumulating whole rows of them at a time.
#include "tandem/ops/cpu/reduce.h"

#include <type_traits>
#include <vector>

#include "tandem/ops/cpu/parallel.h"
#include "tandem/ops/kernels/op_list.h"

namespace tandem::ops::cpu {

namespace {

// Floating sums (the 16-bit types' too) accumulate in double, integer ones in int64.
template <typename T>
using Acc = std::conditional_t<std::is_floating_point_v<compute_type_t<T>>, double, int64_t>;

// Sums are taken over blocks of this many elements, then the block sums in order: the same
// grouping whether one thread or many did the blocks.
constexpr int64_t kSumBlock = 8192;

template <typename T>
Acc<T> block_sum(const T* x, int64_t n) {
  Acc<T> acc = 0;
#pragma omp simd reduction(+ : acc)
  for (int64_t i = 0; i < n; ++i) acc += static_cast<Acc<T>>(x[i]);
  return acc;
}

template <typename T>
Acc<T> row_sum(const T* x, int64_t n) {
  Acc<T> acc = 0;
  for (int64_t b = 0; b < n; b += kSumBlock) acc += block_sum(x + b, std::min(kSumBlock, n - b));
  return acc;
}

// row_sum of one long row, its blocks spread over the threads.
template <typename T>
Acc<T> parallel_row_sum(const T* x, int64_t n) {
  const int64_t blocks = (n + kSumBlock - 1) / kSumBlock;
  std::vector<Acc<T>> partial(static_cast<size_t>(blocks));
  parallel_for(
      blocks, std::max<int64_t>(1, kElementwiseGrain / kSumBlock), [&](int64_t begin, int64_t end) {
        for (int64_t b = begin; b < end; ++b)
          partial[b] = block_sum(x + b * kSumBlock, std::min(kSumBlock, n - b * kSumBlock));
      });
  Acc<T> acc = 0;
  for (const Acc<T>& p : partial) acc += p;
  return acc;
}

}  // namespace

template <typename T>
void sum(const T* x, int64_t outer, int64_t n, int64_t inner, T* y) {
  if (outer == 1 && inner == 1) {
    y[0] = static_cast<T>(parallel_row_sum(x, n));
    return;
  }
  parallel_for_columns(outer, n, inner, [&](int64_t o, int64_t i0, int64_t i1) {
    const T* base = x + o * n * inner;
    if (inner == 1) {
      y[o] = static_cast<T>(row_sum(base, n));
      return;
    }
    std::vector<Acc<T>> acc(static_cast<size_t>(i1 - i0), Acc<T>(0));
    for (int64_t k = 0; k < n; ++k) {
      const T* row = base + k * inner + i0;
      for (int64_t i = 0; i < i1 - i0; ++i) acc[i] += static_cast<Acc<T>>(row[i]);
    }
    for (int64_t i = i0; i < i1; ++i) y[o * inner + i] = static_cast<T>(acc[i - i0]);
  });
}

template <typename T>
void max(const T* x, int64_t outer, int64_t n, int64_t inner, T* y, int64_t* argmax) {
  parallel_for_columns(outer, n, inner, [&](int64_t o, int64_t i0, int64_t i1) {
    const T* base = x + o * n * inner;
    if (inner == 1) {
      T best = base[0];
      int64_t best_k = 0;
      for (int64_t k = 1; k < n; ++k) {
        if (base[k] > best) {
          best = base[k];
          best_k = k;
        }
      }
      if (y) y[o] = best;
      if (argmax) argmax[o] = best_k;
      return;
    }
    const int64_t width = i1 - i0;
    std::vector<T> best(base + i0, base + i1);
    std::vector<int64_t> best_k(static_cast<size_t>(width), 0);
    for (int64_t k = 1; k < n; ++k) {
      const T* row = base + k * inner + i0;
      for (int64_t i = 0; i < width; ++i) {
        if (row[i] > best[i]) {
          best[i] = row[i];
          best_k[i] = k;
        }
      }
    }
    for (int64_t i = 0; i < width; ++i) {
      if (y) y[o * inner + i0 + i] = best[i];
      if (argmax) argmax[o * inner + i0 + i] = best_k[i];
    }
  });
}

template <typename T>
void scatter_argmax(const T* g, const int64_t* argmax, int64_t outer, int64_t n, int64_t inner,
                    T* dx) {
  parallel_for_columns(outer, n, inner, [&](int64_t o, int64_t i0, int64_t i1) {
    T* base = dx + o * n * inner;
    for (int64_t k = 0; k < n; ++k)
      for (int64_t i = i0; i < i1; ++i) base[k * inner + i] = T(0);
    for (int64_t i = i0; i < i1; ++i) base[argmax[o * inner + i] * inner + i] = g[o * inner + i];
  });
}

#define TANDEM_REDUCE(F, T)                                      \
  template void sum<T>(const T*, int64_t, int64_t, int64_t, T*); \
  template void max<T>(const T*, int64_t, int64_t, int64_t, T*, int64_t*);
#define TANDEM_SCATTER(F, T) \
  template void scatter_argmax<T>(const T*, const int64_t*, int64_t, int64_t, int64_t, T*);
TANDEM_ANY_NUMERIC_TYPES(TANDEM_REDUCE, _)
TANDEM_ANY_FLOATING_TYPES(TANDEM_SCATTER, _)

}  // namespace tandem::ops::cpu
