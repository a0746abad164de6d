// CUDA data movement: axis permutation (tiled through shared memory when it is a batch of
// matrix transposes), one-hot encoding and the label range check it needs.
#include <algorithm>
#include <utility>

#include "tandem/ops/cuda/cuda_kernels.h"
#include "tandem/ops/cuda/device_utils.cuh"
#include "tandem/ops/kernels/op_list.h"
#include "tandem/ops/kernels/transpose_plan.h"

namespace tandem::ops::cuda {

namespace {

constexpr int kMaxTransposeDims = 8;
constexpr int kTile = 32;     // a kTile x kTile tile per block
constexpr int kTileRows = 8;  // threads down the tile (each moves kTile / kTileRows elements)

/// x [batch, rows, cols] -> y [batch, cols, rows], one tile per block (grid-stride over tiles).
/// Reads and writes are both coalesced; the +1 column keeps the transposed read of the tile
/// free of shared-memory bank conflicts.
template <typename E>
__global__ void transpose_tiles_kernel(int64_t batch, int64_t rows, int64_t cols, const E* x,
                                       E* y) {
  __shared__ E tile[kTile][kTile + 1];
  const int64_t row_tiles = (rows + kTile - 1) / kTile, col_tiles = (cols + kTile - 1) / kTile;
  const int64_t tiles = batch * row_tiles * col_tiles;
  for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x) {
    const int64_t b = t / (row_tiles * col_tiles);
    const int64_t r0 = (t / col_tiles) % row_tiles * kTile, c0 = t % col_tiles * kTile;
    const E* in = x + b * rows * cols;
    E* out = y + b * rows * cols;
    for (int j = threadIdx.y; j < kTile; j += kTileRows) {
      const int64_t r = r0 + j, c = c0 + threadIdx.x;
      if (r < rows && c < cols) tile[j][threadIdx.x] = in[r * cols + c];
    }
    __syncthreads();
    for (int j = threadIdx.y; j < kTile; j += kTileRows) {
      const int64_t c = c0 + j, r = r0 + threadIdx.x;
      if (r < rows && c < cols) out[c * rows + r] = tile[threadIdx.x][j];
    }
    // The tile is refilled for the next t.
    __syncthreads();
  }
}

struct PermuteArgs {
  int rank = 0;
  int64_t out_dims[kMaxTransposeDims] = {};
  int64_t src_strides[kMaxTransposeDims] = {};  // input stride of each output axis
};

/// Any permutation: output element i reads the input at its index dotted with src_strides.
template <typename E>
__global__ void transpose_general_kernel(PermuteArgs p, int64_t numel, const E* x, E* y) {
  for (int64_t i = grid_start<int64_t>(); i < numel; i += grid_step<int64_t>()) {
    int64_t rest = i, offset = 0;
#pragma unroll
    for (int k = kMaxTransposeDims - 1; k >= 0; --k) {
      if (k < p.rank) {
        offset += (rest % p.out_dims[k]) * p.src_strides[k];
        rest /= p.out_dims[k];
      }
    }
    y[i] = x[offset];
  }
}

template <typename E>
void transpose_typed(const std::vector<int64_t>& dims, const std::vector<int64_t>& perm, const E* x,
                     E* y, cudaStream_t stream) {
  int64_t numel = 1;
  for (int64_t d : dims) numel *= d;
  if (numel == 0) return;
  const TransposePlan plan = plan_transpose(dims, perm);
  if (plan.out_dims.size() <= 1) {
    copy(y, x, static_cast<size_t>(numel) * sizeof(E), stream);
    return;
  }
  const std::vector<int64_t>& out_dims = plan.out_dims;
  const std::vector<int64_t>& src_strides = plan.src_strides;
  const int device_blocks = tandem::cuda::grid_size(int64_t{1} << 40, kTile * kTileRows);
  auto tiles_launch = [&](int64_t batch, int64_t rows, int64_t cols) {
    const int64_t tiles = batch * ((rows + kTile - 1) / kTile) * ((cols + kTile - 1) / kTile);
    const int blocks = static_cast<int>(std::min<int64_t>(tiles, device_blocks));
    transpose_tiles_kernel<<<blocks, dim3(kTile, kTileRows), 0, stream>>>(batch, rows, cols, x, y);
  };
  if (out_dims.size() == 2) {
    tiles_launch(1, out_dims[1], out_dims[0]);
  } else if (out_dims.size() == 3 && src_strides[0] == out_dims[1] * out_dims[2] &&
             src_strides[1] == 1 && src_strides[2] == out_dims[1]) {
    tiles_launch(out_dims[0], out_dims[2], out_dims[1]);
  } else {
    TANDEM_CHECK(out_dims.size() <= static_cast<size_t>(kMaxTransposeDims),
                 "transpose: the permutation needs ", out_dims.size(),
                 " axes after merging; the CUDA kernel supports ", kMaxTransposeDims);
    PermuteArgs args;
    args.rank = static_cast<int>(out_dims.size());
    for (int k = 0; k < args.rank; ++k) {
      args.out_dims[k] = out_dims[k];
      args.src_strides[k] = src_strides[k];
    }
    transpose_general_kernel<<<blocks_for(numel), kThreads, 0, stream>>>(args, numel, x, y);
  }
  TANDEM_CUDA_LAUNCH_CHECK();
}

template <typename L>
__global__ void first_invalid_label_kernel(const L* labels, int64_t n, int64_t depth,
                                           unsigned long long* first) {
  for (int64_t i = grid_start<int64_t>(); i < n; i += grid_step<int64_t>()) {
    const int64_t label = static_cast<int64_t>(labels[i]);
    // The minimum is the same whatever order the atomics land in.
    if (label < 0 || label >= depth) atomicMin(first, static_cast<unsigned long long>(i));
  }
}

template <typename L, typename T>
__global__ void one_hot_kernel(const L* labels, int64_t n, int64_t depth, T* y) {
  const int64_t total = n * depth;
  for (int64_t j = grid_start<int64_t>(); j < total; j += grid_step<int64_t>())
    y[j] = static_cast<int64_t>(labels[j / depth]) == j % depth ? T(1) : T(0);
}

}  // namespace

void transpose(size_t element_size, const std::vector<int64_t>& dims,
               const std::vector<int64_t>& perm, const void* x, void* y, cudaStream_t stream) {
  switch (element_size) {
    case 1:
      return transpose_typed(dims, perm, static_cast<const uint8_t*>(x), static_cast<uint8_t*>(y),
                             stream);
    case 2:  // bfloat16, float16
      return transpose_typed(dims, perm, static_cast<const uint16_t*>(x), static_cast<uint16_t*>(y),
                             stream);
    case 4:
      return transpose_typed(dims, perm, static_cast<const uint32_t*>(x), static_cast<uint32_t*>(y),
                             stream);
    case 8:
      return transpose_typed(dims, perm, static_cast<const uint64_t*>(x), static_cast<uint64_t*>(y),
                             stream);
    default:
      TANDEM_THROW("transpose: unsupported element size ", element_size);
  }
}

template <typename L>
int64_t first_invalid_label(const L* labels, int64_t n, int64_t depth, cudaStream_t stream) {
  if (n <= 0) return -1;
  Scratch first(sizeof(unsigned long long));
  auto* device_first = static_cast<unsigned long long*>(first.data());
  // All bits set: no invalid label seen.
  TANDEM_CUDA_CHECK(cudaMemsetAsync(device_first, 0xff, sizeof(unsigned long long), stream));
  first_invalid_label_kernel<<<blocks_for(n), kThreads, 0, stream>>>(labels, n, depth,
                                                                     device_first);
  TANDEM_CUDA_LAUNCH_CHECK();
  unsigned long long host_first = 0;
  TANDEM_CUDA_CHECK(cudaMemcpyAsync(&host_first, device_first, sizeof(host_first),
                                    cudaMemcpyDeviceToHost, stream));
  // The caller raises or proceeds on this answer, so the host must wait for it: one stream
  // synchronisation per checked label tensor (this thread's stream only, not the device).
  TANDEM_CUDA_CHECK(cudaStreamSynchronize(stream));
  return host_first == ~0ull ? -1 : static_cast<int64_t>(host_first);
}

template <typename L, typename T>
void one_hot(const L* labels, int64_t n, int64_t depth, T* y, cudaStream_t stream) {
  const int64_t total = n * depth;
  if (total <= 0) return;
  one_hot_kernel<<<blocks_for(total), kThreads, 0, stream>>>(labels, n, depth, y);
  TANDEM_CUDA_LAUNCH_CHECK();
}

void copy(void* dst, const void* src, size_t n, cudaStream_t stream) {
  if (n == 0 || dst == src) return;
  TANDEM_CUDA_CHECK(cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToDevice, stream));
}

#define TANDEM_CUDA_LABELS(F, L) \
  template int64_t first_invalid_label<L>(const L*, int64_t, int64_t, cudaStream_t);
#define TANDEM_CUDA_ONE_HOT(L, T) \
  template void one_hot<L, T>(const L*, int64_t, int64_t, T*, cudaStream_t);
TANDEM_CUDA_LABELS(_, int32_t)
TANDEM_CUDA_LABELS(_, int64_t)
TANDEM_NUMERIC_TYPES(TANDEM_CUDA_ONE_HOT, int32_t)
TANDEM_NUMERIC_TYPES(TANDEM_CUDA_ONE_HOT, int64_t)

}  // namespace tandem::ops::cuda
