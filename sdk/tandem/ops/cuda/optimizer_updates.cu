// CUDA kernel of the fused optimizer updates: the functors of ops/kernels/optimizer_functors.h
// applied to all variables of a step in one multi-tensor launch (as PyTorch's
// multi_tensor_apply): a table of pointers and sizes passed as kernel arguments, each block
// updating one chunk of one variable. This file is compiled with --fmad=false (CMakeLists.txt):
// nvcc would otherwise contract the functors' products and sums into multiply-adds, and the
// updates would no longer round as the CPU loop and the separate ops do.
#include <algorithm>
#include <utility>

#include "tandem/ops/cuda/cuda_kernels.h"
#include "tandem/ops/cuda/device_utils.cuh"

namespace tandem::ops::cuda {

namespace {

/// Up to kMaxUpdateTensors variables with kSlots slots each. Variable i owns the chunks
/// [first_chunk[i], first_chunk[i + 1]) of the launch.
template <typename T, int kSlots>
struct TensorTable {
  T* variables[kMaxUpdateTensors];
  const T* gradients[kMaxUpdateTensors];
  T* slots[kSlots > 0 ? kSlots : 1][kMaxUpdateTensors];
  int64_t numel[kMaxUpdateTensors];
  int64_t first_chunk[kMaxUpdateTensors + 1];
  int count;
};
static_assert(sizeof(TensorTable<double, kMaxUpdateSlots>) + 64 <= 4096,
              "the table and a functor must fit the kernel argument space");

/// f over elements [first, end) of variable `index` of `table`, blockDim.x apart.
template <typename F, typename T, int kSlots, size_t... S>
__device__ __forceinline__ void update_chunk(const F& f, T* w, const T* g,
                                             const TensorTable<T, kSlots>& table, int index,
                                             int64_t first, int64_t end,
                                             std::index_sequence<S...>) {
  for (int64_t i = first; i < end; i += blockDim.x) f(w[i], g[i], table.slots[S][index][i]...);
}

template <typename F, typename T, int kSlots>
__global__ void multi_tensor_update_kernel(F f, TensorTable<T, kSlots> table) {
  const int64_t chunks = table.first_chunk[table.count];
  for (int64_t chunk = blockIdx.x; chunk < chunks; chunk += gridDim.x) {
    // The variable owning this chunk: the last whose first chunk is <= chunk.
    int lo = 0, hi = table.count - 1;
    while (lo < hi) {
      const int mid = (lo + hi + 1) / 2;
      if (table.first_chunk[mid] <= chunk) {
        lo = mid;
      } else {
        hi = mid - 1;
      }
    }
    const int64_t begin = (chunk - table.first_chunk[lo]) * kUpdateChunk;
    const int64_t end = min(begin + kUpdateChunk, table.numel[lo]);
    T* w = table.variables[lo];
    const T* g = table.gradients[lo];
    update_chunk(f, w, g, table, lo, begin + threadIdx.x, end, std::make_index_sequence<kSlots>{});
  }
}

/// Launches `f` over the variables of `operands` in groups of kMaxUpdateTensors; variables
/// without elements are left out. Returns the launches issued.
template <int kSlots, typename F, typename T>
int launch(const F& f, const std::vector<UpdateOperands<T>>& operands, cudaStream_t stream) {
  int launches = 0;
  TensorTable<T, kSlots> table{};
  auto flush = [&] {
    if (table.count == 0) return;
    // One block per chunk up to a full device; beyond that the blocks loop over the chunks.
    const int64_t chunks = table.first_chunk[table.count];
    const int64_t resident = int64_t{tandem::cuda::multiprocessor_count()} * (2048 / kThreads);
    const int blocks = static_cast<int>(std::min(chunks, resident));
    multi_tensor_update_kernel<<<blocks, kThreads, 0, stream>>>(f, table);
    TANDEM_CUDA_LAUNCH_CHECK();
    ++launches;
    table = TensorTable<T, kSlots>{};
  };
  for (const UpdateOperands<T>& o : operands) {
    if (o.numel <= 0) continue;
    const int i = table.count;
    table.variables[i] = o.variable;
    table.gradients[i] = o.gradient;
    for (int s = 0; s < kSlots; ++s) table.slots[s][i] = o.slots[s];
    table.numel[i] = o.numel;
    table.first_chunk[i + 1] = table.first_chunk[i] + (o.numel + kUpdateChunk - 1) / kUpdateChunk;
    if (++table.count == kMaxUpdateTensors) flush();
  }
  flush();
  return launches;
}

}  // namespace

template <typename F, typename T>
int optimizer_update(const F& f, const std::vector<UpdateOperands<T>>& operands,
                     cudaStream_t stream) {
  static_assert(F::kSlots <= kMaxUpdateSlots, "raise kMaxUpdateSlots (cuda_kernels.h)");
  return launch<F::kSlots>(f, operands, stream);
}

#define TANDEM_CUDA_OPTIMIZER_UPDATE(Rule)                                                   \
  template int optimizer_update<kernels::Rule<float>, float>(                                \
      const kernels::Rule<float>&, const std::vector<UpdateOperands<float>>&, cudaStream_t); \
  template int optimizer_update<kernels::Rule<double>, double>(                              \
      const kernels::Rule<double>&, const std::vector<UpdateOperands<double>>&, cudaStream_t);
TANDEM_FUSED_UPDATE_RULES(TANDEM_CUDA_OPTIMIZER_UPDATE)
#undef TANDEM_CUDA_OPTIMIZER_UPDATE

}  // namespace tandem::ops::cuda
