// The CUDA device allocators (one per GPU) and the pinned host allocator. Internal header:
// included only by dispatch points and CUDA sources.
#pragma once

#include "tandem/tensor/allocator.h"

namespace tandem {

/// The allocator of GPU `index` (created on first use): per-stream size-class caches, honouring
/// TANDEM_GPU_MEMORY_LIMIT_MB.
Allocator& cuda_allocator(int index);

/// Page-locked host memory for staging host-to-device copies (cached by size class).
Allocator& pinned_host_allocator();

}  // namespace tandem
