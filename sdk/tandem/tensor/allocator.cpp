// The CPU caching allocator: requests are rounded to size classes (powers of two up to 1 MiB,
// then multiples of 1 MiB) and freed blocks go to a per-class free list, so a training step
// in steady state reuses memory instead of calling malloc/free for every op.
#include "tandem/tensor/allocator.h"

#include <cstdlib>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "tandem/core/error.h"

namespace tandem {

namespace {

constexpr size_t kAlignment = 64;
constexpr size_t kMinBlock = 64;
constexpr size_t kLargeGranule = size_t{1} << 20;

class CpuCachingAllocator final : public Allocator {
 public:
  ~CpuCachingAllocator() override {
    // Intentionally leaked at exit: tensors in static storage may still be destroyed later.
  }

  void* allocate(size_t nbytes) override {
    if (nbytes == 0) return nullptr;
    const size_t size = cpu_size_class(nbytes);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      ++stats_.requests;
      auto it = free_.find(size);
      if (it != free_.end() && !it->second.empty()) {
        void* ptr = it->second.back();
        it->second.pop_back();
        ++stats_.cache_hits;
        stats_.bytes_cached -= size;
        stats_.bytes_in_use += size;
        return ptr;
      }
      ++stats_.system_allocs;
      stats_.bytes_in_use += size;
    }
    void* ptr = std::aligned_alloc(kAlignment, size);
    if (ptr == nullptr) {
      std::lock_guard<std::mutex> lock(mutex_);
      stats_.bytes_in_use -= size;
      TANDEM_THROW("cpu allocator: out of memory allocating ", nbytes, " bytes (",
                   stats_.bytes_in_use, " bytes in use, ", stats_.bytes_cached, " cached)");
    }
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

  Device device() const override { return Device::cpu(); }

  AllocatorStats stats() const override {
    std::lock_guard<std::mutex> lock(mutex_);
    return stats_;
  }

  void empty_cache() override {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& [size, blocks] : free_) {
      for (void* ptr : blocks) {
        std::free(ptr);
        ++stats_.system_frees;
        stats_.bytes_cached -= size;
      }
      blocks.clear();
    }
  }

 private:
  mutable std::mutex mutex_;
  std::unordered_map<size_t, std::vector<void*>> free_;
  AllocatorStats stats_;
};

}  // namespace

size_t cpu_size_class(size_t nbytes) {
  if (nbytes <= kMinBlock) return kMinBlock;
  if (nbytes <= kLargeGranule) {
    size_t size = kMinBlock;
    while (size < nbytes) size <<= 1;
    return size;
  }
  return (nbytes + kLargeGranule - 1) / kLargeGranule * kLargeGranule;
}

Allocator& cpu_allocator() {
  static auto* allocator = new CpuCachingAllocator();  // never destroyed: see destructor note
  return *allocator;
}

}  // namespace tandem
