// Fused attention on the CPU (see attention.h). Each tile product is an outer loop over rows and
// the shared dimension around an inner loop over contiguous columns: the compiler vectorizes the
// inner loop without reordering any sum, so every build computes the same bits.
#include "tandem/ops/cpu/attention.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "tandem/core/threading.h"
#include "tandem/ops/cpu/cpu_clones.h"
#include "tandem/tensor/philox.h"

namespace tandem::ops::cpu {
namespace {

constexpr int64_t kRows = 64;  // query rows per tile
constexpr int64_t kCols = 64;  // keys per tile

/// What the sums run in: double for double, float otherwise.
template <typename T>
using Acc = std::conditional_t<std::is_same_v<T, double>, double, float>;

template <typename A>
constexpr A kMinusInf = -std::numeric_limits<A>::infinity();

/// Runs fn(item) for item in [0, n) on the calling thread's compute threads, items handed out
/// one at a time (they are few and heavy: an even split in chunks would leave threads idle).
template <typename Fn>
void parallel_items(int64_t n, const Fn& fn) {
  const int threads = static_cast<int>(std::min<int64_t>(omp_get_max_threads(), n));
  if (threads <= 1 || omp_in_parallel()) {
    for (int64_t i = 0; i < n; ++i) fn(i);
    return;
  }
  const uint32_t mode = float_mode();
#pragma omp parallel num_threads(threads)
  {
    set_float_mode(mode);
#pragma omp for schedule(dynamic, 1)
    for (int64_t i = 0; i < n; ++i) fn(i);
  }
}

/// Whether query i may attend key j of problem b (the causal triangle and the mask).
struct Visibility {
  const AttentionGeometry& g;
  const uint8_t* mask_b;  // problem b's mask, or null
  bool operator()(int64_t i, int64_t j) const {
    if (g.causal && j > i) return false;
    return mask_b == nullptr || mask_b[i * g.mask_row_stride + j * g.mask_col_stride] != 0;
  }
};

/// The dropout factor of probability (b, i, j): 0 or 1 / (1 - rate) in the dtype T, as
/// ops::dropout's mask; 1 without dropout.
template <typename T, typename A>
class DropoutMask {
 public:
  explicit DropoutMask(const AttentionGeometry& g)
      : g_(g),
        kept_(g.dropout_rate > 0 ? static_cast<A>(static_cast<T>(1.0 / (1.0 - g.dropout_rate)))
                                 : A(1)) {}
  bool active() const { return g_.dropout_rate > 0; }
  A operator()(int64_t b, int64_t i, int64_t j) {
    const auto flat = static_cast<uint64_t>((b * g_.tq + i) * g_.tk + j);
    const uint64_t block = g_.first_block + flat / 4;
    if (block != cached_block_) {
      bits_ = philox::block(g_.seed, g_.stream, block);
      cached_block_ = block;
    }
    const double u = philox::to_unit_float(bits_.v[flat % 4]);
    return u >= g_.dropout_rate ? kept_ : A(0);
  }

 private:
  const AttentionGeometry& g_;
  A kept_;
  uint64_t cached_block_ = ~uint64_t{0};
  philox::Block bits_{};
};

/// c[r][0..cols) (+)= sum_p a[r][p] * b[p][0..cols) for r < rows: a [rows, depth] with row
/// stride lda, b [depth, cols] with row stride ldb, c with row stride ldc.
template <typename A>
TANDEM_CPU_CLONES void tile_product(int64_t rows, int64_t cols, int64_t depth, const A* a,
                                    int64_t lda, const A* b, int64_t ldb, A* c, int64_t ldc,
                                    bool accumulate) {
  for (int64_t r = 0; r < rows; ++r) {
    A* cr = c + r * ldc;
    if (!accumulate) std::fill(cr, cr + cols, A(0));
    for (int64_t p = 0; p < depth; ++p) {
      const A x = a[r * lda + p];
      const A* bp = b + p * ldb;
      for (int64_t j = 0; j < cols; ++j) cr[j] += x * bp[j];
    }
  }
}

/// c[j][0..width) += sum_r s[r][j] * x[r][0..width) for j < cols: the transposed tile s
/// [rows, cols] (row stride lds) times x [rows, width] (row stride ldx), into c (row stride ldc).
template <typename A>
TANDEM_CPU_CLONES void tile_product_transposed(int64_t rows, int64_t cols, int64_t width,
                                               const A* s, int64_t lds, const A* x, int64_t ldx,
                                               A* c, int64_t ldc) {
  for (int64_t r = 0; r < rows; ++r) {
    const A* xr = x + r * ldx;
    for (int64_t j = 0; j < cols; ++j) {
      const A w = s[r * lds + j];
      if (w == A(0)) continue;
      A* cj = c + j * ldc;
      for (int64_t p = 0; p < width; ++p) cj[p] += w * xr[p];
    }
  }
}

/// rows [begin, begin + count) of src [*, width] (row stride width) into dst as A,
/// transposed (dst [width, count], row stride ld) or not (dst [count, width], row stride ld).
template <typename T, typename A>
void load_rows(const T* src, int64_t begin, int64_t count, int64_t width, bool transpose, A* dst,
               int64_t ld) {
  for (int64_t r = 0; r < count; ++r) {
    const T* row = src + (begin + r) * width;
    for (int64_t p = 0; p < width; ++p) {
      const auto x = static_cast<A>(static_cast<Acc<T>>(row[p]));
      if (transpose)
        dst[p * ld + r] = x;
      else
        dst[r * ld + p] = x;
    }
  }
}

template <typename T>
void forward(const AttentionGeometry& g, const T* q, const T* k, const T* v, T* out, Acc<T>* lse) {
  using A = Acc<T>;
  const int64_t tiles = (g.tq + kRows - 1) / kRows;
  const auto scale = static_cast<A>(g.scale);
  parallel_items(g.batch * tiles, [&](int64_t item) {
    const int64_t b = item / tiles, i0 = (item % tiles) * kRows;
    const int64_t rows = std::min(kRows, g.tq - i0);
    const T* qb = q + b * g.tq * g.d;
    const T* kb = k + b * g.tk * g.d;
    const T* vb = v + b * g.tk * g.dv;
    const Visibility visible{g, g.mask ? g.mask + g.mask_offsets[b] : nullptr};
    DropoutMask<T, A> dropout(g);
    thread_local std::vector<A> scratch;
    scratch.resize(static_cast<size_t>(rows * g.d + g.d * kCols + kCols * g.dv + rows * kCols +
                                       rows * g.dv + 2 * rows));
    A* qs = scratch.data();               // [rows, d]
    A* kt = qs + rows * g.d;              // [d, kCols]: the key tile transposed
    A* vs = kt + g.d * kCols;             // [kCols, dv]
    A* s = vs + kCols * g.dv;             // [rows, kCols]: scores, then probabilities
    A* acc = s + rows * kCols;            // [rows, dv]
    A* running_max = acc + rows * g.dv;   // [rows]
    A* running_sum = running_max + rows;  // [rows]
    load_rows(qb, i0, rows, g.d, false, qs, g.d);
    std::fill(acc, acc + rows * g.dv, A(0));
    std::fill(running_max, running_max + rows, kMinusInf<A>);
    std::fill(running_sum, running_sum + rows, A(0));
    // Under the causal mask no key past the tile's last row is visible: those tiles are skipped.
    const int64_t key_end = g.causal ? std::min(g.tk, i0 + rows) : g.tk;
    for (int64_t j0 = 0; j0 < key_end; j0 += kCols) {
      const int64_t cols = std::min(kCols, key_end - j0);
      load_rows(kb, j0, cols, g.d, true, kt, kCols);
      load_rows(vb, j0, cols, g.dv, false, vs, g.dv);
      tile_product(rows, cols, g.d, qs, g.d, kt, kCols, s, kCols, false);
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t i = i0 + r;
        A* sr = s + r * kCols;
        A tile_max = kMinusInf<A>;
        for (int64_t c = 0; c < cols; ++c) {
          sr[c] = visible(i, j0 + c) ? sr[c] * scale : kMinusInf<A>;
          tile_max = std::max(tile_max, sr[c]);
        }
        if (tile_max == kMinusInf<A>) {  // nothing visible in this tile
          std::fill(sr, sr + cols, A(0));
          continue;
        }
        const A new_max = std::max(running_max[r], tile_max);
        const A rescale = std::exp(running_max[r] - new_max);  // 0 for the first visible tile
        A tile_sum = 0;
        for (int64_t c = 0; c < cols; ++c) {
          sr[c] = std::exp(sr[c] - new_max);  // exp(-inf) = 0 for what is hidden
          tile_sum += sr[c];
        }
        running_sum[r] = running_sum[r] * rescale + tile_sum;
        running_max[r] = new_max;
        A* ar = acc + r * g.dv;
        for (int64_t p = 0; p < g.dv; ++p) ar[p] *= rescale;
        if (dropout.active())
          for (int64_t c = 0; c < cols; ++c) sr[c] *= dropout(b, i, j0 + c);
      }
      tile_product(rows, g.dv, cols, s, kCols, vs, g.dv, acc, g.dv, true);
    }
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t i = i0 + r;
      const A total = running_sum[r];
      T* o = out + (b * g.tq + i) * g.dv;
      const A* ar = acc + r * g.dv;
      for (int64_t p = 0; p < g.dv; ++p) o[p] = static_cast<T>(total > 0 ? ar[p] / total : A(0));
      lse[b * g.tq + i] = total > 0 ? running_max[r] + std::log(total) : kMinusInf<A>;
    }
  });
}

template <typename T>
void backward(const AttentionGeometry& g, const T* q, const T* k, const T* v, const T* out,
              const Acc<T>* lse, const T* dout, T* dq, T* dk, T* dv) {
  using A = Acc<T>;
  const auto scale = static_cast<A>(g.scale);
  parallel_items(g.batch, [&](int64_t b) {
    const T* qb = q + b * g.tq * g.d;
    const T* kb = k + b * g.tk * g.d;
    const T* vb = v + b * g.tk * g.dv;
    const T* ob = out + b * g.tq * g.dv;
    const T* gb = dout + b * g.tq * g.dv;
    const A* lb = lse + b * g.tq;
    const Visibility visible{g, g.mask ? g.mask + g.mask_offsets[b] : nullptr};
    DropoutMask<T, A> dropout(g);
    thread_local std::vector<A> scratch;
    scratch.resize(static_cast<size_t>(g.tk * (g.d + g.dv) + kRows * (2 * g.d + g.dv + 1) +
                                       kCols * g.d + g.dv * kCols + g.d * kCols +
                                       3 * kRows * kCols));
    A* dk_acc = scratch.data();       // [tk, d]
    A* dv_acc = dk_acc + g.tk * g.d;  // [tk, dv]
    A* qs = dv_acc + g.tk * g.dv;     // [kRows, d]
    A* dq_acc = qs + kRows * g.d;     // [kRows, d]
    A* gs = dq_acc + kRows * g.d;     // [kRows, dv]: the output gradient rows
    A* delta = gs + kRows * g.dv;     // [kRows]: rowsum(dout * out)
    A* ks = delta + kRows;            // [kCols, d]
    A* vt = ks + kCols * g.d;         // [dv, kCols]
    A* kt = vt + g.dv * kCols;        // [d, kCols]
    A* p = kt + g.d * kCols;          // [kRows, kCols]: probabilities
    A* pd = p + kRows * kCols;        // [kRows, kCols]: after dropout; then dS
    A* dpd = pd + kRows * kCols;      // [kRows, kCols]: d(probabilities after dropout)
    std::fill(dk_acc, dk_acc + g.tk * (g.d + g.dv), A(0));
    for (int64_t i0 = 0; i0 < g.tq; i0 += kRows) {
      const int64_t rows = std::min(kRows, g.tq - i0);
      load_rows(qb, i0, rows, g.d, false, qs, g.d);
      load_rows(gb, i0, rows, g.dv, false, gs, g.dv);
      std::fill(dq_acc, dq_acc + rows * g.d, A(0));
      for (int64_t r = 0; r < rows; ++r) {
        const T* orow = ob + (i0 + r) * g.dv;
        A total = 0;
        for (int64_t c = 0; c < g.dv; ++c) total += gs[r * g.dv + c] * static_cast<A>(orow[c]);
        delta[r] = total;
      }
      const int64_t key_end = g.causal ? std::min(g.tk, i0 + rows) : g.tk;
      for (int64_t j0 = 0; j0 < key_end; j0 += kCols) {
        const int64_t cols = std::min(kCols, key_end - j0);
        load_rows(kb, j0, cols, g.d, false, ks, g.d);
        load_rows(kb, j0, cols, g.d, true, kt, kCols);
        load_rows(vb, j0, cols, g.dv, true, vt, kCols);
        // Probabilities from the forward's log-sum-exp, and after dropout.
        tile_product(rows, cols, g.d, qs, g.d, kt, kCols, p, kCols, false);
        for (int64_t r = 0; r < rows; ++r) {
          const int64_t i = i0 + r;
          const A row_lse = lb[i];
          for (int64_t c = 0; c < cols; ++c) {
            A& x = p[r * kCols + c];
            x = visible(i, j0 + c) && row_lse != kMinusInf<A> ? std::exp(x * scale - row_lse)
                                                              : A(0);
            pd[r * kCols + c] = dropout.active() && x != A(0) ? x * dropout(b, i, j0 + c) : x;
          }
        }
        // dV += Pd^T dO; dPd = dO V^T.
        tile_product_transposed(rows, cols, g.dv, pd, kCols, gs, g.dv, dv_acc + j0 * g.dv, g.dv);
        tile_product(rows, cols, g.dv, gs, g.dv, vt, kCols, dpd, kCols, false);
        // dS = P * (dP - delta), dP = dPd * the dropout factor; scaled for dQ and dK.
        for (int64_t r = 0; r < rows; ++r) {
          const int64_t i = i0 + r;
          for (int64_t c = 0; c < cols; ++c) {
            const A prob = p[r * kCols + c];
            A grad = dpd[r * kCols + c];
            if (dropout.active() && prob != A(0)) grad *= dropout(b, i, j0 + c);
            pd[r * kCols + c] = prob == A(0) ? A(0) : prob * (grad - delta[r]) * scale;
          }
        }
        // dQ += dS K; dK += dS^T Q.
        tile_product(rows, g.d, cols, pd, kCols, ks, g.d, dq_acc, g.d, true);
        tile_product_transposed(rows, cols, g.d, pd, kCols, qs, g.d, dk_acc + j0 * g.d, g.d);
      }
      for (int64_t r = 0; r < rows; ++r) {
        T* row = dq + (b * g.tq + i0 + r) * g.d;
        for (int64_t c = 0; c < g.d; ++c) row[c] = static_cast<T>(dq_acc[r * g.d + c]);
      }
    }
    for (int64_t j = 0; j < g.tk; ++j) {
      for (int64_t c = 0; c < g.d; ++c)
        dk[(b * g.tk + j) * g.d + c] = static_cast<T>(dk_acc[j * g.d + c]);
      for (int64_t c = 0; c < g.dv; ++c)
        dv[(b * g.tk + j) * g.dv + c] = static_cast<T>(dv_acc[j * g.dv + c]);
    }
  });
}

}  // namespace

void attention_forward(const AttentionGeometry& g, const float* q, const float* k, const float* v,
                       float* out, float* lse) {
  forward(g, q, k, v, out, lse);
}
void attention_forward(const AttentionGeometry& g, const double* q, const double* k,
                       const double* v, double* out, double* lse) {
  forward(g, q, k, v, out, lse);
}
void attention_forward(const AttentionGeometry& g, const bfloat16* q, const bfloat16* k,
                       const bfloat16* v, bfloat16* out, float* lse) {
  forward(g, q, k, v, out, lse);
}
void attention_forward(const AttentionGeometry& g, const float16* q, const float16* k,
                       const float16* v, float16* out, float* lse) {
  forward(g, q, k, v, out, lse);
}

void attention_backward(const AttentionGeometry& g, const float* q, const float* k, const float* v,
                        const float* out, const float* lse, const float* dout, float* dq, float* dk,
                        float* dv) {
  backward(g, q, k, v, out, lse, dout, dq, dk, dv);
}
void attention_backward(const AttentionGeometry& g, const double* q, const double* k,
                        const double* v, const double* out, const double* lse, const double* dout,
                        double* dq, double* dk, double* dv) {
  backward(g, q, k, v, out, lse, dout, dq, dk, dv);
}
void attention_backward(const AttentionGeometry& g, const bfloat16* q, const bfloat16* k,
                        const bfloat16* v, const bfloat16* out, const float* lse,
                        const bfloat16* dout, bfloat16* dq, bfloat16* dk, bfloat16* dv) {
  backward(g, q, k, v, out, lse, dout, dq, dk, dv);
}
void attention_backward(const AttentionGeometry& g, const float16* q, const float16* k,
                        const float16* v, const float16* out, const float* lse, const float16* dout,
                        float16* dq, float16* dk, float16* dv) {
  backward(g, q, k, v, out, lse, dout, dq, dk, dv);
}

}  // namespace tandem::ops::cpu
