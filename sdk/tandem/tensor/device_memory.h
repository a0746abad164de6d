// Byte copies between host and device memory (the only place tensors touch the CUDA runtime).
#pragma once

#include <cstddef>

#include "tandem/core/device.h"

namespace tandem {

/// Copies n bytes between any two devices; blocking (the copy is complete on return).
void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, size_t n);

}  // namespace tandem
