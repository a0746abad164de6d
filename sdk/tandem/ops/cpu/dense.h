// CPU kernels behind ops::dense: the fused forward y = act(x @ w + bias) and the one pass of its
// backward that masks the output gradient and sums it into the bias gradient. Row-major,
// contiguous matrices.
#pragma once

#include <cstdint>

namespace tandem::ops::cpu {

/// y [m, n] = act(x [m, k] @ w [k, n] + bias [n]), act = ReLU when `relu`, else the identity;
/// `bias` may be null. float32 runs one oneDNN matmul primitive with the bias and the ReLU
/// applied to the accumulator (primitives are cached per shape, epilogue and thread budget);
/// float64, and float32 without oneDNN, run cpu::gemm and one epilogue pass over y.
void dense(int64_t m, int64_t n, int64_t k, const float* x, const float* w, const float* bias,
           bool relu, float* y);
void dense(int64_t m, int64_t n, int64_t k, const double* x, const double* w, const double* bias,
           bool relu, double* y);

/// One pass over the output gradient g [m, n] of a ReLU dense layer with output y [m, n]:
/// dz = g where y > 0, else 0; bias_grad [n] (skipped when null) = the column sums of dz,
/// accumulated in double in row order as cpu::sum does, so it equals sum(dz, axis 0) bitwise.
template <typename T>
void dense_relu_backward(int64_t m, int64_t n, const T* g, const T* y, T* dz, T* bias_grad);

}  // namespace tandem::ops::cpu
