// CUDA device allocator: size-class free lists per GPU, so steady-state steps do not call
// cudaMalloc. Compiled only when TANDEM_ENABLE_CUDA is ON (see CMakeLists.txt).
#include "tandem/tensor/cuda_allocator.h"

#include <cuda_runtime.h>

#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "tandem/core/error.h"

namespace tandem {

namespace {

class CudaCachingAllocator final : public Allocator {
 public:
  explicit CudaCachingAllocator(int index) : index_(index) {}

  void* allocate(size_t nbytes) override {
    if (nbytes == 0) return nullptr;
    const size_t size = cpu_size_class(nbytes);
    std::lock_guard<std::mutex> lock(mutex_);
    ++stats_.requests;
    auto& list = free_[size];
    if (!list.empty()) {
      void* ptr = list.back();
      list.pop_back();
      ++stats_.cache_hits;
      stats_.bytes_cached -= size;
      stats_.bytes_in_use += size;
      return ptr;
    }
    int previous = 0;
    cudaGetDevice(&previous);
    cudaSetDevice(index_);
    void* ptr = nullptr;
    cudaError_t status = cudaMalloc(&ptr, size);
    if (status == cudaErrorMemoryAllocation && stats_.bytes_cached > 0) {
      (void)cudaGetLastError();
      release_cached_locked();
      status = cudaMalloc(&ptr, size);
    }
    cudaSetDevice(previous);
    if (status != cudaSuccess) {
      (void)cudaGetLastError();
      TANDEM_THROW("cuda:", index_, ": out of memory allocating ", nbytes, " bytes (",
                   stats_.bytes_in_use, " bytes in use, ", stats_.bytes_cached,
                   " cached): ", cudaGetErrorString(status));
    }
    ++stats_.system_allocs;
    stats_.bytes_in_use += size;
    return ptr;
  }

  void deallocate(void* ptr, size_t nbytes) override {
    if (ptr == nullptr) return;
    const size_t size = cpu_size_class(nbytes);
    std::lock_guard<std::mutex> lock(mutex_);
    free_[size].push_back(ptr);
    stats_.bytes_in_use -= size;
    stats_.bytes_cached += size;
  }

  Device device() const override { return Device::cuda(index_); }

  AllocatorStats stats() const override {
    std::lock_guard<std::mutex> lock(mutex_);
    return stats_;
  }

  void empty_cache() override {
    std::lock_guard<std::mutex> lock(mutex_);
    release_cached_locked();
  }

 private:
  void release_cached_locked() {
    for (auto& [size, blocks] : free_) {
      for (void* ptr : blocks) {
        cudaFree(ptr);
        ++stats_.system_frees;
        stats_.bytes_cached -= size;
      }
      blocks.clear();
    }
  }

  int index_;
  mutable std::mutex mutex_;
  std::unordered_map<size_t, std::vector<void*>> free_;
  AllocatorStats stats_;
};

}  // namespace

Allocator& cuda_allocator(int index) {
  static std::mutex mutex;
  static auto* allocators = new std::unordered_map<int, std::unique_ptr<Allocator>>();
  std::lock_guard<std::mutex> lock(mutex);
  auto& slot = (*allocators)[index];
  if (!slot) {
    TANDEM_CHECK(index >= 0 && index < cuda_device_count(), "cuda:", index,
                 " is not a visible GPU (", cuda_device_count(), " visible: ",
                 cuda_availability().reason, ")");
    slot = std::make_unique<CudaCachingAllocator>(index);
  }
  return *slot;
}

}  // namespace tandem
