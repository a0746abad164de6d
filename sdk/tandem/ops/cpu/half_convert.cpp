// Conversions between float32 and the 16-bit types (half_convert.h): each loop is cloned for
// x86-64-v4 and the baseline (GCC's and Clang's target_clones; the dynamic loader picks one).
#include "tandem/ops/cpu/half_convert.h"

#include "tandem/ops/cpu/cpu_clones.h"

namespace tandem::ops::cpu {

namespace {

template <typename From, typename To>
inline void convert_loop(const From* __restrict x, To* __restrict y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = static_cast<To>(x[i]);
}

}  // namespace

TANDEM_CPU_CLONES void convert(const float* x, bfloat16* y, int64_t n) { convert_loop(x, y, n); }

TANDEM_CPU_CLONES void convert(const float* x, float16* y, int64_t n) { convert_loop(x, y, n); }

TANDEM_CPU_CLONES void convert(const bfloat16* x, float* y, int64_t n) { convert_loop(x, y, n); }

TANDEM_CPU_CLONES void convert(const float16* x, float* y, int64_t n) { convert_loop(x, y, n); }

}  // namespace tandem::ops::cpu
