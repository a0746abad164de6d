// The dense layer's forward on the GPU through cuBLASLt: one matmul whose epilogue adds the bias
// and applies the ReLU, where cuBLAS' GEMM would be followed by two elementwise passes over the
// output (float64 keeps that path). The 16-bit types sum in float32 and round y once, bias and
// ReLU applied to the float32 accumulator, as the CPU's 16-bit dense does.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <type_traits>

#include "tandem/ops/cuda/cuda_kernels.h"
#include "tandem/ops/cuda/lt_matmul.h"
#include "tandem/ops/cuda/scratch.h"
#include "tandem/tensor/device_runtime.h"

namespace tandem::ops::cuda {

namespace {

/// The forward as one cublasLtMatmul; false, having done nothing, where cuBLASLt has no
/// algorithm for the case (an unusual alignment, say).
template <typename T>
bool matmul_with_epilogue(int64_t m, int64_t n, int64_t k, const T* x, const T* kernel,
                          const T* bias, bool relu, T* y, cudaStream_t stream) {
  LtMatmul call;
  call.m = m;
  call.n = n;
  call.k = k;
  call.a = x;
  call.lda = k;
  call.b = kernel;
  call.ldb = n;
  call.d = y;
  call.ldd = n;
  call.input_type = call.output_type = lt_data_type<T>();
  call.bias = bias;
  call.relu = relu;
  if constexpr (is_half_v<T>) {
    call.compute = CUBLAS_COMPUTE_32F;
    call.use_workspace = true;
  } else {
    // float32 in the math mode gemm uses, and without a workspace, so a forward allocates
    // nothing.
    call.compute = tandem::cuda::allow_tf32() ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  }
  return lt_matmul(call, stream);
}

/// The 16-bit forward where cuBLASLt fuses no epilogue for the case: the product, the bias and
/// the ReLU in float32, then y rounded once (one scratch matrix more than the fused form).
template <typename H>
void dense_through_float32(int64_t m, int64_t n, int64_t k, const H* x, const H* kernel,
                           const H* bias, bool relu, H* y, cudaStream_t stream) {
  const int64_t size = m * n;
  Scratch y32(static_cast<size_t>(size) * sizeof(float));
  auto* z = static_cast<float*>(y32.data());
  gemm(false, false, m, n, k, x, k, kernel, n, z, n, stream);
  if (bias != nullptr) {
    Scratch bias32(static_cast<size_t>(n) * sizeof(float));
    auto* b = static_cast<float*>(bias32.data());
    cast(dtype_of<H>, DType::kFloat32, n, bias, b, stream);
    binary(kernels::Add{}, kernels::make_broadcast_plan(Shape{m, n}, Shape{n}, Shape{m, n}), z,
           static_cast<const float*>(b), z, stream);
  }
  if (relu) unary(kernels::Relu{}, size, static_cast<const float*>(z), z, stream);
  cast(DType::kFloat32, dtype_of<H>, size, z, y, stream);
}

}  // namespace

template <typename T>
void dense_forward(int64_t m, int64_t n, int64_t k, const T* x, const T* kernel, const T* bias,
                   bool relu, T* y, cudaStream_t stream) {
  if (m == 0 || n == 0) return;
  if constexpr (is_half_v<T>) {
    if (k > 0) {
      if (!matmul_with_epilogue(m, n, k, x, kernel, bias, relu, y, stream))
        dense_through_float32(m, n, k, x, kernel, bias, relu, y, stream);
      return;
    }
  } else if constexpr (std::is_same_v<T, float>) {
    if (k > 0 && matmul_with_epilogue(m, n, k, x, kernel, bias, relu, y, stream)) return;
  }
  // float64, float32 without a cuBLASLt algorithm, and an empty sum in any type (k == 0:
  // y = act(bias), exact in every type).
  if (k == 0) {
    fill(dtype_of<T>, m * n, 0.0, y, stream);
  } else {
    if constexpr (!is_half_v<T>)
      gemm(false, false, m, n, k, T(1), x, k, kernel, n, T(0), y, n, stream);
  }
  if (bias != nullptr) {
    binary(kernels::Add{}, kernels::make_broadcast_plan(Shape{m, n}, Shape{n}, Shape{m, n}), y,
           bias, y, stream);
  }
  if (relu) unary(kernels::Relu{}, m * n, y, y, stream);
}

template void dense_forward<float>(int64_t, int64_t, int64_t, const float*, const float*,
                                   const float*, bool, float*, cudaStream_t);
template void dense_forward<double>(int64_t, int64_t, int64_t, const double*, const double*,
                                    const double*, bool, double*, cudaStream_t);
template void dense_forward<bfloat16>(int64_t, int64_t, int64_t, const bfloat16*, const bfloat16*,
                                      const bfloat16*, bool, bfloat16*, cudaStream_t);
template void dense_forward<float16>(int64_t, int64_t, int64_t, const float16*, const float16*,
                                     const float16*, bool, float16*, cudaStream_t);

}  // namespace tandem::ops::cuda
