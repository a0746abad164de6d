// The dense layer's forward on the GPU through cuBLASLt: one matmul whose epilogue adds the bias
// and applies the ReLU, where cuBLAS' GEMM would be followed by two elementwise passes over the
// output (float64 keeps that path). Row-major y[m, n] = x[m, k] kernel[k, n] is the column-major
// y^T = kernel^T x^T, as in gemm.cpp: A is the kernel ([n, k] column-major), B is x ([k, m]) and D
// is y ([n, m]), so the bias runs along D's rows, which is where cuBLASLt's bias epilogues put it.
#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <tuple>
#include <type_traits>

#include "tandem/core/internal/cuda_check.h"
#include "tandem/ops/cuda/cuda_kernels.h"
#include "tandem/tensor/device_runtime.h"
#include "tandem/tensor/internal/cuda_context.h"

namespace tandem::ops::cuda {

namespace {

/// The alignment cuBLASLt may assume for a pointer: its largest power-of-two divisor, up to the
/// 256 bytes the heuristics assume by default.
uint32_t alignment_of(const void* p) {
  const auto address = reinterpret_cast<uintptr_t>(p);
  uint32_t alignment = 256;
  while (alignment > 1 && address % alignment != 0) alignment /= 2;
  return alignment;
}

/// cuBLASLt descriptors, destroyed with their owner.
struct MatmulDesc {
  cublasLtMatmulDesc_t desc = nullptr;
  ~MatmulDesc() {
    if (desc != nullptr) (void)cublasLtMatmulDescDestroy(desc);
  }
};
struct Layout {
  cublasLtMatrixLayout_t layout = nullptr;
  Layout(int64_t rows, int64_t columns, int64_t ld) {
    TANDEM_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&layout, CUDA_R_32F, static_cast<uint64_t>(rows),
                                                   static_cast<uint64_t>(columns), ld));
  }
  ~Layout() {
    if (layout != nullptr) (void)cublasLtMatrixLayoutDestroy(layout);
  }
  Layout(const Layout&) = delete;
  Layout& operator=(const Layout&) = delete;
};
struct Preference {
  cublasLtMatmulPreference_t preference = nullptr;
  ~Preference() {
    if (preference != nullptr) (void)cublasLtMatmulPreferenceDestroy(preference);
  }
};

/// What the choice of algorithm depends on.
using AlgoKey =
    std::tuple<int, int64_t, int64_t, int64_t, int, bool, uint32_t, uint32_t, uint32_t, uint32_t>;

/// The float32 forward as one cublasLtMatmul; false, having done nothing, where cuBLASLt has
/// no algorithm for the case (an empty product, an unusual alignment).
bool matmul_with_epilogue(int64_t m, int64_t n, int64_t k, const float* x, const float* kernel,
                          const float* bias, bool relu, float* y, cudaStream_t stream) {
  if (k == 0) return false;
  const bool tf32 = tandem::cuda::allow_tf32();
  const cublasComputeType_t compute =
      tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;  // as gemm's math mode
  cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  if (bias != nullptr) {
    epilogue = relu ? CUBLASLT_EPILOGUE_RELU_BIAS : CUBLASLT_EPILOGUE_BIAS;
  } else if (relu) {
    epilogue = CUBLASLT_EPILOGUE_RELU;
  }

  MatmulDesc op;
  TANDEM_CUBLAS_CHECK(cublasLtMatmulDescCreate(&op.desc, compute, CUDA_R_32F));
  const cublasOperation_t no_transpose = CUBLAS_OP_N;
  TANDEM_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op.desc, CUBLASLT_MATMUL_DESC_TRANSA,
                                                     &no_transpose, sizeof(no_transpose)));
  TANDEM_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op.desc, CUBLASLT_MATMUL_DESC_TRANSB,
                                                     &no_transpose, sizeof(no_transpose)));
  TANDEM_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op.desc, CUBLASLT_MATMUL_DESC_EPILOGUE,
                                                     &epilogue, sizeof(epilogue)));
  if (bias != nullptr) {
    TANDEM_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                       &bias, sizeof(bias)));
  }
  const Layout a(n, k, n), b(k, m, k), d(n, m, n);

  // The heuristic's choice, asked once per shape, epilogue, math mode and alignment on this
  // thread: the query costs more than a small layer's matmul. No workspace, so a forward
  // allocates nothing.
  thread_local std::map<AlgoKey, std::optional<cublasLtMatmulAlgo_t>> algos;
  int device = 0;
  TANDEM_CUDA_CHECK(cudaGetDevice(&device));
  const AlgoKey key{device,
                    m,
                    n,
                    k,
                    static_cast<int>(epilogue),
                    tf32,
                    alignment_of(kernel),
                    alignment_of(x),
                    alignment_of(y),
                    bias != nullptr ? alignment_of(bias) : 256};
  auto found = algos.find(key);
  if (found == algos.end()) {
    Preference preference;
    TANDEM_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&preference.preference));
    const uint64_t workspace = 0;
    TANDEM_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        preference.preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace,
        sizeof(workspace)));
    const std::pair<cublasLtMatmulPreferenceAttributes_t, uint32_t> alignments[] = {
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, std::get<6>(key)},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, std::get<7>(key)},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, std::get<8>(key)},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, std::get<8>(key)}};
    for (const auto& [attribute, bytes] : alignments) {
      TANDEM_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(preference.preference, attribute,
                                                               &bytes, sizeof(bytes)));
    }
    cublasLtMatmulHeuristicResult_t result{};
    int returned = 0;
    const cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(
        tandem::cuda::cublaslt_handle(), op.desc, a.layout, b.layout, d.layout, d.layout,
        preference.preference, /*requestedAlgoCount=*/1, &result, &returned);
    // No algorithm for this case (an unaligned bias, say): the caller takes the cuBLAS path.
    std::optional<cublasLtMatmulAlgo_t> algo;
    if (status == CUBLAS_STATUS_SUCCESS && returned > 0) {
      algo = result.algo;
    } else if (status != CUBLAS_STATUS_NOT_SUPPORTED && status != CUBLAS_STATUS_SUCCESS) {
      TANDEM_CUBLAS_CHECK(status);
    }
    found = algos.emplace(key, algo).first;
  }
  if (!found->second) return false;

  const float one = 1.0f, zero = 0.0f;
  TANDEM_CUBLAS_CHECK(cublasLtMatmul(tandem::cuda::cublaslt_handle(), op.desc, &one, kernel,
                                     a.layout, x, b.layout, &zero, y, d.layout, y, d.layout,
                                     &*found->second, /*workspace=*/nullptr,
                                     /*workspaceSizeInBytes=*/0, stream));
  return true;
}

}  // namespace

template <typename T>
void dense_forward(int64_t m, int64_t n, int64_t k, const T* x, const T* kernel, const T* bias,
                   bool relu, T* y, cudaStream_t stream) {
  if (m == 0 || n == 0) return;
  if constexpr (std::is_same_v<T, float>) {
    if (matmul_with_epilogue(m, n, k, x, kernel, bias, relu, y, stream)) return;
  }
  if (k == 0) {
    fill(dtype_of<T>, m * n, 0.0, y, stream);
  } else {
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

}  // namespace tandem::ops::cuda
