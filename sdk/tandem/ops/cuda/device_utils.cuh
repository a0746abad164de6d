// Device-side helpers shared by the .cu files of ops/cuda: the grid-stride loop, launch sizes
// and warp/block reductions (device scratch is ops/cuda/scratch.h). Included by .cu files only
// (nvcc).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "tandem/core/internal/cuda_check.h"
#include "tandem/ops/cuda/scratch.h"
#include "tandem/tensor/internal/cuda_context.h"

namespace tandem::ops::cuda {

/// Threads per block of the 1-D elementwise kernels.
inline constexpr int kThreads = 256;

/// The first index this thread handles and the grid-wide step of a grid-stride loop, in the
/// index type I (uint32_t when the extent fits, so index math avoids 64-bit division).
template <typename I>
__device__ __forceinline__ I grid_start() {
  return static_cast<I>(blockIdx.x) * static_cast<I>(blockDim.x) + static_cast<I>(threadIdx.x);
}
template <typename I>
__device__ __forceinline__ I grid_step() {
  return static_cast<I>(gridDim.x) * static_cast<I>(blockDim.x);
}

/// True when every index below n fits the 32-bit loop (with room for the last stride step).
inline bool fits_32bit(int64_t n) { return n <= (int64_t{1} << 31); }

/// Blocks for a grid-stride kernel of kThreads threads over n items.
inline int blocks_for(int64_t n) { return tandem::cuda::grid_size(n, kThreads); }

/// Sum over the 32 lanes of a warp; every lane gets the total.
template <typename T>
__device__ __forceinline__ T warp_sum(T value) {
  for (int offset = 16; offset > 0; offset >>= 1)
    value += __shfl_xor_sync(0xffffffffu, value, offset);
  return value;
}

/// Maximum over the 32 lanes of a warp; every lane gets it.
template <typename T>
__device__ __forceinline__ T warp_max(T value) {
  for (int offset = 16; offset > 0; offset >>= 1) {
    const T other = __shfl_xor_sync(0xffffffffu, value, offset);
    value = other > value ? other : value;
  }
  return value;
}

}  // namespace tandem::ops::cuda
