// Device kernels of the in_process collectives for logical replicas on one GPU: a fixed-order
// reduction over every rank's buffer, written to every rank's output.
#include <cuda_runtime.h>

#include "tandem/collectives/internal/cuda_in_process.h"
#include "tandem/collectives/internal/reduce_max.h"
#include "tandem/core/error.h"
#include "tandem/core/internal/cuda_check.h"
#include "tandem/tensor/internal/cuda_context.h"

namespace tandem::collectives::cuda_in_process {

namespace {

constexpr int kThreads = 256;

struct Pointers {
  const void* src[kMaxRanks];
  void* dst[kMaxRanks];
};

template <typename T>
__global__ void reduce_kernel(Pointers p, int num_src, int num_dst, int64_t count, ReduceOp op) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += step) {
    T result;
    if (op == ReduceOp::kMax) {
      result = static_cast<const T*>(p.src[0])[i];
      for (int k = 1; k < num_src; ++k)
        result = tandem::detail::max_propagating_nan(result, static_cast<const T*>(p.src[k])[i]);
    } else {
      // 16-bit values add in float32 and round once; plain adds (no fused multiply-add
      // possible here): the same rounding as the CPU loop.
      using Acc = compute_type_t<T>;
      Acc acc = static_cast<Acc>(static_cast<const T*>(p.src[0])[i]);
      for (int k = 1; k < num_src; ++k)
        acc = static_cast<Acc>(acc + static_cast<Acc>(static_cast<const T*>(p.src[k])[i]));
      if (op == ReduceOp::kMean) acc = static_cast<Acc>(acc / static_cast<Acc>(num_src));
      result = static_cast<T>(acc);
    }
    for (int k = 0; k < num_dst; ++k) static_cast<T*>(p.dst[k])[i] = result;
  }
}

}  // namespace

void reduce_slice(Device device, DType dtype, const void* const* src, int num_src, void* const* dst,
                  int num_dst, int64_t count, ReduceOp op) {
  if (count <= 0) return;
  TANDEM_CHECK(num_src >= 1 && num_src <= kMaxRanks && num_dst >= 1 && num_dst <= kMaxRanks,
               "in_process collectives on ", device, ": ", num_src, " ranks; at most ", kMaxRanks,
               " replicas can share a GPU");
  Pointers p{};
  for (int k = 0; k < num_src; ++k) p.src[k] = src[k];
  for (int k = 0; k < num_dst; ++k) p.dst[k] = dst[k];
  tandem::cuda::DeviceGuard guard(device);
  const cudaStream_t stream = tandem::cuda::current_stream();
  const int blocks = tandem::cuda::grid_size(count, kThreads);
  dispatch_any_numeric(dtype, "all_reduce", [&]<typename T>() {
    reduce_kernel<T><<<blocks, kThreads, 0, stream>>>(p, num_src, num_dst, count, op);
  });
  TANDEM_CUDA_CHECK(cudaGetLastError());
}

void copy(Device device, void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  tandem::cuda::DeviceGuard guard(device);
  TANDEM_CUDA_CHECK(
      cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, tandem::cuda::current_stream()));
}

}  // namespace tandem::collectives::cuda_in_process
