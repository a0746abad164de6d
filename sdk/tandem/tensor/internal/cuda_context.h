// Per-thread CUDA state: a guard for the current device, the calling thread's current stream on
// each device, its cuBLAS and cuBLASLt handles (TF32 off unless allowed), and launch-size
// helpers.
// Internal header: CUDA builds only, included by CUDA sources and dispatch points.
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "tandem/core/device.h"

namespace tandem::cuda {

/// Makes a GPU current on the calling thread while alive and restores the previous one after
/// (a no-op when it already is current). Kernels, streams and handles belong to the device
/// that was current when they were created or launched, so every op on a cuda:N tensor runs
/// under a guard for N.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device);
  explicit DeviceGuard(Device device);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;  ///< -1: nothing to restore
};

/// The calling thread's current stream on the current device: the one a StreamGuard installed,
/// else a stream this thread owns on that device, created on first use and destroyed when the
/// thread ends. Never the legacy default stream, so replica threads do not serialise on it.
cudaStream_t current_stream();

/// While alive, makes `stream` the calling thread's current stream on the current device
/// (a copy stream, say); restores the previous one after. Tensor copies and kernels queued
/// meanwhile go to `stream`.
class StreamGuard {
 public:
  explicit StreamGuard(cudaStream_t stream);
  ~StreamGuard();
  StreamGuard(const StreamGuard&) = delete;
  StreamGuard& operator=(const StreamGuard&) = delete;

 private:
  int device_;
  cudaStream_t previous_;
};

/// The calling thread's cuBLAS handle for the current device, bound to `stream` (a stream of
/// that device) and set to the math mode tandem::cuda::allow_tf32() selects:
/// CUBLAS_DEFAULT_MATH (full float32) by default, CUBLAS_TF32_TENSOR_OP_MATH when allowed.
cublasHandle_t cublas_handle(cudaStream_t stream);

/// The calling thread's cuBLASLt handle for the current device (cuBLASLt takes the stream and
/// the math mode with each matmul, so the handle carries neither).
cublasLtHandle_t cublaslt_handle();

/// Streaming multiprocessors of the current device (cached per device).
int multiprocessor_count();

/// Blocks for a grid-stride kernel over n items with `threads` per block: enough to fill the
/// device (a few blocks per SM), never more than the items need, at least 1.
int grid_size(int64_t n, int threads);

}  // namespace tandem::cuda
