// Allocators: the CPU caching allocator (64-byte aligned, size-class free lists) and the
// per-device registry that tensors allocate through.
#pragma once

#include <cstddef>
#include <cstdint>

#include "tandem/core/device.h"

namespace tandem {

/// Counters of an allocator; `system_allocs` counts real malloc/cudaMalloc calls, so a
/// steady-state training step should leave it unchanged.
struct AllocatorStats {
  uint64_t system_allocs = 0;  ///< calls into the system allocator
  uint64_t system_frees = 0;   ///< blocks handed back to the system
  uint64_t cache_hits = 0;     ///< requests served from the free lists
  uint64_t requests = 0;       ///< all allocate() calls
  uint64_t bytes_in_use = 0;   ///< bytes handed out and not yet returned (rounded sizes)
  uint64_t bytes_cached = 0;   ///< bytes held in free lists
};

/// Where tensors get their memory; one per device (allocator_for()). Implementations cache
/// freed blocks, so that a steady training step makes no system calls.
class Allocator {
 public:
  virtual ~Allocator() = default;
  /// Returns at least `nbytes` bytes (nullptr for 0). Raises tandem::Error when out of memory.
  virtual void* allocate(size_t nbytes) = 0;
  /// Returns a block obtained from allocate(nbytes) with the same nbytes.
  virtual void deallocate(void* ptr, size_t nbytes) = 0;
  /// The device whose memory this allocator hands out.
  virtual Device device() const = 0;
  /// The counters so far (a snapshot).
  virtual AllocatorStats stats() const = 0;
  /// Hands every cached block back to the system.
  virtual void empty_cache() = 0;
};

/// The process-wide CPU allocator (thread safe).
Allocator& cpu_allocator();

/// The allocator for a device: the CPU allocator, or the device's caching CUDA allocator.
Allocator& allocator_for(Device device);

/// Rounds a request to the size class the CPU caching allocator serves it from.
size_t cpu_size_class(size_t nbytes);

}  // namespace tandem
