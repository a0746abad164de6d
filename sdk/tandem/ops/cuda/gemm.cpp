// GEMM on the GPU: float32 and float64 through cuBLAS, the 16-bit types through cuBLASLt
// (lt_matmul.h). cuBLAS is column-major and Tandem row-major: a row-major [m, n] matrix is the
// column-major [n, m] matrix of its transpose, so C = op(A) op(B) is computed as
// C^T = op(B)^T op(A)^T, i.e. cuBLAS called with the operands swapped.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <limits>
#include <type_traits>

#include "tandem/core/internal/cuda_check.h"
#include "tandem/ops/cuda/cuda_kernels.h"
#include "tandem/ops/cuda/lt_matmul.h"
#include "tandem/tensor/internal/cuda_context.h"

namespace tandem::ops::cuda {

namespace {

void check_arguments(bool transpose_a, bool transpose_b, int64_t m, int64_t n, int64_t k,
                     int64_t lda, int64_t ldb, int64_t ldc) {
  const auto describe = [&] {
    return detail::str_cat("op(A) [", m, ", ", k, "]", transpose_a ? " (A transposed)" : "",
                           ", op(B) [", k, ", ", n, "]", transpose_b ? " (B transposed)" : "",
                           ", lda=", lda, ", ldb=", ldb, ", ldc=", ldc);
  };
  TANDEM_CHECK(m >= 0 && n >= 0 && k >= 0, "gemm: negative size in ", describe());
  const int64_t a_columns = transpose_a ? m : k;
  const int64_t b_columns = transpose_b ? k : n;
  TANDEM_CHECK(lda >= std::max<int64_t>(1, a_columns) && ldb >= std::max<int64_t>(1, b_columns) &&
                   ldc >= std::max<int64_t>(1, n),
               "gemm: leading dimension too small in ", describe());
  // The classic cuBLAS API takes int sizes.
  constexpr int64_t kIntMax = std::numeric_limits<int>::max();
  TANDEM_CHECK(m <= kIntMax && n <= kIntMax && k <= kIntMax && lda <= kIntMax && ldb <= kIntMax &&
                   ldc <= kIntMax,
               "gemm: a size exceeds cuBLAS's 32-bit limit in ", describe());
}

cublasOperation_t op(bool transpose) { return transpose ? CUBLAS_OP_T : CUBLAS_OP_N; }

/// C = beta * C when the product is empty (k == 0): cuBLAS is not asked, so the BLAS
/// convention (beta == 0 writes zeros without reading C) is ours to keep.
template <typename T>
void scale_c(cublasHandle_t handle, int64_t m, int64_t n, T beta, T* c, int64_t ldc,
             cudaStream_t stream) {
  if (beta == T(1)) return;
  if (beta == T(0)) {
    // All-zero bytes are +0.0 in IEEE float and double.
    TANDEM_CUDA_CHECK(cudaMemset2DAsync(c, static_cast<size_t>(ldc) * sizeof(T), 0,
                                        static_cast<size_t>(n) * sizeof(T), static_cast<size_t>(m),
                                        stream));
    return;
  }
  // C^T = beta * C^T + 0 * C^T, in place (allowed when the leading dimensions match).
  const T zero = T(0);
  const int rows = static_cast<int>(n), columns = static_cast<int>(m), ld = static_cast<int>(ldc);
  if constexpr (std::is_same_v<T, float>) {
    TANDEM_CUBLAS_CHECK(cublasSgeam(handle, CUBLAS_OP_N, CUBLAS_OP_N, rows, columns, &beta, c, ld,
                                    &zero, c, ld, c, ld));
  } else {
    TANDEM_CUBLAS_CHECK(cublasDgeam(handle, CUBLAS_OP_N, CUBLAS_OP_N, rows, columns, &beta, c, ld,
                                    &zero, c, ld, c, ld));
  }
}

/// While alive, keeps a cuBLAS handle's split-K partial sums in the compute type (by default
/// cuBLAS may reduce them in a 16-bit output type); restores the handle's math mode after.
class FullPrecisionReductions {
 public:
  explicit FullPrecisionReductions(cublasHandle_t handle) : handle_(handle) {
    TANDEM_CUBLAS_CHECK(cublasGetMathMode(handle_, &previous_));
    TANDEM_CUBLAS_CHECK(cublasSetMathMode(
        handle_,
        static_cast<cublasMath_t>(previous_ | CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION)));
  }
  ~FullPrecisionReductions() { (void)cublasSetMathMode(handle_, previous_); }
  FullPrecisionReductions(const FullPrecisionReductions&) = delete;
  FullPrecisionReductions& operator=(const FullPrecisionReductions&) = delete;

 private:
  cublasHandle_t handle_;
  cublasMath_t previous_ = CUBLAS_DEFAULT_MATH;
};

/// C (H or float) = op(A) op(B) of 16-bit A and B, summed in float32 and rounded once.
template <typename H, typename C>
void gemm_16(bool transpose_a, bool transpose_b, int64_t m, int64_t n, int64_t k, const H* a,
             int64_t lda, const H* b, int64_t ldb, C* c, int64_t ldc, cudaStream_t stream) {
  check_arguments(transpose_a, transpose_b, m, n, k, lda, ldb, ldc);
  if (m == 0 || n == 0) return;
  if (k == 0) {
    // All-zero bytes are +0.0 in every floating type.
    TANDEM_CUDA_CHECK(cudaMemset2DAsync(c, static_cast<size_t>(ldc) * sizeof(C), 0,
                                        static_cast<size_t>(n) * sizeof(C), static_cast<size_t>(m),
                                        stream));
    return;
  }
  LtMatmul call;
  call.transpose_a = transpose_a;
  call.transpose_b = transpose_b;
  call.m = m;
  call.n = n;
  call.k = k;
  call.a = a;
  call.lda = lda;
  call.b = b;
  call.ldb = ldb;
  call.d = c;
  call.ldd = ldc;
  call.input_type = lt_data_type<H>();
  call.output_type = lt_data_type<C>();
  call.compute = CUBLAS_COMPUTE_32F;
  call.use_workspace = true;
  if (lt_matmul(call, stream)) return;
  // No cuBLASLt algorithm (an odd alignment, say): cuBLAS' own GEMM, summing in float32 too.
  cublasHandle_t handle = tandem::cuda::cublas_handle(stream);
  const FullPrecisionReductions full_precision(handle);
  const float one = 1.0f, zero = 0.0f;
  TANDEM_CUBLAS_CHECK(cublasGemmEx(handle, op(transpose_b), op(transpose_a), static_cast<int>(n),
                                   static_cast<int>(m), static_cast<int>(k), &one, b,
                                   lt_data_type<H>(), static_cast<int>(ldb), a, lt_data_type<H>(),
                                   static_cast<int>(lda), &zero, c, lt_data_type<C>(),
                                   static_cast<int>(ldc), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

}  // namespace

void gemm(bool transpose_a, bool transpose_b, int64_t m, int64_t n, int64_t k, float alpha,
          const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
          int64_t ldc, cudaStream_t stream) {
  check_arguments(transpose_a, transpose_b, m, n, k, lda, ldb, ldc);
  if (m == 0 || n == 0) return;
  // The handle is bound to `stream` and to the TF32 setting (cuda_context.cpp).
  cublasHandle_t handle = tandem::cuda::cublas_handle(stream);
  if (k == 0) return scale_c(handle, m, n, beta, c, ldc, stream);
  TANDEM_CUBLAS_CHECK(cublasSgemm(handle, op(transpose_b), op(transpose_a), static_cast<int>(n),
                                  static_cast<int>(m), static_cast<int>(k), &alpha, b,
                                  static_cast<int>(ldb), a, static_cast<int>(lda), &beta, c,
                                  static_cast<int>(ldc)));
}

void gemm(bool transpose_a, bool transpose_b, int64_t m, int64_t n, int64_t k, double alpha,
          const double* a, int64_t lda, const double* b, int64_t ldb, double beta, double* c,
          int64_t ldc, cudaStream_t stream) {
  check_arguments(transpose_a, transpose_b, m, n, k, lda, ldb, ldc);
  if (m == 0 || n == 0) return;
  cublasHandle_t handle = tandem::cuda::cublas_handle(stream);
  if (k == 0) return scale_c(handle, m, n, beta, c, ldc, stream);
  TANDEM_CUBLAS_CHECK(cublasDgemm(handle, op(transpose_b), op(transpose_a), static_cast<int>(n),
                                  static_cast<int>(m), static_cast<int>(k), &alpha, b,
                                  static_cast<int>(ldb), a, static_cast<int>(lda), &beta, c,
                                  static_cast<int>(ldc)));
}

void gemm(bool transpose_a, bool transpose_b, int64_t m, int64_t n, int64_t k, const bfloat16* a,
          int64_t lda, const bfloat16* b, int64_t ldb, bfloat16* c, int64_t ldc,
          cudaStream_t stream) {
  gemm_16(transpose_a, transpose_b, m, n, k, a, lda, b, ldb, c, ldc, stream);
}
void gemm(bool transpose_a, bool transpose_b, int64_t m, int64_t n, int64_t k, const bfloat16* a,
          int64_t lda, const bfloat16* b, int64_t ldb, float* c, int64_t ldc, cudaStream_t stream) {
  gemm_16(transpose_a, transpose_b, m, n, k, a, lda, b, ldb, c, ldc, stream);
}
void gemm(bool transpose_a, bool transpose_b, int64_t m, int64_t n, int64_t k, const float16* a,
          int64_t lda, const float16* b, int64_t ldb, float16* c, int64_t ldc,
          cudaStream_t stream) {
  gemm_16(transpose_a, transpose_b, m, n, k, a, lda, b, ldb, c, ldc, stream);
}
void gemm(bool transpose_a, bool transpose_b, int64_t m, int64_t n, int64_t k, const float16* a,
          int64_t lda, const float16* b, int64_t ldb, float* c, int64_t ldc, cudaStream_t stream) {
  gemm_16(transpose_a, transpose_b, m, n, k, a, lda, b, ldb, c, ldc, stream);
}

}  // namespace tandem::ops::cuda
