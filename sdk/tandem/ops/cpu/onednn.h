// oneDNN plumbing shared by the CPU kernels that run its primitives (dense's matmul, conv2d's
// convolutions): the engine, a cache of primitives, one way to execute them with a per-thread
// scratchpad; and the kernels of onednn_*.cpp. Included only where TANDEM_WITH_ONEDNN is 1.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <oneapi/dnnl/dnnl.hpp>
#include <unordered_map>
#include <utility>

#include "tandem/core/half.h"
#include "tandem/ops/cpu/nn_kernels.h"

namespace tandem::ops::cpu::onednn {

/// The CPU engine every primitive and memory object of Tandem uses (applying the cap below
/// first).
const dnnl::engine& engine();

/// Caps oneDNN's instruction set at cpu_isa() when TANDEM_MAX_CPU_ISA lowered it
/// (dnnl_set_max_cpu_isa), once, before oneDNN generates its first kernel: engine() and the
/// GEMMs call it.
void apply_cpu_isa_cap();

/// The threads oneDNN splits work into on the calling thread: omp_get_max_threads(), first
/// lowered (omp_set_num_threads) to the thread limit of OpenMP (OMP_THREAD_LIMIT) where that is
/// smaller. oneDNN fixes a primitive's (and dnnl_sgemm's) split for omp_get_max_threads()
/// threads and runs it in a team OpenMP may make smaller: the threads that never start would
/// leave their share of the output unwritten. Called before every oneDNN call.
int team_threads();

/// Attributes of a primitive whose caller passes the scratchpad (so concurrent executions on
/// replica threads never share one, whatever the library's build options), with a ReLU applied
/// to the accumulator when `relu`.
dnnl::primitive_attr attributes(bool relu = false);

/// A memory object over caller-owned data. oneDNN's handles are non-const; it only reads the
/// inputs of a primitive.
inline dnnl::memory wrap(const dnnl::memory::desc& desc, const void* data) {
  return dnnl::memory(desc, engine(), const_cast<void*>(data));
}

/// Runs `primitive` on the calling thread with `args` and this thread's scratchpad of
/// `scratchpad_bytes`, and waits for it. Raises dnnl::error.
void execute(const dnnl::primitive& primitive, std::unordered_map<int, dnnl::memory> args,
             size_t scratchpad_bytes);

/// Combines the fields of a cache key (a range of integers) into one hash.
template <typename Fields>
size_t hash_values(const Fields& fields) {
  size_t h = 0;
  for (int64_t v : fields) h = h * 1000003u ^ std::hash<int64_t>{}(v);
  return h;
}

/// Primitives by key, shared by all threads. The key holds everything the primitive was made
/// for, the thread count included: oneDNN (OpenMP runtime) fixes a primitive's work split when
/// it is created, from the creating thread's omp_get_max_threads(), and each replica thread has
/// its own budget (set_compute_threads). A training run meets a handful of shapes (its layers
/// times the full and the last partial batch); past kMaxEntries the cache starts over.
template <typename Key, typename Entry, typename Hash>
class PrimitiveCache {
 public:
  /// The entry for `key`, made by `create(key)` on first use.
  template <typename Create>
  std::shared_ptr<const Entry> get(const Key& key, const Create& create) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = entries_.find(key);
    if (it != entries_.end()) return it->second;
    // Created under the lock, once per key: oneDNN shares what it builds between primitive
    // descriptors (its own cache), and two replicas creating the same primitive at once would
    // build it twice and race on that shared state.
    if (entries_.size() >= kMaxEntries) entries_.clear();
    return entries_.try_emplace(key, create(key)).first->second;
  }

 private:
  static constexpr size_t kMaxEntries = 256;
  std::mutex mutex_;
  std::unordered_map<Key, std::shared_ptr<const Entry>, Hash> entries_;
};

/// A buffer of the calling thread for a primitive's weights in the layout it asked for, grown as
/// needed and aligned for vector loads; valid until the thread's next call.
void* weights_buffer(size_t bytes);

// ---- kernels on primitives (onednn_conv.cpp); arguments and results as cpu::conv2d's ----------
// float32 or bfloat16 (summed in float32), with no empty dimension and at least one input
// channel (the caller checks).

void conv2d(const ConvGeometry& g, int64_t filters, const float* x, const float* w,
            const float* bias, bool relu, float* y);
void conv2d_backward_weights(const ConvGeometry& g, int64_t filters, const float* x,
                             const float* dy, float* dw, float* db);
void conv2d_backward_data(const ConvGeometry& g, int64_t filters, const float* dy, const float* w,
                          float* dx);

/// Whether oneDNN makes bfloat16 convolutions on this CPU (asked once).
bool has_bf16_convolutions();
void conv2d(const ConvGeometry& g, int64_t filters, const bfloat16* x, const bfloat16* w,
            const bfloat16* bias, bool relu, bfloat16* y);
void conv2d_backward_weights(const ConvGeometry& g, int64_t filters, const bfloat16* x,
                             const bfloat16* dy, bfloat16* dw, bfloat16* db);
void conv2d_backward_data(const ConvGeometry& g, int64_t filters, const bfloat16* dy,
                          const bfloat16* w, bfloat16* dx);

}  // namespace tandem::ops::cpu::onednn
