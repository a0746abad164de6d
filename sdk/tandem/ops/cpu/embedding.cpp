// Embedding lookups: rows of a table gathered by index, and the adjoint that adds gradient rows
// back into the rows they came from, in the order of the indices (so the sums are the same on
// every run, and the CUDA kernel's).
#include <algorithm>
#include <cstring>

#include "tandem/core/half.h"
#include "tandem/ops/cpu/nn_kernels.h"

namespace tandem::ops::cpu {

namespace {
// Below this many elements copied a parallel region costs more than it saves.
constexpr int64_t kParallelMinElements = int64_t{1} << 16;
}  // namespace

template <typename T, typename L>
void embedding_forward(const T* table, int64_t width, const L* indices, int64_t n, T* y) {
  const auto bytes = static_cast<size_t>(width) * sizeof(T);
#pragma omp parallel for schedule(static) if (n * width >= kParallelMinElements)
  for (int64_t i = 0; i < n; ++i)
    std::memcpy(y + i * width, table + static_cast<int64_t>(indices[i]) * width, bytes);
}

template <typename T, typename L>
void embedding_backward(const T* dy, const L* indices, int64_t n, int64_t rows, int64_t width,
                        T* dtable) {
  std::fill_n(dtable, rows * width, T(0));
  // Serial over the indices: two of them may name one row, and the order fixes the sums.
  for (int64_t i = 0; i < n; ++i) {
    T* out = dtable + static_cast<int64_t>(indices[i]) * width;
    const T* g = dy + i * width;
#pragma omp simd
    for (int64_t c = 0; c < width; ++c) out[c] += g[c];
  }
}

#define TANDEM_CPU_EMBEDDING(T, L)                                                 \
  template void embedding_forward<T, L>(const T*, int64_t, const L*, int64_t, T*); \
  template void embedding_backward<T, L>(const T*, const L*, int64_t, int64_t, int64_t, T*);
TANDEM_CPU_EMBEDDING(float, int32_t)
TANDEM_CPU_EMBEDDING(float, int64_t)
TANDEM_CPU_EMBEDDING(double, int32_t)
TANDEM_CPU_EMBEDDING(double, int64_t)
#undef TANDEM_CPU_EMBEDDING

}  // namespace tandem::ops::cpu
