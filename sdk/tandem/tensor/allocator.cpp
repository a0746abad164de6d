// The CPU caching allocator: requests are rounded to size classes (powers of two up to 1 MiB,
// then multiples of 1 MiB) and freed blocks go to a per-class free list, so a training step
// in steady state reuses memory instead of calling malloc/free for every op.
#include "tandem/tensor/allocator.h"

#include <cstdlib>

#include "tandem/core/error.h"
#include "tandem/tensor/internal/host_caching_allocator.h"

namespace tandem {

namespace {

constexpr size_t kAlignment = 64;
constexpr size_t kMinBlock = 64;
constexpr size_t kLargeGranule = size_t{1} << 20;

class CpuCachingAllocator final : public detail::HostCachingAllocator {
 public:
  ~CpuCachingAllocator() override {
    // Intentionally leaked at exit: tensors in static storage may still be destroyed later.
  }

 protected:
  void* system_allocate(size_t size) override { return std::aligned_alloc(kAlignment, size); }
  void system_free(void* ptr) override { std::free(ptr); }
  const char* label() const override { return "cpu allocator"; }
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

namespace detail {

void* HostCachingAllocator::allocate(size_t nbytes) {
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
  void* ptr = system_allocate(size);  // outside the lock: it may take a while
  if (ptr == nullptr) {
    std::lock_guard<std::mutex> lock(mutex_);
    stats_.bytes_in_use -= size;
    TANDEM_THROW(label(), ": out of memory allocating ", nbytes, " bytes (", stats_.bytes_in_use,
                 " bytes in use, ", stats_.bytes_cached, " cached)");
  }
  return ptr;
}

void HostCachingAllocator::deallocate(void* ptr, size_t nbytes) {
  if (ptr == nullptr) return;
  const size_t size = cpu_size_class(nbytes);
  std::lock_guard<std::mutex> lock(mutex_);
  free_[size].push_back(ptr);
  stats_.bytes_in_use -= size;
  stats_.bytes_cached += size;
}

AllocatorStats HostCachingAllocator::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

void HostCachingAllocator::empty_cache() {
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto& [size, blocks] : free_) {
    for (void* ptr : blocks) {
      system_free(ptr);
      ++stats_.system_frees;
      stats_.bytes_cached -= size;
    }
    blocks.clear();
  }
}

}  // namespace detail

Allocator& cpu_allocator() {
  static auto* allocator = new CpuCachingAllocator();  // never destroyed: see destructor note
  return *allocator;
}

}  // namespace tandem
