// CPU kernels behind ops::dense: the fused forward y = act(x @ w + bias) and the one pass of its
// backward that masks the output gradient and sums it into the bias gradient. Row-major,
// contiguous matrices.
#pragma once

#include <cstdint>

#include "tandem/core/half.h"

namespace tandem::ops::cpu {

/// y [m, n] = act(x [m, k] @ w [k, n] + bias [n]), act = ReLU when `relu`, else the identity;
/// `bias` may be null. float32 runs one oneDNN matmul primitive with the bias and the ReLU
/// applied to the accumulator (primitives are cached per shape, epilogue and thread budget);
/// float64, and float32 without oneDNN, run cpu::gemm and one epilogue pass over y.
void dense(int64_t m, int64_t n, int64_t k, const float* x, const float* w, const float* bias,
           bool relu, float* y);
void dense(int64_t m, int64_t n, int64_t k, const double* x, const double* w, const double* bias,
           bool relu, double* y);
/// The 16-bit dense: the products summed in float32, the bias and ReLU applied to the float32
/// accumulator, y rounded once. bfloat16 is one oneDNN matmul primitive (AVX512-BF16 or AMX
/// where the CPU has them); float16, and bfloat16 without oneDNN, widen to float32, run the
/// float32 dense and round (emulated: no faster than float32).
void dense(int64_t m, int64_t n, int64_t k, const bfloat16* x, const bfloat16* w,
           const bfloat16* bias, bool relu, bfloat16* y);
void dense(int64_t m, int64_t n, int64_t k, const float16* x, const float16* w, const float16* bias,
           bool relu, float16* y);

/// c [m, n] = op(a) op(b) of contiguous row-major 16-bit matrices (a [m, k], or [k, m] when
/// transpose_a; b [k, n], or [n, k] when transpose_b), summed in float32 and rounded once; as
/// the 16-bit dense above (oneDNN for bfloat16, float32 emulation for float16). k == 0 writes
/// zeros.
void matmul(bool transpose_a, bool transpose_b, int64_t m, int64_t n, int64_t k, const bfloat16* a,
            const bfloat16* b, bfloat16* c);
void matmul(bool transpose_a, bool transpose_b, int64_t m, int64_t n, int64_t k, const float16* a,
            const float16* b, float16* c);

/// One pass over the output gradient g [m, n] of a ReLU dense layer with output y [m, n]:
/// dz = g where y > 0, else 0; bias_grad [n] (skipped when null) = the column sums of dz,
/// accumulated in double in row order as cpu::sum does, so it equals sum(dz, axis 0) bitwise.
template <typename T>
void dense_relu_backward(int64_t m, int64_t n, const T* g, const T* y, T* dz, T* bias_grad);

}  // namespace tandem::ops::cpu
