// Activations with vectorised CPU loops of their own, where the generic elementwise loop would
// call a scalar libm function per element: GELU (exact, erf form) forward and backward, and
// softmax's exponentials (fused attention's score rows). Each
// loop is built for x86-64-v4, x86-64-v3 and the baseline (TANDEM_CPU_DISPATCH); all three give
// the same bits.
#pragma once

#include <cstdint>

namespace tandem::ops::cpu {

/// y[i] = x[i] Phi(x[i]) for i < n (GELU; Phi the standard normal CDF); y may alias x. No
/// threads: callers split the work.
void gelu(const float* x, float* y, int64_t n);

/// dx[i] = g[i] (Phi(x[i]) + x[i] phi(x[i])) for i < n: GELU's input gradient from its input
/// x and the upstream gradient g (phi the standard normal density); dx may alias x or g.
void gelu_grad(const float* x, const float* g, float* dx, int64_t n);

/// x[i] = e^(x[i] - shift) for i < n, in place (vmath::exp: within 2 ulp; e^-inf = 0). No
/// threads.
void exp_shifted(float* x, int64_t n, float shift);

}  // namespace tandem::ops::cpu
