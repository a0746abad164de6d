// CPU axis permutation and one-hot encoding. A transpose first merges axes that stay adjacent
// (a matrix transpose of [N, H, W, C] -> [N, C, H, W] is a batch of [H*W, C] transposes).
#include "tandem/ops/cpu/shape_ops.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "tandem/core/error.h"
#include "tandem/ops/cpu/parallel.h"
#include "tandem/ops/kernels/op_list.h"
#include "tandem/ops/kernels/transpose_plan.h"

namespace tandem::ops::cpu {

namespace {

// Square tiles keep both the reads and the writes of a 2-D transpose within cache lines.
constexpr int64_t kTile = 32;

// A batch of matrix transposes: x [batch, rows, cols] -> y [batch, cols, rows].
template <typename E>
void transpose_matrices(int64_t batch, int64_t rows, int64_t cols, const E* x, E* y) {
  const int64_t row_tiles = (rows + kTile - 1) / kTile, col_tiles = (cols + kTile - 1) / kTile;
  const int64_t tiles = batch * row_tiles * col_tiles;
  parallel_for(tiles, std::max<int64_t>(1, kElementwiseGrain / (kTile * kTile)),
               [&](int64_t begin, int64_t end) {
                 for (int64_t t = begin; t < end; ++t) {
                   const int64_t b = t / (row_tiles * col_tiles);
                   const int64_t r0 = (t / col_tiles) % row_tiles * kTile;
                   const int64_t c0 = t % col_tiles * kTile;
                   const E* in = x + b * rows * cols;
                   E* out = y + b * rows * cols;
                   const int64_t r1 = std::min(rows, r0 + kTile), c1 = std::min(cols, c0 + kTile);
                   for (int64_t c = c0; c < c1; ++c)
                     for (int64_t r = r0; r < r1; ++r) out[c * rows + r] = in[r * cols + c];
                 }
               });
}

// Any permutation: walks the output in order, an odometer over its outer axes and a strided
// read along its last axis.
template <typename E>
void transpose_general(const std::vector<int64_t>& out_dims,
                       const std::vector<int64_t>& src_strides, int64_t numel, const E* x, E* y) {
  const size_t rank = out_dims.size();
  const int64_t inner = out_dims.back(), inner_stride = src_strides.back();
  parallel_for(numel, kElementwiseGrain, [&](int64_t begin, int64_t end) {
    std::vector<int64_t> index(rank);
    int64_t rest = begin, offset = 0;
    for (size_t k = rank; k-- > 0;) {
      index[k] = rest % out_dims[k];
      rest /= out_dims[k];
      offset += index[k] * src_strides[k];
    }
    int64_t i = begin;
    while (i < end) {
      const int64_t n = std::min(inner - index[rank - 1], end - i);
      for (int64_t j = 0; j < n; ++j) y[i + j] = x[offset + j * inner_stride];
      i += n;
      offset += n * inner_stride;
      index[rank - 1] += n;
      for (size_t k = rank - 1; k > 0 && index[k] == out_dims[k]; --k) {
        offset -= out_dims[k] * src_strides[k];
        index[k] = 0;
        ++index[k - 1];
        offset += src_strides[k - 1];
      }
    }
  });
}

template <typename E>
void transpose_typed(const std::vector<int64_t>& dims, const std::vector<int64_t>& perm, const E* x,
                     E* y) {
  int64_t numel = 1;
  for (int64_t d : dims) numel *= d;
  if (numel == 0) return;
  const TransposePlan plan = plan_transpose(dims, perm);
  if (plan.out_dims.size() <= 1) {
    std::memcpy(y, x, static_cast<size_t>(numel) * sizeof(E));
    return;
  }
  const std::vector<int64_t>& out_dims = plan.out_dims;
  const std::vector<int64_t>& src_strides = plan.src_strides;
  // [A, B] -> [B, A] under any batch prefix is a batch of matrix transposes.
  if (out_dims.size() == 2) {
    transpose_matrices(1, out_dims[1], out_dims[0], x, y);
  } else if (out_dims.size() == 3 && src_strides[0] == out_dims[1] * out_dims[2] &&
             src_strides[1] == 1 && src_strides[2] == out_dims[1]) {
    transpose_matrices(out_dims[0], out_dims[2], out_dims[1], x, y);
  } else {
    transpose_general(out_dims, src_strides, numel, x, y);
  }
}

}  // namespace

void transpose(size_t element_size, const std::vector<int64_t>& dims,
               const std::vector<int64_t>& perm, const void* x, void* y) {
  switch (element_size) {
    case 1:
      return transpose_typed(dims, perm, static_cast<const uint8_t*>(x), static_cast<uint8_t*>(y));
    case 2:  // bfloat16, float16
      return transpose_typed(dims, perm, static_cast<const uint16_t*>(x),
                             static_cast<uint16_t*>(y));
    case 4:
      return transpose_typed(dims, perm, static_cast<const uint32_t*>(x),
                             static_cast<uint32_t*>(y));
    case 8:
      return transpose_typed(dims, perm, static_cast<const uint64_t*>(x),
                             static_cast<uint64_t*>(y));
    default:
      TANDEM_THROW("transpose: unsupported element size ", element_size);
  }
}

template <typename L>
int64_t first_invalid_label(const L* labels, int64_t n, int64_t depth) {
  for (int64_t i = 0; i < n; ++i)
    if (labels[i] < 0 || static_cast<int64_t>(labels[i]) >= depth) return i;
  return -1;
}

template <typename L, typename T>
void one_hot(const L* labels, int64_t n, int64_t depth, T* y) {
  parallel_for(n, std::max<int64_t>(1, kElementwiseGrain / std::max<int64_t>(depth, 1)),
               [&](int64_t begin, int64_t end) {
                 std::memset(static_cast<void*>(y + begin * depth), 0,
                             static_cast<size_t>((end - begin) * depth) * sizeof(T));
                 for (int64_t i = begin; i < end; ++i) y[i * depth + labels[i]] = T(1);
               });
}

#define TANDEM_LABELS(F, L) template int64_t first_invalid_label<L>(const L*, int64_t, int64_t);
#define TANDEM_ONE_HOT(L, T) template void one_hot<L, T>(const L*, int64_t, int64_t, T*);
TANDEM_LABELS(_, int32_t)
TANDEM_LABELS(_, int64_t)
TANDEM_NUMERIC_TYPES(TANDEM_ONE_HOT, int32_t)
TANDEM_NUMERIC_TYPES(TANDEM_ONE_HOT, int64_t)

}  // namespace tandem::ops::cpu
