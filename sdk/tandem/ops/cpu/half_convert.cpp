// Conversions between float32 and the 16-bit types (half_convert.h): each loop built for
// x86-64-v4, x86-64-v3 and the baseline, run as cpu_isa() says (TANDEM_CPU_DISPATCH).
#include "tandem/ops/cpu/half_convert.h"

#include "tandem/ops/cpu/cpu_dispatch.h"

namespace tandem::ops::cpu {

namespace {

template <typename From, typename To>
TANDEM_CPU_LOOP void convert_loop(const From* __restrict x, To* __restrict y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = static_cast<To>(x[i]);
}

}  // namespace

TANDEM_CPU_DISPATCH(convert, convert_loop, (const float* x, bfloat16* y, int64_t n), (x, y, n))

TANDEM_CPU_DISPATCH(convert, convert_loop, (const float* x, float16* y, int64_t n), (x, y, n))

TANDEM_CPU_DISPATCH(convert, convert_loop, (const bfloat16* x, float* y, int64_t n), (x, y, n))

TANDEM_CPU_DISPATCH(convert, convert_loop, (const float16* x, float* y, int64_t n), (x, y, n))

}  // namespace tandem::ops::cpu
