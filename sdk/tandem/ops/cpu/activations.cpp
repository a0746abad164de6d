// The loops of activations.h: vmath's branch-free exponential, Phi and phi, vectorised by the
// compiler at the width of each build (TANDEM_CPU_DISPATCH). Built without multiply-add
// contraction (CMakeLists.txt), so the AVX-512, AVX2 and baseline builds round every operation
// alike.
#include "tandem/ops/cpu/activations.h"

#include "tandem/ops/cpu/cpu_dispatch.h"
#include "tandem/ops/cpu/vector_math.h"

namespace tandem::ops::cpu {

namespace {

TANDEM_CPU_LOOP void gelu_loop(const float* x, float* y, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    const float v = x[i];
    y[i] = v * vmath::normal_cdf_pdf(v).cdf;
  }
}

TANDEM_CPU_LOOP void gelu_grad_loop(const float* x, const float* g, float* dx, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    const float v = x[i];
    const vmath::NormalCdfPdf d = vmath::normal_cdf_pdf(v);
    dx[i] = g[i] * (d.cdf + v * d.pdf);
  }
}

TANDEM_CPU_LOOP void exp_shifted_loop(float* x, int64_t n, float shift) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) x[i] = vmath::exp(x[i] - shift);
}

}  // namespace

TANDEM_CPU_DISPATCH(gelu, gelu_loop, (const float* x, float* y, int64_t n), (x, y, n))
TANDEM_CPU_DISPATCH(gelu_grad, gelu_grad_loop,
                    (const float* x, const float* g, float* dx, int64_t n), (x, g, dx, n))
TANDEM_CPU_DISPATCH(exp_shifted, exp_shifted_loop, (float* x, int64_t n, float shift),
                    (x, n, shift))

}  // namespace tandem::ops::cpu
