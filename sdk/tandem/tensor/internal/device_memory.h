// Byte copies between host and device memory (the only place tensors touch the CUDA runtime).
#pragma once

#include <cstddef>

#include "tandem/core/device.h"

namespace tandem {

/// Copies n bytes between any two devices. With a GPU involved the copy runs on the calling
/// thread's current stream of that GPU: complete on return when the destination is the host,
/// ordered before the thread's later kernels otherwise.
void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, size_t n);

}  // namespace tandem

#include <vector>

namespace tandem {
class Tensor;

/// Input copies: `host` tensors (CPU) copied to `device` through page-locked staging buffers on
/// the device's copy stream, so they overlap the compute already queued; the calling thread's
/// current stream waits for them with an event (the host does not wait). Tensors already on
/// `device` are returned as they are. For a CPU `device`, returns `host` unchanged.
std::vector<Tensor> stage_to_device(const std::vector<Tensor>& host, Device device);

}  // namespace tandem
