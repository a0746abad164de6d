// HostCachingAllocator: the size-class cache shared by the host allocators (the CPU allocator,
// and the pinned allocator of CUDA builds). Requests are rounded to cpu_size_class; freed
// blocks go to a free list per class and are handed out again, so steady-state steps make no
// system calls. Subclasses say how blocks are obtained from and returned to the system.
// Internal header.
#pragma once

#include <mutex>
#include <unordered_map>
#include <vector>

#include "tandem/tensor/allocator.h"

namespace tandem::detail {

class HostCachingAllocator : public Allocator {
 public:
  void* allocate(size_t nbytes) final;
  void deallocate(void* ptr, size_t nbytes) final;
  Device device() const override { return Device::cpu(); }
  AllocatorStats stats() const final;
  void empty_cache() final;

 protected:
  /// A new block of `size` bytes from the system; nullptr when out of memory.
  virtual void* system_allocate(size_t size) = 0;
  virtual void system_free(void* ptr) = 0;
  /// Names the allocator in errors: "cpu allocator".
  virtual const char* label() const = 0;

 private:
  mutable std::mutex mutex_;
  std::unordered_map<size_t, std::vector<void*>> free_;
  AllocatorStats stats_;
};

}  // namespace tandem::detail
