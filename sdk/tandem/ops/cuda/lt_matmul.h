// One matrix product through cuBLASLt, shared by the float32 dense forward and every 16-bit GEMM
// (matmul, the dense layer, convolutions): row-major operands, an optional bias and ReLU
// epilogue, the algorithm and descriptors cached per problem on the calling thread.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <type_traits>

#include "tandem/core/half.h"

namespace tandem::ops::cuda {

/// cuBLASLt's element type for T: float, bfloat16 or float16.
template <typename T>
constexpr cudaDataType_t lt_data_type() {
  static_assert(std::is_same_v<T, float> || is_half_v<T>, "cuBLASLt takes float32 or 16 bits");
  if constexpr (std::is_same_v<T, bfloat16>) return CUDA_R_16BF;
  if constexpr (std::is_same_v<T, float16>) return CUDA_R_16F;
  return CUDA_R_32F;
}

/// d [m, n] = act(op(a) op(b) + bias), row-major: op(a) is [m, k] (a is [k, m] when
/// transpose_a) and op(b) [k, n]; ld* are the stored matrices' row lengths. The products are
/// summed in `compute` (CUBLAS_COMPUTE_32F or its TF32 form) with float32 alpha = 1, beta = 0,
/// and d is rounded once to `output_type`. `bias` ([n], of the output type, as cuBLASLt's bias
/// epilogues require) and `relu` are optional.
struct LtMatmul {
  bool transpose_a = false;
  bool transpose_b = false;
  int64_t m = 0, n = 0, k = 0;
  const void* a = nullptr;
  int64_t lda = 0;
  const void* b = nullptr;
  int64_t ldb = 0;
  void* d = nullptr;
  int64_t ldd = 0;
  cudaDataType_t input_type = CUDA_R_32F;   ///< a's and b's elements
  cudaDataType_t output_type = CUDA_R_32F;  ///< d's and the bias's elements
  cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
  const void* bias = nullptr;
  bool relu = false;
  /// Whether cuBLASLt may use this thread's workspace for the stream (split-K and faster
  /// kernels); without it the call allocates nothing.
  bool use_workspace = false;
};

/// Runs `call` on `stream` (asynchronous) and returns true; returns false, having queued
/// nothing, when cuBLASLt has no algorithm for it (an unusual alignment, an epilogue it does
/// not fuse for these types). Requires m, n, k >= 1. Partial sums are never rounded to a 16-bit
/// output type: split-K reductions, where chosen, run in the compute type.
bool lt_matmul(const LtMatmul& call, cudaStream_t stream);

}  // namespace tandem::ops::cuda
