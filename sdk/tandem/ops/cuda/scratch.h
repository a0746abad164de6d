// Device scratch memory for the CUDA kernels' host launchers, from the caching allocator of the
// current device. Plain C++ (no device code), so .cpp launchers and .cu files share it.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

#include "tandem/core/internal/cuda_check.h"
#include "tandem/tensor/allocator.h"

namespace tandem::ops::cuda {

/// Device scratch from the caching allocator, returned when it goes out of scope, possibly
/// while the kernels using it are still queued: exactly what a temporary tensor does. The block
/// is safe as long as its next user runs on the same stream (ordered after them); the caching
/// allocator does not yet track streams, so that holds for one stream per GPU.
class Scratch {
 public:
  explicit Scratch(size_t nbytes) : nbytes_(nbytes) {
    int device = 0;
    TANDEM_CUDA_CHECK(cudaGetDevice(&device));
    allocator_ = &allocator_for(Device::cuda(device));
    data_ = allocator_->allocate(nbytes);
  }
  ~Scratch() { allocator_->deallocate(data_, nbytes_); }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  void* data() const { return data_; }

 private:
  size_t nbytes_;
  Allocator* allocator_;
  void* data_;
};

}  // namespace tandem::ops::cuda
