// The ops layer's one dispatch point: the device an op runs on, and the choice between an op's
// CPU and CUDA implementations. This is the only file of ops that asks how Tandem was built.
#pragma once

#include <initializer_list>
#include <string_view>

#include "tandem/core/device.h"
#include "tandem/core/dtype.h"
#include "tandem/core/error.h"
#include "tandem/tensor/tensor.h"

#if TANDEM_WITH_CUDA
#include "tandem/ops/cuda/cuda_kernels.h"
#include "tandem/tensor/internal/cuda_context.h"
#endif

namespace tandem::ops::internal {

/// The device all `inputs` live on; raises naming `op` when one is undefined or they disagree.
inline Device common_device(std::string_view op, std::initializer_list<const Tensor*> inputs) {
  Device device;
  size_t i = 0;
  for (const Tensor* t : inputs) {
    TANDEM_CHECK(t->defined(), op, ": input ", i + 1, " of ", inputs.size(),
                 " is an undefined tensor");
    if (i == 0) device = t->device();
    TANDEM_CHECK(t->device() == device, op, ": inputs are on different devices (", device, " and ",
                 t->device(), "); move them with .to(device) first");
    ++i;
  }
  return device;
}

/// The CUDA half of a dispatch call: its code (which sees `stream`, the calling thread's
/// current stream on the tensors' GPU) becomes a lambda when CUDA is built; otherwise it is left
/// out, so a CPU-only build never names a CUDA kernel.
#if TANDEM_WITH_CUDA
#define TANDEM_ON_CUDA(...) [&](cudaStream_t stream) { __VA_ARGS__; }
#else
struct NoCudaPath {};
#define TANDEM_ON_CUDA(...) ::tandem::ops::internal::NoCudaPath()
#endif

/// Runs an op's CPU implementation or, for a GPU, its CUDA implementation. Every op calls this
/// once per kernel launch, with both halves:
///   dispatch(op, device, [&] { cpu::kernel(...); }, TANDEM_ON_CUDA(cuda::kernel(..., stream)));
template <typename CpuFn, typename CudaFn>
void dispatch(std::string_view op, Device device, const CpuFn& run_cpu, const CudaFn& run_cuda) {
  if (device.is_cpu()) {
    run_cpu();
    return;
  }
#if TANDEM_WITH_CUDA
  (void)op;  // the kernels' own errors say what failed
  // Kernels run on the current device: make it the tensors' GPU for the launch. They queue on
  // this thread's stream and return at once; nothing here waits for the GPU.
  tandem::cuda::DeviceGuard guard(device);
  run_cuda(tandem::cuda::current_stream());
#else
  (void)run_cuda;
  throw NotBuiltError(tandem::detail::str_cat("op ", op, " on ", device,
                                              ": Tandem was built without CUDA "
                                              "(configure with -DTANDEM_ENABLE_CUDA=ON)"));
#endif
}

/// Typed pointer to a tensor's first element on any device (Tensor::data<T> is CPU-only).
template <typename T>
T* ptr(const Tensor& t) {
  return static_cast<T*>(t.raw_data());
}

// Which element types an elementwise functor is instantiated for (ops/kernels/op_list.h): the
// floating or numeric ones, or all; each includes bfloat16 and float16.
enum class DTypes { kFloating, kNumeric, kAll };

template <DTypes kTypes, typename Fn>
void for_dtype(DType dtype, std::string_view op, const Fn& fn) {
  if constexpr (kTypes == DTypes::kFloating) {
    dispatch_any_floating(dtype, op, fn);
  } else if constexpr (kTypes == DTypes::kNumeric) {
    dispatch_any_numeric(dtype, op, fn);
  } else {
    dispatch_dtype(dtype, fn);
  }
}

}  // namespace tandem::ops::internal
