// Device discovery: asks the CUDA runtime how many GPUs are visible. A dispatch point: the only
// core file that branches on TANDEM_WITH_CUDA. A missing or old driver means "0 GPUs", with
// the runtime's reason kept for the device report; it never aborts the program.
#include "tandem/core/device.h"

#if TANDEM_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace tandem {

namespace {

CudaAvailability discover() {
  CudaAvailability result;
#if TANDEM_WITH_CUDA
  result.built = true;
  int count = 0;
  cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    // cudaErrorInsufficientDriver / cudaErrorNoDevice are the expected answers on machines
    // without a usable GPU; clear the sticky error state so later calls start clean.
    result.reason = std::string(cudaGetErrorName(status)) + ": " + cudaGetErrorString(status);
    (void)cudaGetLastError();
    return result;
  }
  if (count == 0) {
    result.reason = "the CUDA runtime reports no device (check CUDA_VISIBLE_DEVICES)";
    return result;
  }
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, i) != cudaSuccess) {
      (void)cudaGetLastError();
      continue;
    }
    result.devices.push_back({i, prop.name, prop.totalGlobalMem, prop.major, prop.minor});
  }
  if (result.devices.empty()) result.reason = "no device answered cudaGetDeviceProperties";
#else
  result.built = false;
  result.reason = "CUDA support was not built (configure with -DTANDEM_ENABLE_CUDA=ON)";
#endif
  return result;
}

}  // namespace

const CudaAvailability& cuda_availability() {
  static const CudaAvailability availability = discover();
  return availability;
}

}  // namespace tandem
