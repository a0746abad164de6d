// Dispatch point for memory: picks the allocator of a device and copies bytes between devices.
// Only this file and the CUDA allocator branch on TANDEM_WITH_CUDA in the tensor layer.
#include "tandem/tensor/internal/device_memory.h"

#include <cstring>

#include "tandem/core/error.h"
#include "tandem/tensor/allocator.h"
#include "tandem/tensor/tensor.h"

#if TANDEM_WITH_CUDA
#include <cuda_runtime.h>

#include "tandem/tensor/internal/cuda_allocator.h"
#include "tandem/tensor/internal/cuda_context.h"
#endif

namespace tandem {

Allocator& allocator_for(Device device) {
  if (device.is_cpu()) return cpu_allocator();
#if TANDEM_WITH_CUDA
  return cuda_allocator(device.index);
#else
  throw NotBuiltError("tensor on " + device.to_string() +
                      ": CUDA support was not built (configure with -DTANDEM_ENABLE_CUDA=ON)");
#endif
}

void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, size_t n) {
  if (n == 0) return;
  if (dst_device.is_cpu() && src_device.is_cpu()) {
    std::memcpy(dst, src, n);
    return;
  }
#if TANDEM_WITH_CUDA
  // On the calling thread's current stream of the GPU involved, so a copy is ordered with the
  // kernels this thread queued there, and other threads' streams (other replicas) never wait.
  const cudaMemcpyKind kind = src_device.is_cpu()   ? cudaMemcpyHostToDevice
                              : dst_device.is_cpu() ? cudaMemcpyDeviceToHost
                                                    : cudaMemcpyDeviceToDevice;
  const Device gpu = src_device.is_cuda() ? src_device : dst_device;
  cuda::DeviceGuard guard(gpu);
  const cudaStream_t stream = cuda::current_stream();
  cudaError_t status = cudaSuccess;
  if (kind == cudaMemcpyDeviceToDevice && src_device.index != dst_device.index) {
    // Between GPUs: the source's writer is this thread's stream on the source GPU; the copy
    // runs on the destination's stream after that work.
    {
      cuda::DeviceGuard source_guard(src_device);
      status = cudaStreamSynchronize(cuda::current_stream());
    }
    cuda::DeviceGuard destination_guard(dst_device);
    if (status == cudaSuccess)
      status = cudaMemcpyPeerAsync(dst, dst_device.index, src, src_device.index, n,
                                   cuda::current_stream());
  } else {
    // From pageable host memory the call returns once the source is staged, so the caller may
    // reuse it at once; the kernels queued after it on this stream see the data.
    status = cudaMemcpyAsync(dst, src, n, kind, stream);
    // The host reads a device->host copy right after this returns: wait for this stream only.
    if (status == cudaSuccess && kind == cudaMemcpyDeviceToHost)
      status = cudaStreamSynchronize(stream);
  }
  if (status != cudaSuccess) (void)cudaGetLastError();
  TANDEM_CHECK(status == cudaSuccess, "copy of ", n, " bytes from ", src_device, " to ", dst_device,
               " failed: ", cudaGetErrorString(status));
#else
  throw NotBuiltError("copy between " + src_device.to_string() + " and " + dst_device.to_string() +
                      ": CUDA support was not built (configure with -DTANDEM_ENABLE_CUDA=ON)");
#endif
}

#if TANDEM_WITH_CUDA
namespace cuda {
std::vector<Tensor> stage_to_device(const std::vector<Tensor>& host,
                                    Device device);  // cuda_staging
}
#endif

std::vector<Tensor> stage_to_device(const std::vector<Tensor>& host, Device device) {
  if (device.is_cpu()) return host;
#if TANDEM_WITH_CUDA
  return cuda::stage_to_device(host, device);
#else
  throw NotBuiltError("input copies to " + device.to_string() +
                      ": CUDA support was not built (configure with -DTANDEM_ENABLE_CUDA=ON)");
#endif
}

}  // namespace tandem
