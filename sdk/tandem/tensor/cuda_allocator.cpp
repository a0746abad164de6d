// CUDA device allocator: size-class free lists per GPU and per stream, so steady-state steps do
// not call cudaMalloc and a block is only reused on the stream that last owned it; an optional
// per-GPU limit (TANDEM_GPU_MEMORY_LIMIT_MB); and the pinned host allocator used for staging
// input copies. Compiled only when TANDEM_ENABLE_CUDA is ON (see CMakeLists.txt).
#include "tandem/tensor/internal/cuda_allocator.h"

#include <cuda_runtime.h>

#include <cstdlib>
#include <iomanip>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <unordered_map>
#include <vector>

#include "tandem/core/error.h"
#include "tandem/tensor/internal/cuda_context.h"
#include "tandem/tensor/internal/host_caching_allocator.h"

namespace tandem {

namespace {

constexpr double kMiB = 1024.0 * 1024.0;

std::string mib(uint64_t bytes) {
  std::ostringstream out;
  out << std::fixed << std::setprecision(1) << static_cast<double>(bytes) / kMiB << " MiB";
  return out.str();
}

/// TANDEM_GPU_MEMORY_LIMIT_MB in bytes; 0 when unset. A malformed value raises naming it.
uint64_t memory_limit_bytes() {
  const char* value = std::getenv("TANDEM_GPU_MEMORY_LIMIT_MB");
  if (value == nullptr || *value == '\0') return 0;
  char* end = nullptr;
  const double mb = std::strtod(value, &end);
  TANDEM_CHECK(end != value && *end == '\0' && mb > 0, "TANDEM_GPU_MEMORY_LIMIT_MB=\"", value,
               "\" is not a positive number of MiB");
  return static_cast<uint64_t>(mb * kMiB);
}

/// Blocks are cached per (stream, size class). A block goes back to the pool of the stream it
/// was allocated on: work queued on that stream after the free is ordered after the work that
/// used it, so it can be handed out again at once. Work on other streams that used the block
/// is ordered by the strategy (run start/end events) or by whoever handed the tensor over.
class CudaCachingAllocator final : public Allocator {
 public:
  explicit CudaCachingAllocator(int index) : index_(index), limit_(memory_limit_bytes()) {}

  void* allocate(size_t nbytes) override {
    if (nbytes == 0) return nullptr;
    const size_t size = cpu_size_class(nbytes);
    cuda::DeviceGuard guard(index_);
    const cudaStream_t stream = cuda::current_stream();
    std::lock_guard<std::mutex> lock(mutex_);
    ++stats_.requests;
    auto& list = free_[stream][size];
    if (!list.empty()) {
      void* ptr = list.back();
      list.pop_back();
      ++stats_.cache_hits;
      stats_.bytes_cached -= size;
      stats_.bytes_in_use += size;
      live_[ptr] = stream;
      return ptr;
    }
    if (limit_ > 0 && stats_.bytes_in_use + stats_.bytes_cached + size > limit_)
      release_cached_locked();  // blocks cached for other sizes or streams count too
    if (limit_ > 0 && stats_.bytes_in_use + size > limit_) {
      TANDEM_THROW("cuda:", index_, ": out of memory: a request of ", nbytes, " bytes (", mib(size),
                   ") would exceed TANDEM_GPU_MEMORY_LIMIT_MB=", limit_ / kMiB, " (",
                   mib(stats_.bytes_in_use), " held by live tensors, nothing cached)");
    }
    void* ptr = nullptr;
    cudaError_t status = cudaMalloc(&ptr, size);
    if (status == cudaErrorMemoryAllocation && stats_.bytes_cached > 0) {
      (void)cudaGetLastError();
      release_cached_locked();
      status = cudaMalloc(&ptr, size);
    }
    if (status != cudaSuccess) {
      (void)cudaGetLastError();
      size_t free_bytes = 0, total_bytes = 0;
      if (cudaMemGetInfo(&free_bytes, &total_bytes) != cudaSuccess) (void)cudaGetLastError();
      TANDEM_THROW("cuda:", index_, ": out of memory: cudaMalloc of ", nbytes, " bytes (",
                   mib(size), ") failed with ", cudaGetErrorString(status), "; Tandem holds ",
                   mib(stats_.bytes_in_use), " in live tensors and ", mib(stats_.bytes_cached),
                   " cached; the GPU has ", mib(free_bytes), " free of ", mib(total_bytes),
                   " (other processes may hold the rest). Lower the batch size, or set "
                   "TANDEM_GPU_MEMORY_LIMIT_MB to share the GPU");
    }
    ++stats_.system_allocs;
    stats_.bytes_in_use += size;
    live_[ptr] = stream;
    return ptr;
  }

  void deallocate(void* ptr, size_t nbytes) override {
    if (ptr == nullptr) return;
    const size_t size = cpu_size_class(nbytes);
    std::lock_guard<std::mutex> lock(mutex_);
    const auto it = live_.find(ptr);
    TANDEM_CHECK(it != live_.end(), "cuda:", index_, ": freeing a block this allocator does not ",
                 "hold");
    free_[it->second][size].push_back(ptr);
    live_.erase(it);
    stats_.bytes_in_use -= size;
    stats_.bytes_cached += size;
  }

  Device device() const override { return Device::cuda(index_); }

  AllocatorStats stats() const override {
    std::lock_guard<std::mutex> lock(mutex_);
    return stats_;
  }

  void empty_cache() override {
    cuda::DeviceGuard guard(index_);
    std::lock_guard<std::mutex> lock(mutex_);
    release_cached_locked();
  }

 private:
  // cudaFree waits for the device to be idle, so no stream can still use a cached block.
  void release_cached_locked() {
    for (auto& [stream, by_size] : free_) {
      for (auto& [size, blocks] : by_size) {
        for (void* ptr : blocks) {
          if (cudaFree(ptr) != cudaSuccess) (void)cudaGetLastError();
          ++stats_.system_frees;
          stats_.bytes_cached -= size;
        }
        blocks.clear();
      }
    }
  }

  int index_;
  uint64_t limit_;  // 0: no limit
  mutable std::mutex mutex_;
  std::unordered_map<cudaStream_t, std::unordered_map<size_t, std::vector<void*>>> free_;
  std::unordered_map<void*, cudaStream_t> live_;  // block -> the stream it was allocated on
  AllocatorStats stats_;
};

/// Page-locked host memory (cudaHostAlloc), cached by size class: the staging buffers of
/// host-to-device input copies, which may then run asynchronously on a copy stream.
class PinnedHostAllocator final : public detail::HostCachingAllocator {
 protected:
  void* system_allocate(size_t size) override {
    void* ptr = nullptr;
    if (cudaHostAlloc(&ptr, size, cudaHostAllocPortable) != cudaSuccess) {
      (void)cudaGetLastError();
      return nullptr;
    }
    return ptr;
  }
  void system_free(void* ptr) override {
    if (cudaFreeHost(ptr) != cudaSuccess) (void)cudaGetLastError();
  }
  const char* label() const override { return "pinned host allocator (cudaHostAlloc)"; }
};

}  // namespace

Allocator& cuda_allocator(int index) {
  static std::mutex mutex;
  static auto* allocators = new std::unordered_map<int, std::unique_ptr<Allocator>>();
  std::lock_guard<std::mutex> lock(mutex);
  auto& slot = (*allocators)[index];
  if (!slot) {
    TANDEM_CHECK(index >= 0 && index < cuda_device_count(), "cuda:", index,
                 " is not a visible GPU (", cuda_device_count(),
                 " visible: ", cuda_availability().reason, ")");
    slot = std::make_unique<CudaCachingAllocator>(index);
  }
  return *slot;
}

Allocator& pinned_host_allocator() {
  static auto* allocator = new PinnedHostAllocator();  // never destroyed: used at exit too
  return *allocator;
}

}  // namespace tandem
