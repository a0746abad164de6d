// CUDA kernel of the fused optimizer updates: the functors of ops/kernels/optimizer_functors.h
// over a grid-stride loop, one launch per variable. This file is compiled with --fmad=false
// (CMakeLists.txt): nvcc would otherwise contract the functors' products and sums into
// multiply-adds, and the updates would no longer round as the CPU loop and the separate ops do.
#include "tandem/ops/cuda/cuda_kernels.h"
#include "tandem/ops/cuda/device_utils.cuh"

namespace tandem::ops::cuda {

namespace {

template <typename F, typename T, typename... Slots>
__global__ void optimizer_update_kernel(F f, int64_t n, T* w, const T* g, Slots*... slots) {
  for (int64_t i = grid_start<int64_t>(); i < n; i += grid_step<int64_t>())
    f(w[i], g[i], slots[i]...);
}

template <typename F, typename T, typename... Slots>
void launch(const F& f, int64_t n, cudaStream_t stream, T* w, const T* g, Slots*... slots) {
  if (n <= 0) return;
  optimizer_update_kernel<<<blocks_for(n), kThreads, 0, stream>>>(f, n, w, g, slots...);
  TANDEM_CUDA_LAUNCH_CHECK();
}

}  // namespace

template <typename T>
void optimizer_update(const kernels::SgdUpdate<T>& f, int64_t n, T* w, const T* g,
                      cudaStream_t stream) {
  launch(f, n, stream, w, g);
}

template <typename T>
void optimizer_update(const kernels::SgdMomentumUpdate<T>& f, int64_t n, T* w, const T* g,
                      T* velocity, cudaStream_t stream) {
  launch(f, n, stream, w, g, velocity);
}

template <typename T>
void optimizer_update(const kernels::AdamUpdate<T>& f, int64_t n, T* w, const T* g, T* m, T* v,
                      cudaStream_t stream) {
  launch(f, n, stream, w, g, m, v);
}

#define TANDEM_CUDA_OPTIMIZER_UPDATES(T)                                                          \
  template void optimizer_update<T>(const kernels::SgdUpdate<T>&, int64_t, T*, const T*,          \
                                    cudaStream_t);                                                \
  template void optimizer_update<T>(const kernels::SgdMomentumUpdate<T>&, int64_t, T*, const T*,  \
                                    T*, cudaStream_t);                                            \
  template void optimizer_update<T>(const kernels::AdamUpdate<T>&, int64_t, T*, const T*, T*, T*, \
                                    cudaStream_t);

TANDEM_CUDA_OPTIMIZER_UPDATES(float)
TANDEM_CUDA_OPTIMIZER_UPDATES(double)

}  // namespace tandem::ops::cuda
