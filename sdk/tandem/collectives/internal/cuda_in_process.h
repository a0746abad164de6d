// The data phases of the in_process collectives for replicas that share one GPU (logical
// replicas): kernels that read and write the peers' device buffers directly. Internal header:
// plain C++ (no CUDA types), used by in_process_kernels.cpp in CUDA builds only.
#pragma once

#include <cstddef>
#include <cstdint>

#include "tandem/collectives/reduce_op.h"
#include "tandem/core/device.h"
#include "tandem/core/dtype.h"

namespace tandem::collectives::cuda_in_process {

/// Most ranks one kernel reads from (the pointer lists travel as kernel parameters).
inline constexpr int kMaxRanks = 64;

/// dst[k][i] = src[0][i] op src[1][i] op ... op src[num_src-1][i] for i < count and every k, in
/// that fixed order (the CPU backend's order, so both give the same bits), on the calling
/// thread's current stream of `device`. kMean divides the sum by num_src; kMax propagates NaN.
void reduce_slice(Device device, DType dtype, const void* const* src, int num_src, void* const* dst,
                  int num_dst, int64_t count, ReduceOp op);

/// Copies `bytes` between buffers of `device` on the calling thread's current stream.
void copy(Device device, void* dst, const void* src, size_t bytes);

}  // namespace tandem::collectives::cuda_in_process
