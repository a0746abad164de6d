// CPU dense layer: float32 and bfloat16 as one oneDNN matmul primitive whose bias and ReLU are
// applied to the float32 accumulator (no extra pass over the output), primitives cached per
// shape; float64 (and float32 without oneDNN) as cpu::gemm plus one epilogue pass; float16 through
// float32. The 16-bit matmul of the backward GEMMs, and the backward's mask-and-bias-sum pass.
#include "tandem/ops/cpu/dense.h"

#include <omp.h>

#include <algorithm>
#include <type_traits>
#include <vector>

#include "tandem/core/cpu_isa.h"
#include "tandem/core/error.h"
#include "tandem/ops/cpu/nn_kernels.h"
#include "tandem/ops/cpu/parallel.h"
#include "tandem/ops/cpu/widen.h"

#if TANDEM_WITH_ONEDNN
#include <array>
#include <memory>
#include <unordered_map>
#include <utility>

#include "tandem/ops/cpu/onednn.h"
#endif

namespace tandem::ops::cpu {
namespace {

/// y = act(y + bias) in place over y [m, n]: the epilogue of the portable path. Each element is
/// rounded as a separate add then ReLU would round it.
template <typename T>
void bias_activation(int64_t m, int64_t n, const T* bias, bool relu, T* y) {
  if (bias == nullptr && !relu) return;
  const int64_t grain = std::max<int64_t>(1, kElementwiseGrain / std::max<int64_t>(n, 1));
  parallel_for(m, grain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      T* row = y + i * n;
      if (bias != nullptr) {
#pragma omp simd
        for (int64_t j = 0; j < n; ++j) row[j] = row[j] + bias[j];
      }
      if (relu) {
#pragma omp simd
        for (int64_t j = 0; j < n; ++j) row[j] = row[j] > T(0) ? row[j] : T(0);
      }
    }
  });
}

template <typename T>
void gemm_then_epilogue(int64_t m, int64_t n, int64_t k, const T* x, const T* w, const T* bias,
                        bool relu, T* y) {
  gemm(false, false, m, n, k, T(1), x, k, w, n, T(0), y, n);
  bias_activation(m, n, bias, relu, y);
}

#if TANDEM_WITH_ONEDNN

/// What a cached primitive was made for (see onednn::PrimitiveCache): c [m, n] = op(a) op(b)
/// (+ bias, ReLU) with a, b, c and the bias of `type`, a or b read transposed when asked.
struct MatmulKey {
  int64_t m, n, k;
  bool bias, relu;
  int threads;
  dnnl::memory::data_type type = dnnl::memory::data_type::f32;
  bool transpose_a = false, transpose_b = false;
  int64_t ldb = 0;  ///< b's row stride when b is read as stored; 0: n (dense)

  std::array<int64_t, 10> fields() const {
    return {m,           n,           k,  bias, relu, threads, static_cast<int64_t>(type),
            transpose_a, transpose_b, ldb};
  }
  bool operator==(const MatmulKey& other) const { return fields() == other.fields(); }
};

struct MatmulKeyHash {
  size_t operator()(const MatmulKey& key) const { return onednn::hash_values(key.fields()); }
};

struct MatmulPrimitive {
  dnnl::matmul primitive;
  dnnl::memory::desc src, weights, bias, dst;
  size_t scratchpad_bytes;
};

std::shared_ptr<const MatmulPrimitive> create_matmul(const MatmulKey& key) {
  using dt = dnnl::memory::data_type;
  using tag = dnnl::memory::format_tag;
  auto entry = std::make_shared<MatmulPrimitive>();
  const dt type = key.type;
  // A transposed operand is the same matrix stored column-major.
  entry->src = dnnl::memory::desc({key.m, key.k}, type, key.transpose_a ? tag::ba : tag::ab);
  entry->weights =
      key.ldb > 0 ? dnnl::memory::desc({key.k, key.n}, type, dnnl::memory::dims{key.ldb, 1})
                  : dnnl::memory::desc({key.k, key.n}, type, key.transpose_b ? tag::ba : tag::ab);
  entry->dst = dnnl::memory::desc({key.m, key.n}, type, tag::ab);
  if (key.bias) entry->bias = dnnl::memory::desc({1, key.n}, type, tag::ab);
  const dnnl::matmul::desc desc =
      key.bias ? dnnl::matmul::desc(entry->src, entry->weights, entry->bias, entry->dst)
               : dnnl::matmul::desc(entry->src, entry->weights, entry->dst);
  const dnnl::matmul::primitive_desc pd(desc, onednn::attributes(key.relu), onednn::engine());
  entry->scratchpad_bytes = pd.scratchpad_desc().get_size();
  entry->primitive = dnnl::matmul(pd);
  return entry;
}

/// y = act(op(x) op(w) + bias) through a cached oneDNN matmul primitive, for float32 or
/// bfloat16 data (`type`); the products are summed, and the epilogue applied, in float32. A w
/// read as stored has rows `ldw` apart (0: n).
void onednn_matmul(dnnl::memory::data_type type, bool transpose_a, bool transpose_b, int64_t m,
                   int64_t n, int64_t k, const void* x, const void* w, const void* bias, bool relu,
                   void* y, int64_t ldw = 0) {
  static onednn::PrimitiveCache<MatmulKey, MatmulPrimitive, MatmulKeyHash> cache;
  const MatmulKey key{
      m,    n,           k,           bias != nullptr,      relu, onednn::team_threads(),
      type, transpose_a, transpose_b, transpose_b ? 0 : ldw};
  try {
    const std::shared_ptr<const MatmulPrimitive> mm = cache.get(key, create_matmul);
    std::unordered_map<int, dnnl::memory> args{{DNNL_ARG_SRC, onednn::wrap(mm->src, x)},
                                               {DNNL_ARG_WEIGHTS, onednn::wrap(mm->weights, w)},
                                               {DNNL_ARG_DST, onednn::wrap(mm->dst, y)}};
    if (bias != nullptr) args.emplace(DNNL_ARG_BIAS, onednn::wrap(mm->bias, bias));
    onednn::execute(mm->primitive, std::move(args), mm->scratchpad_bytes);
  } catch (const dnnl::error& e) {
    TANDEM_THROW("dense: oneDNN matmul failed (", e.what(), ", status ", static_cast<int>(e.status),
                 ") for x [", m, ", ", k, "]", transpose_a ? "^T" : "", " @ kernel [", k, ", ", n,
                 "]", transpose_b ? "^T" : "", bias != nullptr ? " + bias" : "",
                 relu ? ", relu" : "",
                 type == dnnl::memory::data_type::bf16 ? " in bfloat16" : " in float32");
  }
}

/// Whether bfloat16 matmuls run on oneDNN's bfloat16 primitives: where the CPU (as cpu_isa()
/// says) has the bfloat16 dot products (AVX512-BF16 or AMX) and oneDNN makes the primitive
/// (asked once, with a tiny one). Without them oneDNN emulates the products (AVX-512) or has
/// none (below), slower than widening the operands to float32, which the other path does.
bool onednn_has_bf16_matmul() {
  static const bool available = [] {
    if (cpu_isa() < CpuIsa::kAvx512CoreBf16) return false;
    try {
      (void)create_matmul(MatmulKey{2, 2, 2, false, false, 1, dnnl::memory::data_type::bf16});
      return true;
    } catch (const dnnl::error&) {
      return false;
    }
  }();
  return available;
}

/// float32 dense through oneDNN; w [k, n] has rows ldw apart. A kernel whose stride the AVX2
/// sgemm reads slowly is copied to a padded one first (gemm_b_copy_stride).
void onednn_dense(int64_t m, int64_t n, int64_t k, const float* x, const float* w, int64_t ldw,
                  const float* bias, bool relu, float* y) {
  if (const int64_t stride = gemm_b_copy_stride(false, m, ldw); stride > 0) {
    const FloatBuffer copy(k * stride);
    copy_rows(k, n, w, ldw, copy.data(), stride);
    return onednn_dense(m, n, k, x, copy.data(), stride, bias, relu, y);
  }
  onednn_matmul(dnnl::memory::data_type::f32, false, false, m, n, k, x, w, bias, relu, y,
                ldw == n ? 0 : ldw);
}

#endif  // TANDEM_WITH_ONEDNN

// ---- 16-bit through float32: float16, and bfloat16 without oneDNN ---------------------------

template <typename H>
void emulated_dense(int64_t m, int64_t n, int64_t k, const H* x, const H* w, const H* bias,
                    bool relu, H* y) {
  const FloatBuffer x32 = widen(x, m * k), bias32 = widen(bias, n);
  const FloatBuffer y32(m * n);  // written whole by dense
#if TANDEM_WITH_ONEDNN
  // Widened straight to the stride the float32 GEMM wants, if it wants another (one pass).
  if (const int64_t stride = gemm_b_copy_stride(false, m, n); stride > 0 && k > 0) {
    const FloatBuffer w32 = widen_rows(w, k, n, stride);
    onednn_dense(m, n, k, x32.data(), w32.data(), stride, bias32.data(), relu, y32.data());
    return narrow(y32, y);
  }
#endif
  const FloatBuffer w32 = widen(w, k * n);
  dense(m, n, k, x32.data(), w32.data(), bias32.data(), relu, y32.data());
  narrow(y32, y);
}

template <typename H>
void emulated_matmul(bool transpose_a, bool transpose_b, int64_t m, int64_t n, int64_t k,
                     const H* a, const H* b, H* c) {
  // B widened straight to the stride the float32 GEMM wants, if it wants another (one pass).
  const int64_t ldb = transpose_b ? k : n;
  const int64_t stride = std::max(ldb, gemm_b_copy_stride(transpose_b, m, ldb));
  const FloatBuffer a32 = widen(a, m * k), b32 = widen_rows(b, transpose_b ? n : k, ldb, stride);
  const FloatBuffer c32(m * n);  // written whole by the GEMM (beta 0)
  gemm(transpose_a, transpose_b, m, n, k, 1.0f, a32.data(), transpose_a ? m : k, b32.data(), stride,
       0.0f, c32.data(), n);
  narrow(c32, c);
}

}  // namespace

void dense(int64_t m, int64_t n, int64_t k, const float* x, const float* w, const float* bias,
           bool relu, float* y) {
  if (m == 0 || n == 0) return;
#if TANDEM_WITH_ONEDNN
  // An empty sum (k == 0) is left to the portable path, which writes act(bias).
  if (k > 0) return onednn_dense(m, n, k, x, w, n, bias, relu, y);
#endif
  gemm_then_epilogue(m, n, k, x, w, bias, relu, y);
}

void dense(int64_t m, int64_t n, int64_t k, const double* x, const double* w, const double* bias,
           bool relu, double* y) {
  if (m == 0 || n == 0) return;
  gemm_then_epilogue(m, n, k, x, w, bias, relu, y);
}

namespace {

/// Whether 16-bit values of type H run on oneDNN's bfloat16 primitives (else widened to float32).
template <typename H>
bool native_16_bit() {
#if TANDEM_WITH_ONEDNN
  if constexpr (std::is_same_v<H, bfloat16>) return onednn_has_bf16_matmul();
#endif
  return false;
}

template <typename H>
void dense_16(int64_t m, int64_t n, int64_t k, const H* x, const H* w, const H* bias, bool relu,
              H* y) {
  if (m == 0 || n == 0) return;
#if TANDEM_WITH_ONEDNN
  // An empty sum (k == 0) is left to the emulation, which writes act(bias).
  if (k > 0 && native_16_bit<H>())
    return onednn_matmul(dnnl::memory::data_type::bf16, false, false, m, n, k, x, w, bias, relu, y);
#endif
  emulated_dense(m, n, k, x, w, bias, relu, y);
}

template <typename H>
void matmul_16(bool transpose_a, bool transpose_b, int64_t m, int64_t n, int64_t k, const H* a,
               const H* b, H* c) {
  if (m == 0 || n == 0) return;
  if (k == 0) {
    std::fill(c, c + m * n, H(0.0f));
    return;
  }
#if TANDEM_WITH_ONEDNN
  if (native_16_bit<H>())
    return onednn_matmul(dnnl::memory::data_type::bf16, transpose_a, transpose_b, m, n, k, a, b,
                         nullptr, false, c);
#endif
  emulated_matmul(transpose_a, transpose_b, m, n, k, a, b, c);
}

}  // namespace

void dense(int64_t m, int64_t n, int64_t k, const bfloat16* x, const bfloat16* w,
           const bfloat16* bias, bool relu, bfloat16* y) {
  dense_16(m, n, k, x, w, bias, relu, y);
}

void dense(int64_t m, int64_t n, int64_t k, const float16* x, const float16* w, const float16* bias,
           bool relu, float16* y) {
  dense_16(m, n, k, x, w, bias, relu, y);
}

void matmul(bool transpose_a, bool transpose_b, int64_t m, int64_t n, int64_t k, const bfloat16* a,
            const bfloat16* b, bfloat16* c) {
  matmul_16(transpose_a, transpose_b, m, n, k, a, b, c);
}

void matmul(bool transpose_a, bool transpose_b, int64_t m, int64_t n, int64_t k, const float16* a,
            const float16* b, float16* c) {
  matmul_16(transpose_a, transpose_b, m, n, k, a, b, c);
}

namespace {

/// dz = g where y > 0, else 0, on the bits of 16-bit values: y > 0 exactly when its bits lie in
/// [1, +infinity's] (zero, negative values and NaN fall outside). Integer selects vectorize.
template <typename H>
inline void relu_mask_bits(int64_t begin, int64_t end, const H* g, const H* y, H* dz) {
  static_assert(sizeof(H) == sizeof(uint16_t));
  constexpr uint16_t kInfinity = std::is_same_v<H, bfloat16> ? 0x7f80 : 0x7c00;
  // On the raw bits (a 16-bit type is its one uint16_t member), the select as a mask: GCC
  // vectorizes this, and not the select on the struct's member (a branch per element).
  const uint16_t* gb = &g->bits;
  const uint16_t* yb = &y->bits;
  uint16_t* out = &dz->bits;
#pragma omp simd
  for (int64_t i = begin; i < end; ++i) {
    const auto keep = static_cast<uint16_t>(static_cast<uint16_t>(yb[i] - 1u) < kInfinity);
    out[i] = static_cast<uint16_t>(gb[i] & static_cast<uint16_t>(0u - keep));
  }
}

}  // namespace

template <typename T>
void dense_relu_backward(int64_t m, int64_t n, const T* g, const T* y, T* dz, T* bias_grad) {
  if constexpr (is_half_v<T>) {
    if (bias_grad == nullptr) {
      parallel_for(m * n, kElementwiseGrain,
                   [&](int64_t begin, int64_t end) { relu_mask_bits(begin, end, g, y, dz); });
      return;
    }
    // Blocks of a fixed number of rows (whole rows: contiguous, however few the columns, as a
    // convolution's filters are): the mask over the block, its column sums in float32; then the
    // blocks' sums added in block order in float64, the same bits for any number of threads.
    constexpr int64_t kRows = 64;
    const int64_t blocks = (m + kRows - 1) / kRows;
    std::vector<float> partial(static_cast<size_t>(blocks * n));
    const int64_t grain = std::max<int64_t>(1, kElementwiseGrain / std::max<int64_t>(kRows * n, 1));
    parallel_for(blocks, grain, [&](int64_t b0, int64_t b1) {
      for (int64_t b = b0; b < b1; ++b) {
        const int64_t r0 = b * kRows, r1 = std::min(m, r0 + kRows);
        relu_mask_bits(r0 * n, r1 * n, g, y, dz);
        float* sums = partial.data() + b * n;
        std::fill_n(sums, n, 0.0f);
        for (int64_t i = r0; i < r1; ++i) {
          const T* dz_row = dz + i * n;
#pragma omp simd
          for (int64_t j = 0; j < n; ++j) sums[j] += static_cast<float>(dz_row[j]);
        }
      }
    });
    for (int64_t j = 0; j < n; ++j) {
      double sum = 0.0;
      for (int64_t b = 0; b < blocks; ++b)
        sum += static_cast<double>(partial[static_cast<size_t>(b * n + j)]);
      bias_grad[j] = static_cast<T>(sum);
    }
    return;
  }
  if (bias_grad == nullptr) {
    // Without sums the rows do not matter: one flat pass, split evenly however narrow they are
    // (a convolution's rows are its filters, often fewer than a cache line's worth per thread).
    parallel_for(m * n, kElementwiseGrain, [&](int64_t begin, int64_t end) {
#pragma omp simd
      for (int64_t i = begin; i < end; ++i) {
        const T gi = g[i];
        dz[i] = y[i] > T(0) ? gi : T(0);
      }
    });
    return;
  }
  // Threads own ranges of columns and walk every row, so each column's sum runs in row order.
  parallel_for_columns(1, m, n, [&](int64_t, int64_t j0, int64_t j1) {
    std::vector<double> acc(static_cast<size_t>(j1 - j0), 0.0);
    double* sums = acc.data();
    for (int64_t i = 0; i < m; ++i) {
      const T* g_row = g + i * n;
      const T* y_row = y + i * n;
      T* dz_row = dz + i * n;
      // Two loops over the same slice of the row, still in L1 for the second: each vectorizes
      // (GCC leaves a select feeding a float-to-double sum scalar). The gradient is loaded
      // before the comparison so that the select needs no conditional load.
#pragma omp simd
      for (int64_t j = j0; j < j1; ++j) {
        const T gj = g_row[j];
        const bool keep = y_row[j] > T(0);
        dz_row[j] = keep ? gj : T(0);
      }
      if (bias_grad == nullptr) continue;
#pragma omp simd
      for (int64_t j = j0; j < j1; ++j) sums[j - j0] += static_cast<double>(dz_row[j]);
    }
    if (bias_grad != nullptr)
      for (int64_t j = j0; j < j1; ++j) bias_grad[j] = static_cast<T>(sums[j - j0]);
  });
}

template void dense_relu_backward<float>(int64_t, int64_t, const float*, const float*, float*,
                                         float*);
template void dense_relu_backward<double>(int64_t, int64_t, const double*, const double*, double*,
                                          double*);
template void dense_relu_backward<bfloat16>(int64_t, int64_t, const bfloat16*, const bfloat16*,
                                            bfloat16*, bfloat16*);
template void dense_relu_backward<float16>(int64_t, int64_t, const float16*, const float16*,
                                           float16*, float16*);

}  // namespace tandem::ops::cpu
