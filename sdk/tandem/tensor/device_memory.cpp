// Dispatch point for memory: picks the allocator of a device and copies bytes between devices.
// Only this file and the CUDA allocator branch on TANDEM_WITH_CUDA in the tensor layer.
#include "tandem/tensor/device_memory.h"

#include <cstring>

#include "tandem/core/error.h"
#include "tandem/tensor/allocator.h"

#if TANDEM_WITH_CUDA
#include <cuda_runtime.h>

#include "tandem/tensor/cuda_allocator.h"
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
  const cudaMemcpyKind kind = src_device.is_cpu()   ? cudaMemcpyHostToDevice
                              : dst_device.is_cpu() ? cudaMemcpyDeviceToHost
                                                    : cudaMemcpyDeviceToDevice;
  const cudaError_t status = cudaMemcpy(dst, src, n, kind);
  TANDEM_CHECK(status == cudaSuccess, "copy of ", n, " bytes from ", src_device, " to ",
               dst_device, " failed: ", cudaGetErrorString(status));
#else
  throw NotBuiltError("copy between " + src_device.to_string() + " and " +
                      dst_device.to_string() +
                      ": CUDA support was not built (configure with -DTANDEM_ENABLE_CUDA=ON)");
#endif
}

}  // namespace tandem
