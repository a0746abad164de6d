// CUDA reductions (sum, max with argmax, the argmax scatter) and the softmax family (softmax,
// log-softmax, fused sparse softmax cross-entropy forward and backward), for x viewed as
// [outer, n, inner]. Every reduction combines in a fixed order: results are run-to-run stable.
#include <algorithm>
#include <limits>
#include <type_traits>

#include "tandem/ops/cuda/cuda_kernels.h"
#include "tandem/ops/cuda/device_utils.cuh"
#include "tandem/ops/kernels/op_list.h"

namespace tandem::ops::cuda {

namespace math = kernels::math;

namespace {

// ---- reduction policies: the accumulator, how an element enters it, how two combine --------

/// Lane `offset` below this one (shuffles of 1-byte types go through int).
template <typename V>
__device__ __forceinline__ V shfl_down(V value, int offset) {
  if constexpr (sizeof(V) < sizeof(int)) {
    return static_cast<V>(__shfl_down_sync(0xffffffffu, static_cast<int>(value), offset));
  } else {
    return __shfl_down_sync(0xffffffffu, value, offset);
  }
}

/// Sums in double (floating, the 16-bit types too) or int64 (integers), as the CPU kernel.
template <typename T>
struct SumOp {
  using Elem = T;
  using Acc = std::conditional_t<std::is_floating_point_v<compute_type_t<T>>, double, int64_t>;
  __device__ static Acc identity() { return Acc(0); }
  __device__ static Acc from(T x, int64_t /*k*/) {
    return static_cast<Acc>(static_cast<compute_type_t<T>>(x));
  }
  __device__ static Acc combine(Acc a, Acc b) { return a + b; }
  __device__ static Acc shuffle_down(Acc a, int offset) { return shfl_down(a, offset); }
  __device__ static void store(Acc a, T* y, int64_t* /*argmax*/, int64_t at) {
    y[at] = static_cast<T>(a);
  }
};

/// The maximum and the first index reaching it. Matches the CPU's sequential scan (start at
/// element 0, replace on strictly greater) for any order of combination, NaN included: a NaN at
/// k = 0 beats everything, a NaN elsewhere loses to everything (the scan never picks it).
template <typename T>
struct MaxOp {
  using Elem = T;
  using Value = compute_type_t<T>;  // float for the 16-bit types (exact)
  struct Acc {
    Value value;
    int64_t index;  // kEmpty: nothing accumulated yet
  };
  static constexpr int64_t kEmpty = std::numeric_limits<int64_t>::max();
  __device__ static Acc identity() { return {Value(0), kEmpty}; }
  __device__ static Acc from(T x, int64_t k) { return {static_cast<Value>(x), k}; }
  __device__ static bool wins_always(const Acc& a) { return a.index == 0 && a.value != a.value; }
  __device__ static bool loses_always(const Acc& a) {
    return a.index == kEmpty || (a.value != a.value && a.index != 0);
  }
  __device__ static Acc combine(Acc a, Acc b) {
    if (wins_always(a)) return a;
    if (wins_always(b)) return b;
    if (loses_always(b)) return a;
    if (loses_always(a)) return b;
    if (b.value > a.value || (b.value == a.value && b.index < a.index)) return b;
    return a;
  }
  __device__ static Acc shuffle_down(Acc a, int offset) {
    return {shfl_down(a.value, offset), shfl_down(a.index, offset)};
  }
  __device__ static void store(Acc a, T* y, int64_t* argmax, int64_t at) {
    if (y != nullptr) y[at] = static_cast<T>(a.value);
    if (argmax != nullptr) argmax[at] = a.index;
  }
};

constexpr int kReduceThreads = 256;
constexpr int kWarps = kReduceThreads / 32;
/// Elements of one row a block reduces in the first pass of a two-pass row reduction.
constexpr int64_t kRowChunk = 16384;
/// Rows below which a long row is split across blocks (fewer rows leave SMs idle).
constexpr int64_t kSplitRowsBelow = 128;

/// Combines the block's per-thread accumulators in thread order; thread 0 returns the total.
/// Ends with a barrier, so the block can call it again in its next iteration.
template <typename Op>
__device__ typename Op::Acc block_reduce(typename Op::Acc value) {
  using Acc = typename Op::Acc;
  __shared__ Acc warp_totals[kWarps];
  for (int offset = 16; offset > 0; offset >>= 1)
    value = Op::combine(value, Op::shuffle_down(value, offset));
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) warp_totals[warp] = value;
  __syncthreads();
  Acc total = Op::identity();
  if (threadIdx.x == 0) {
    for (int w = 0; w < kWarps; ++w) total = Op::combine(total, warp_totals[w]);
  }
  // The next call overwrites warp_totals: everyone waits until thread 0 has read them.
  __syncthreads();
  return total;
}

/// Rows (inner == 1), `chunks` blocks-worth per row: job j reduces chunk j % chunks of row
/// j / chunks. With chunks == 1 it writes the result; otherwise an accumulator per chunk.
template <typename Op>
__global__ void reduce_rows_kernel(const typename Op::Elem* x, int64_t rows, int64_t n,
                                   int64_t chunks, typename Op::Acc* partial, typename Op::Elem* y,
                                   int64_t* argmax) {
  const int64_t chunk = chunks == 1 ? n : kRowChunk;
  for (int64_t job = blockIdx.x; job < rows * chunks; job += gridDim.x) {
    const int64_t row = job / chunks, c = job % chunks;
    const int64_t begin = c * chunk, end = begin + chunk < n ? begin + chunk : n;
    const typename Op::Elem* in = x + row * n;
    typename Op::Acc acc = Op::identity();
    for (int64_t k = begin + threadIdx.x; k < end; k += blockDim.x)
      acc = Op::combine(acc, Op::from(in[k], k));
    acc = block_reduce<Op>(acc);
    if (threadIdx.x == 0) {
      if (chunks == 1) {
        Op::store(acc, y, argmax, row);
      } else {
        partial[job] = acc;
      }
    }
  }
}

/// Second pass: row r combines its `chunks` accumulators in order.
template <typename Op>
__global__ void finish_rows_kernel(const typename Op::Acc* partial, int64_t rows, int64_t chunks,
                                   typename Op::Elem* y, int64_t* argmax) {
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    typename Op::Acc acc = Op::identity();
    for (int64_t c = threadIdx.x; c < chunks; c += blockDim.x)
      acc = Op::combine(acc, partial[row * chunks + c]);
    acc = block_reduce<Op>(acc);
    if (threadIdx.x == 0) Op::store(acc, y, argmax, row);
  }
}

constexpr int kColumnTile = 32;  // columns per block (threadIdx.x), coalesced reads
constexpr int kColumnSplit = 8;  // threads down each column (threadIdx.y)
/// Column blocks wanted before n is split into chunks: a bias gradient ([batch, features]
/// summed over the batch) has only features / 32 column tiles, too few blocks to keep the
/// memory system busy. A constant (not the SM count) keeps the result the same on every GPU.
constexpr int64_t kColumnBlocksWanted = 1024;
constexpr int64_t kMinChunkRows = 64;

/// inner > 1: a block takes 32 adjacent columns of one outer slice and rows [c * chunk_rows,
/// (c + 1) * chunk_rows) of n; its 8 thread rows stride down them, then combine in thread-row
/// order. With one chunk it writes the result, otherwise an accumulator per (chunk, column).
template <typename Op>
__global__ void reduce_columns_kernel(const typename Op::Elem* x, int64_t outer, int64_t n,
                                      int64_t inner, int64_t chunks, int64_t chunk_rows,
                                      typename Op::Acc* partial, typename Op::Elem* y,
                                      int64_t* argmax) {
  using Acc = typename Op::Acc;
  __shared__ Acc rows[kColumnSplit][kColumnTile];
  const int64_t tiles = (inner + kColumnTile - 1) / kColumnTile;
  for (int64_t job = blockIdx.x; job < chunks * outer * tiles; job += gridDim.x) {
    const int64_t c = job / (outer * tiles), o = (job / tiles) % outer;
    const int64_t i = (job % tiles) * kColumnTile + threadIdx.x;
    const int64_t begin = c * chunk_rows, end = begin + chunk_rows < n ? begin + chunk_rows : n;
    Acc acc = Op::identity();
    if (i < inner) {
      const typename Op::Elem* in = x + o * n * inner + i;
      for (int64_t k = begin + threadIdx.y; k < end; k += kColumnSplit)
        acc = Op::combine(acc, Op::from(in[k * inner], k));
    }
    rows[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.y == 0 && i < inner) {
      for (int r = 1; r < kColumnSplit; ++r) acc = Op::combine(acc, rows[r][threadIdx.x]);
      if (chunks == 1) {
        Op::store(acc, y, argmax, o * inner + i);
      } else {
        partial[(c * outer + o) * inner + i] = acc;
      }
    }
    // `rows` is rewritten by the next job.
    __syncthreads();
  }
}

/// Second pass of a split column reduction: column (o, i) combines its chunks in order.
template <typename Op>
__global__ void finish_columns_kernel(const typename Op::Acc* partial, int64_t outer, int64_t inner,
                                      int64_t chunks, typename Op::Elem* y, int64_t* argmax) {
  for (int64_t j = grid_start<int64_t>(); j < outer * inner; j += grid_step<int64_t>()) {
    typename Op::Acc acc = Op::identity();
    for (int64_t c = 0; c < chunks; ++c) acc = Op::combine(acc, partial[c * outer * inner + j]);
    Op::store(acc, y, argmax, j);
  }
}

template <typename Op>
void reduce(const typename Op::Elem* x, int64_t outer, int64_t n, int64_t inner,
            typename Op::Elem* y, int64_t* argmax, cudaStream_t stream) {
  if (outer <= 0 || inner <= 0) return;
  const int device_blocks = tandem::cuda::grid_size(int64_t{1} << 40, kReduceThreads);
  using Acc = typename Op::Acc;
  if (inner > 1) {
    const int64_t tile_jobs = outer * ((inner + kColumnTile - 1) / kColumnTile);
    int64_t chunks = 1;
    if (tile_jobs < kColumnBlocksWanted && n >= 2 * kMinChunkRows) {
      chunks = std::min((kColumnBlocksWanted + tile_jobs - 1) / tile_jobs, n / kMinChunkRows);
    }
    const int64_t chunk_rows = (n + chunks - 1) / chunks;
    const int64_t jobs = tile_jobs * chunks;
    const int blocks = static_cast<int>(jobs < device_blocks ? jobs : device_blocks);
    const dim3 threads(kColumnTile, kColumnSplit);
    if (chunks == 1) {
      reduce_columns_kernel<Op>
          <<<blocks, threads, 0, stream>>>(x, outer, n, inner, 1, n, nullptr, y, argmax);
      TANDEM_CUDA_LAUNCH_CHECK();
      return;
    }
    Scratch partial(static_cast<size_t>(chunks * outer * inner) * sizeof(Acc));
    reduce_columns_kernel<Op>
        <<<blocks, threads, 0, stream>>>(x, outer, n, inner, chunks, chunk_rows,
                                         static_cast<Acc*>(partial.data()), nullptr, nullptr);
    TANDEM_CUDA_LAUNCH_CHECK();
    finish_columns_kernel<Op><<<blocks_for(outer * inner), kThreads, 0, stream>>>(
        static_cast<const Acc*>(partial.data()), outer, inner, chunks, y, argmax);
    TANDEM_CUDA_LAUNCH_CHECK();
    return;
  }
  const int64_t chunks =
      (outer < kSplitRowsBelow && n > kRowChunk) ? (n + kRowChunk - 1) / kRowChunk : 1;
  const int64_t jobs = outer * chunks;
  const int blocks = static_cast<int>(jobs < device_blocks ? jobs : device_blocks);
  if (chunks == 1) {
    reduce_rows_kernel<Op>
        <<<blocks, kReduceThreads, 0, stream>>>(x, outer, n, 1, nullptr, y, argmax);
    TANDEM_CUDA_LAUNCH_CHECK();
    return;
  }
  Scratch partial(static_cast<size_t>(jobs) * sizeof(Acc));
  reduce_rows_kernel<Op><<<blocks, kReduceThreads, 0, stream>>>(
      x, outer, n, chunks, static_cast<Acc*>(partial.data()), nullptr, nullptr);
  TANDEM_CUDA_LAUNCH_CHECK();
  const int finish_blocks = static_cast<int>(outer < device_blocks ? outer : device_blocks);
  finish_rows_kernel<Op><<<finish_blocks, kReduceThreads, 0, stream>>>(
      static_cast<const Acc*>(partial.data()), outer, chunks, y, argmax);
  TANDEM_CUDA_LAUNCH_CHECK();
}

template <typename T>
__global__ void scatter_argmax_kernel(const T* g, const int64_t* argmax, int64_t outer, int64_t n,
                                      int64_t inner, T* dx) {
  const int64_t total = outer * n * inner;
  for (int64_t j = grid_start<int64_t>(); j < total; j += grid_step<int64_t>()) {
    const int64_t i = j % inner, k = (j / inner) % n, o = j / (inner * n);
    const int64_t at = o * inner + i;
    dx[j] = argmax[at] == k ? g[at] : T(0);
  }
}

// ---- softmax family ------------------------------------------------------------------------

constexpr int kRowWarps = 4;  // rows (one warp each) per block of the row kernels

/// Max and sum of exp(x - max) of one row, computed by a warp; every lane gets both. The
/// maximum only keeps exp in range, so its NaN handling does not matter: a NaN anywhere makes
/// the sum NaN, as on the CPU.
template <typename T>
__device__ void row_max_sum(const T* in, int64_t n, T* max_out, T* sum_out) {
  const int lane = threadIdx.x % 32;
  T m = -std::numeric_limits<T>::infinity();
  for (int64_t k = lane; k < n; k += 32) m = in[k] > m ? in[k] : m;
  m = warp_max(m);
  T s = 0;
  for (int64_t k = lane; k < n; k += 32) s += math::exp(in[k] - m);
  *max_out = m;
  *sum_out = warp_sum(s);
}

template <typename T>
__global__ void softmax_rows_kernel(const T* x, int64_t rows, int64_t n, bool log, T* y) {
  const int64_t warps = static_cast<int64_t>(gridDim.x) * kRowWarps;
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * kRowWarps + threadIdx.x / 32; r < rows;
       r += warps) {
    const T* in = x + r * n;
    T* out = y + r * n;
    T m, s;
    row_max_sum(in, n, &m, &s);
    const int lane = threadIdx.x % 32;
    if (log) {
      const T shift = m + math::log(s);
      for (int64_t k = lane; k < n; k += 32) out[k] = in[k] - shift;
    } else {
      const T inv = T(1) / s;
      for (int64_t k = lane; k < n; k += 32) out[k] = math::exp(in[k] - m) * inv;
    }
  }
}

/// inner > 1: one thread per (o, i) column, three passes down n (coalesced across i).
template <typename T>
__global__ void softmax_columns_kernel(const T* x, int64_t outer, int64_t n, int64_t inner,
                                       bool log, T* y) {
  for (int64_t j = grid_start<int64_t>(); j < outer * inner; j += grid_step<int64_t>()) {
    const int64_t o = j / inner, i = j % inner;
    const T* in = x + o * n * inner + i;
    T* out = y + o * n * inner + i;
    T m = in[0];
    for (int64_t k = 1; k < n; ++k) m = in[k * inner] > m ? in[k * inner] : m;
    T s = 0;
    for (int64_t k = 0; k < n; ++k) s += math::exp(in[k * inner] - m);
    if (log) {
      const T shift = m + math::log(s);
      for (int64_t k = 0; k < n; ++k) out[k * inner] = in[k * inner] - shift;
    } else {
      const T inv = T(1) / s;
      for (int64_t k = 0; k < n; ++k) out[k * inner] = math::exp(in[k * inner] - m) * inv;
    }
  }
}

template <typename T, typename L>
__global__ void xent_forward_kernel(const T* logits, const L* labels, int64_t batch,
                                    int64_t classes, T* loss) {
  const int64_t warps = static_cast<int64_t>(gridDim.x) * kRowWarps;
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * kRowWarps + threadIdx.x / 32; r < batch;
       r += warps) {
    const T* z = logits + r * classes;
    T m, s;
    row_max_sum(z, classes, &m, &s);
    if (threadIdx.x % 32 == 0) {
      const int64_t label = static_cast<int64_t>(labels[r]);
      loss[r] = (label >= 0 && label < classes) ? math::log(s) + m - z[label]
                                                : std::numeric_limits<T>::quiet_NaN();
    }
  }
}

template <typename T, typename L>
__global__ void xent_backward_kernel(const T* logits, const L* labels, const T* grad_loss,
                                     int64_t batch, int64_t classes, T* dlogits) {
  const int64_t warps = static_cast<int64_t>(gridDim.x) * kRowWarps;
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * kRowWarps + threadIdx.x / 32; r < batch;
       r += warps) {
    const T* z = logits + r * classes;
    T* dz = dlogits + r * classes;
    T m, s;
    row_max_sum(z, classes, &m, &s);
    const T inv = T(1) / s, g = grad_loss[r];
    const int64_t label = static_cast<int64_t>(labels[r]);
    for (int64_t k = threadIdx.x % 32; k < classes; k += 32) {
      const T p = math::exp(z[k] - m) * inv;
      dz[k] = g * (k == label ? p - T(1) : p);
    }
  }
}

int row_blocks(int64_t rows) {
  const int64_t wanted = (rows + kRowWarps - 1) / kRowWarps;
  const int cap = tandem::cuda::grid_size(int64_t{1} << 40, kRowWarps * 32);
  return static_cast<int>(wanted < cap ? (wanted > 0 ? wanted : 1) : cap);
}

}  // namespace

template <typename T>
void sum(const T* x, int64_t outer, int64_t n, int64_t inner, T* y, cudaStream_t stream) {
  reduce<SumOp<T>>(x, outer, n, inner, y, nullptr, stream);
}

template <typename T>
void max(const T* x, int64_t outer, int64_t n, int64_t inner, T* y, int64_t* argmax,
         cudaStream_t stream) {
  TANDEM_CHECK(n >= 1, "max: cannot reduce an empty axis");
  reduce<MaxOp<T>>(x, outer, n, inner, y, argmax, stream);
}

template <typename T>
void scatter_argmax(const T* g, const int64_t* argmax, int64_t outer, int64_t n, int64_t inner,
                    T* dx, cudaStream_t stream) {
  const int64_t total = outer * n * inner;
  if (total <= 0) return;
  scatter_argmax_kernel<<<blocks_for(total), kThreads, 0, stream>>>(g, argmax, outer, n, inner, dx);
  TANDEM_CUDA_LAUNCH_CHECK();
}

template <typename T>
void softmax(const T* x, int64_t outer, int64_t n, int64_t inner, bool log, T* y,
             cudaStream_t stream) {
  if (outer <= 0 || inner <= 0 || n <= 0) return;
  if (inner == 1) {
    softmax_rows_kernel<<<row_blocks(outer), kRowWarps * 32, 0, stream>>>(x, outer, n, log, y);
  } else {
    softmax_columns_kernel<<<blocks_for(outer * inner), kThreads, 0, stream>>>(x, outer, n, inner,
                                                                               log, y);
  }
  TANDEM_CUDA_LAUNCH_CHECK();
}

template <typename T, typename L>
void sparse_softmax_cross_entropy(const T* logits, const L* labels, int64_t batch, int64_t classes,
                                  T* loss, cudaStream_t stream) {
  if (batch <= 0) return;
  xent_forward_kernel<<<row_blocks(batch), kRowWarps * 32, 0, stream>>>(logits, labels, batch,
                                                                        classes, loss);
  TANDEM_CUDA_LAUNCH_CHECK();
}

template <typename T, typename L>
void sparse_softmax_cross_entropy_backward(const T* logits, const L* labels, const T* grad_loss,
                                           int64_t batch, int64_t classes, T* dlogits,
                                           cudaStream_t stream) {
  if (batch <= 0 || classes <= 0) return;
  xent_backward_kernel<<<row_blocks(batch), kRowWarps * 32, 0, stream>>>(logits, labels, grad_loss,
                                                                         batch, classes, dlogits);
  TANDEM_CUDA_LAUNCH_CHECK();
}

#define TANDEM_CUDA_REDUCE(F, T)                                               \
  template void sum<T>(const T*, int64_t, int64_t, int64_t, T*, cudaStream_t); \
  template void max<T>(const T*, int64_t, int64_t, int64_t, T*, int64_t*, cudaStream_t);
#define TANDEM_CUDA_SCATTER(F, T)                                                          \
  template void scatter_argmax<T>(const T*, const int64_t*, int64_t, int64_t, int64_t, T*, \
                                  cudaStream_t);
#define TANDEM_CUDA_FLOATING(F, T)                                                          \
  TANDEM_CUDA_SCATTER(F, T)                                                                 \
  template void softmax<T>(const T*, int64_t, int64_t, int64_t, bool, T*, cudaStream_t);    \
  template void sparse_softmax_cross_entropy<T, int32_t>(const T*, const int32_t*, int64_t, \
                                                         int64_t, T*, cudaStream_t);        \
  template void sparse_softmax_cross_entropy<T, int64_t>(const T*, const int64_t*, int64_t, \
                                                         int64_t, T*, cudaStream_t);        \
  template void sparse_softmax_cross_entropy_backward<T, int32_t>(                          \
      const T*, const int32_t*, const T*, int64_t, int64_t, T*, cudaStream_t);              \
  template void sparse_softmax_cross_entropy_backward<T, int64_t>(                          \
      const T*, const int64_t*, const T*, int64_t, int64_t, T*, cudaStream_t);
TANDEM_ANY_NUMERIC_TYPES(TANDEM_CUDA_REDUCE, _)
TANDEM_FLOATING_TYPES(TANDEM_CUDA_FLOATING, _)
TANDEM_HALF_TYPES(TANDEM_CUDA_SCATTER, _)

}  // namespace tandem::ops::cuda
