// The CUDA device allocator (one per GPU). Internal header: included only by dispatch points.
#pragma once

#include "tandem/tensor/allocator.h"

namespace tandem {

/// The allocator of GPU `index` (created on first use).
Allocator& cuda_allocator(int index);

}  // namespace tandem
