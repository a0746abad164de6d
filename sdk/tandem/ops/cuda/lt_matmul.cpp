// One matrix product through cuBLASLt (lt_matmul.h). cuBLASLt is column-major and Tandem
// row-major: a row-major [m, n] matrix is the column-major [n, m] matrix of its transpose, so
// d = op(a) op(b) is computed as d^T = op(b)^T op(a)^T, with cuBLASLt's A the row-major b and its
// B the row-major a (as gemm.cpp does with cuBLAS). D is then [n, m] column-major, so a bias over
// d's columns runs along D's rows, which is where cuBLASLt's bias epilogues put it.
#include "tandem/ops/cuda/lt_matmul.h"

#include <map>
#include <memory>
#include <optional>
#include <tuple>
#include <utility>

#include "tandem/core/internal/cuda_check.h"
#include "tandem/ops/cuda/scratch.h"
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
  MatmulDesc() = default;
  MatmulDesc(const MatmulDesc&) = delete;
  MatmulDesc& operator=(const MatmulDesc&) = delete;
  ~MatmulDesc() {
    if (desc != nullptr) (void)cublasLtMatmulDescDestroy(desc);
  }
};
struct Layout {
  cublasLtMatrixLayout_t layout = nullptr;
  Layout(cudaDataType_t type, int64_t rows, int64_t columns, int64_t ld) {
    TANDEM_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&layout, type, static_cast<uint64_t>(rows),
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
  Preference() = default;
  Preference(const Preference&) = delete;
  Preference& operator=(const Preference&) = delete;
  ~Preference() {
    if (preference != nullptr) (void)cublasLtMatmulPreferenceDestroy(preference);
  }
};

template <typename T>
void set_attribute(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attribute,
                   const T& value) {
  TANDEM_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, attribute, &value, sizeof(value)));
}
template <typename T>
void set_preference(cublasLtMatmulPreference_t preference,
                    cublasLtMatmulPreferenceAttributes_t attribute, const T& value) {
  TANDEM_CUBLAS_CHECK(
      cublasLtMatmulPreferenceSetAttribute(preference, attribute, &value, sizeof(value)));
}

/// Everything the descriptors and the choice of algorithm depend on.
using PlanKey = std::tuple<int, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, bool, bool,
                           int, int, int, int, size_t, uint32_t, uint32_t, uint32_t, uint32_t>;

/// A problem's descriptors and the heuristic's algorithm (none: cuBLASLt has no algorithm).
struct Plan {
  MatmulDesc op;
  std::unique_ptr<Layout> a, b, d;  // cuBLASLt's A (Tandem's b), B (Tandem's a) and D
  std::optional<cublasLtMatmulAlgo_t> algo;
};

/// The workspace cuBLASLt recommends: 32 MiB on Hopper and later, 4 MiB before.
size_t workspace_bytes(int device) {
  int major = 0;
  TANDEM_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  return (major >= 9 ? size_t{32} : size_t{4}) << 20;
}

/// The calling thread's workspace for `stream` on `device`, allocated on first use and kept
/// until the thread ends. One per stream: kernels of one stream run in order, so a matmul never
/// finds its workspace still in use by the previous one, which a block shared between streams
/// (or returned to the caching allocator after each call) could not promise.
void* workspace_for(int device, cudaStream_t stream, size_t bytes) {
  thread_local std::map<std::pair<int, cudaStream_t>, std::unique_ptr<Scratch>> workspaces;
  std::unique_ptr<Scratch>& w = workspaces[{device, stream}];
  if (w == nullptr) w = std::make_unique<Scratch>(bytes);
  return w->data();
}

std::unique_ptr<Plan> make_plan(const LtMatmul& c, cublasLtEpilogue_t epilogue, size_t workspace,
                                const PlanKey& key) {
  auto plan = std::make_unique<Plan>();
  TANDEM_CUBLAS_CHECK(cublasLtMatmulDescCreate(&plan->op.desc, c.compute, CUDA_R_32F));
  const cublasOperation_t transa = c.transpose_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t transb = c.transpose_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  set_attribute(plan->op.desc, CUBLASLT_MATMUL_DESC_TRANSA, transa);
  set_attribute(plan->op.desc, CUBLASLT_MATMUL_DESC_TRANSB, transb);
  set_attribute(plan->op.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, epilogue);
  // The heuristic reads the bias pointer's alignment (it never dereferences it).
  if (c.bias != nullptr) set_attribute(plan->op.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, c.bias);
  // Stored (column-major) shapes: Tandem's b is [k, n] row-major, i.e. [n, k] column-major
  // ([k, n] when transposed); likewise a.
  plan->a = std::make_unique<Layout>(c.input_type, c.transpose_b ? c.k : c.n,
                                     c.transpose_b ? c.n : c.k, c.ldb);
  plan->b = std::make_unique<Layout>(c.input_type, c.transpose_a ? c.m : c.k,
                                     c.transpose_a ? c.k : c.m, c.lda);
  plan->d = std::make_unique<Layout>(c.output_type, c.n, c.m, c.ldd);

  Preference preference;
  TANDEM_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&preference.preference));
  const uint64_t workspace_limit = workspace;
  set_preference(preference.preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, workspace_limit);
  set_preference(preference.preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                 std::get<15>(key));
  set_preference(preference.preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                 std::get<14>(key));
  set_preference(preference.preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                 std::get<16>(key));
  set_preference(preference.preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
                 std::get<16>(key));
  if (c.output_type != CUDA_R_32F) {
    // A split-K reduction in place or in the output type would round partial sums to 16 bits;
    // only the reduction in the compute type keeps "summed in float32, rounded once".
    const uint32_t schemes = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
    set_preference(preference.preference, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, schemes);
  }
  cublasLtMatmulHeuristicResult_t result{};
  int returned = 0;
  const cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(
      tandem::cuda::cublaslt_handle(), plan->op.desc, plan->a->layout, plan->b->layout,
      plan->d->layout, plan->d->layout, preference.preference, /*requestedAlgoCount=*/1, &result,
      &returned);
  if (status == CUBLAS_STATUS_SUCCESS && returned > 0) {
    plan->algo = result.algo;
  } else if (status != CUBLAS_STATUS_NOT_SUPPORTED && status != CUBLAS_STATUS_SUCCESS) {
    TANDEM_CUBLAS_CHECK(status);
  }
  return plan;
}

}  // namespace

bool lt_matmul(const LtMatmul& c, cudaStream_t stream) {
  TANDEM_CHECK(c.m > 0 && c.n > 0 && c.k > 0, "lt_matmul: needs a non-empty product, got m=", c.m,
               ", n=", c.n, ", k=", c.k);
  cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  if (c.bias != nullptr) {
    epilogue = c.relu ? CUBLASLT_EPILOGUE_RELU_BIAS : CUBLASLT_EPILOGUE_BIAS;
  } else if (c.relu) {
    epilogue = CUBLASLT_EPILOGUE_RELU;
  }
  int device = 0;
  TANDEM_CUDA_CHECK(cudaGetDevice(&device));
  const size_t workspace = c.use_workspace ? workspace_bytes(device) : 0;

  // The descriptors and the heuristic's choice, made once per problem on this thread: the
  // query costs more than a small layer's matmul.
  thread_local std::map<PlanKey, std::unique_ptr<Plan>> plans;
  const PlanKey key{device,
                    c.m,
                    c.n,
                    c.k,
                    c.lda,
                    c.ldb,
                    c.ldd,
                    c.transpose_a,
                    c.transpose_b,
                    static_cast<int>(c.input_type),
                    static_cast<int>(c.output_type),
                    static_cast<int>(c.compute),
                    static_cast<int>(epilogue),
                    workspace,
                    alignment_of(c.a),
                    alignment_of(c.b),
                    alignment_of(c.d),
                    c.bias != nullptr ? alignment_of(c.bias) : 256};
  auto found = plans.find(key);
  if (found == plans.end())
    found = plans.emplace(key, make_plan(c, epilogue, workspace, key)).first;
  Plan& plan = *found->second;
  if (!plan.algo) return false;

  if (c.bias != nullptr) set_attribute(plan.op.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, c.bias);
  void* scratch = workspace > 0 ? workspace_for(device, stream, workspace) : nullptr;
  const float one = 1.0f, zero = 0.0f;
  TANDEM_CUBLAS_CHECK(cublasLtMatmul(
      tandem::cuda::cublaslt_handle(), plan.op.desc, &one, c.b, plan.a->layout, c.a, plan.b->layout,
      &zero, c.d, plan.d->layout, c.d, plan.d->layout, &*plan.algo, scratch, workspace, stream));
  return true;
}

}  // namespace tandem::ops::cuda
