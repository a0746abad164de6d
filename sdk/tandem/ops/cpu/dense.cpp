// CPU dense layer: float32 as one oneDNN matmul primitive whose bias and ReLU are applied to the
// accumulator (no extra pass over the output), primitives cached per shape; float64 (and float32
// without oneDNN) as cpu::gemm plus one epilogue pass. The backward's mask-and-bias-sum pass.
#include "tandem/ops/cpu/dense.h"

#include <omp.h>

#include <algorithm>
#include <vector>

#include "tandem/core/error.h"
#include "tandem/ops/cpu/nn_kernels.h"
#include "tandem/ops/cpu/parallel.h"

#if TANDEM_WITH_ONEDNN
#include <cstddef>
#include <memory>
#include <mutex>
#include <oneapi/dnnl/dnnl.hpp>
#include <unordered_map>
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

/// What a cached primitive was made for. The thread count is part of it: oneDNN (OpenMP runtime)
/// fixes a primitive's work split when it is created, from the creating thread's
/// omp_get_max_threads(), and each replica thread has its own budget (set_compute_threads).
struct MatmulKey {
  int64_t m, n, k;
  bool bias, relu;
  int threads;
  bool operator==(const MatmulKey&) const = default;
};

struct MatmulKeyHash {
  size_t operator()(const MatmulKey& key) const {
    size_t h = std::hash<int64_t>{}(key.m);
    for (int64_t v : {key.n, key.k, int64_t{key.bias}, int64_t{key.relu}, int64_t{key.threads}})
      h = h * 1000003u ^ std::hash<int64_t>{}(v);
    return h;
  }
};

struct MatmulPrimitive {
  dnnl::matmul primitive;
  dnnl::memory::desc src, weights, bias, dst;
  size_t scratchpad_bytes;
};

const dnnl::engine& cpu_engine() {
  static const dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

std::shared_ptr<const MatmulPrimitive> create_matmul(const MatmulKey& key) {
  using dt = dnnl::memory::data_type;
  using tag = dnnl::memory::format_tag;
  auto entry = std::make_shared<MatmulPrimitive>();
  entry->src = dnnl::memory::desc({key.m, key.k}, dt::f32, tag::ab);
  entry->weights = dnnl::memory::desc({key.k, key.n}, dt::f32, tag::ab);
  entry->dst = dnnl::memory::desc({key.m, key.n}, dt::f32, tag::ab);
  if (key.bias) entry->bias = dnnl::memory::desc({1, key.n}, dt::f32, tag::ab);
  dnnl::primitive_attr attr;
  // The caller passes the scratchpad, so concurrent executions (replica threads) never share
  // one, whatever the library's build options.
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  if (key.relu) {
    dnnl::post_ops post_ops;
    post_ops.append_eltwise(/*scale=*/1.0f, dnnl::algorithm::eltwise_relu, /*alpha=*/0.0f,
                            /*beta=*/0.0f);
    attr.set_post_ops(post_ops);
  }
  const dnnl::matmul::desc desc =
      key.bias ? dnnl::matmul::desc(entry->src, entry->weights, entry->bias, entry->dst)
               : dnnl::matmul::desc(entry->src, entry->weights, entry->dst);
  const dnnl::matmul::primitive_desc pd(desc, attr, cpu_engine());
  entry->scratchpad_bytes = pd.scratchpad_desc().get_size();
  entry->primitive = dnnl::matmul(pd);
  return entry;
}

/// Primitives by key, shared by all threads. A training run meets a handful of shapes (its
/// layers times the full and the last partial batch); past kMaxEntries the cache starts over.
class MatmulCache {
 public:
  std::shared_ptr<const MatmulPrimitive> get(const MatmulKey& key) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = entries_.find(key);
    if (it != entries_.end()) return it->second;
    // Created under the lock, once per shape: oneDNN shares what it builds between primitive
    // descriptors (its own cache), and two replicas creating the same shape at once would
    // build it twice and race on that shared state.
    if (entries_.size() >= kMaxEntries) entries_.clear();
    return entries_.emplace(key, create_matmul(key)).first->second;
  }

 private:
  static constexpr size_t kMaxEntries = 256;
  std::mutex mutex_;
  std::unordered_map<MatmulKey, std::shared_ptr<const MatmulPrimitive>, MatmulKeyHash> entries_;
};

/// The calling thread's scratchpad, grown as needed and aligned for vector loads.
void* scratchpad(size_t bytes) {
  constexpr size_t kAlign = 64;
  thread_local std::vector<std::byte> buffer;
  if (buffer.size() < bytes + kAlign) buffer.resize(bytes + kAlign);
  void* p = buffer.data();
  size_t space = buffer.size();
  return std::align(kAlign, bytes, p, space);
}

void onednn_dense(int64_t m, int64_t n, int64_t k, const float* x, const float* w,
                  const float* bias, bool relu, float* y) {
  static MatmulCache cache;
  const MatmulKey key{m, n, k, bias != nullptr, relu, omp_get_max_threads()};
  try {
    const std::shared_ptr<const MatmulPrimitive> mm = cache.get(key);
    const dnnl::engine& engine = cpu_engine();
    // oneDNN's memory objects take non-const handles; it only reads its inputs.
    std::unordered_map<int, dnnl::memory> args{
        {DNNL_ARG_SRC, dnnl::memory(mm->src, engine, const_cast<float*>(x))},
        {DNNL_ARG_WEIGHTS, dnnl::memory(mm->weights, engine, const_cast<float*>(w))},
        {DNNL_ARG_DST, dnnl::memory(mm->dst, engine, y)}};
    if (bias != nullptr)
      args.emplace(DNNL_ARG_BIAS, dnnl::memory(mm->bias, engine, const_cast<float*>(bias)));
    if (mm->scratchpad_bytes > 0) {
      const dnnl::memory::desc pad({static_cast<int64_t>(mm->scratchpad_bytes)},
                                   dnnl::memory::data_type::u8, dnnl::memory::format_tag::a);
      args.emplace(DNNL_ARG_SCRATCHPAD,
                   dnnl::memory(pad, engine, scratchpad(mm->scratchpad_bytes)));
    }
    dnnl::stream stream(engine);
    mm->primitive.execute(stream, args);
    stream.wait();
  } catch (const dnnl::error& e) {
    TANDEM_THROW("dense: oneDNN matmul failed (", e.what(), ", status ", static_cast<int>(e.status),
                 ") for x [", m, ", ", k, "] @ kernel [", k, ", ", n, "]",
                 bias != nullptr ? " + bias" : "", relu ? ", relu" : "");
  }
}

#endif  // TANDEM_WITH_ONEDNN

}  // namespace

void dense(int64_t m, int64_t n, int64_t k, const float* x, const float* w, const float* bias,
           bool relu, float* y) {
  if (m == 0 || n == 0) return;
#if TANDEM_WITH_ONEDNN
  // An empty sum (k == 0) is left to the portable path, which writes act(bias).
  if (k > 0) return onednn_dense(m, n, k, x, w, bias, relu, y);
#endif
  gemm_then_epilogue(m, n, k, x, w, bias, relu, y);
}

void dense(int64_t m, int64_t n, int64_t k, const double* x, const double* w, const double* bias,
           bool relu, double* y) {
  if (m == 0 || n == 0) return;
  gemm_then_epilogue(m, n, k, x, w, bias, relu, y);
}

template <typename T>
void dense_relu_backward(int64_t m, int64_t n, const T* g, const T* y, T* dz, T* bias_grad) {
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

}  // namespace tandem::ops::cpu
