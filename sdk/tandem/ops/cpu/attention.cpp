// Fused attention on the CPU (see attention.h). Each tile product is one GEMM (cpu::gemm: oneDNN's
// sgemm for float32, single-threaded inside the parallel loop over problems and query tiles);
// the 16-bit types convert their tiles to float32 first.
#include "tandem/ops/cpu/attention.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "tandem/core/threading.h"
#include "tandem/ops/cpu/activations.h"
#include "tandem/ops/cpu/nn_kernels.h"
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

/// How many of the columns [j0, j0 + cols) query i may see at most: those before the causal
/// edge (all of them without the causal mask). Past them every key is hidden.
inline int64_t visible_span(const AttentionGeometry& g, int64_t i, int64_t j0, int64_t cols) {
  return g.causal ? std::clamp<int64_t>(i - j0 + 1, 0, cols) : cols;
}

/// x[c] = e^(x[c] - shift) for c < n: the vectorised loop for float, std::exp for double.
template <typename A>
void exp_shifted_row(A* x, int64_t n, A shift) {
  if constexpr (std::is_same_v<A, float>) {
    exp_shifted(x, n, shift);
  } else {
    for (int64_t c = 0; c < n; ++c) x[c] = std::exp(x[c] - shift);
  }
}

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

/// Rows [begin, begin + count) of src [*, width] as A: in place when T is A, else converted
/// into `buffer` (count * width elements).
template <typename T, typename A>
const A* rows_as(const T* src, int64_t begin, int64_t count, int64_t width, A* buffer) {
  if constexpr (std::is_same_v<T, A>) {
    return src + begin * width;
  } else {
    const T* from = src + begin * width;
    for (int64_t i = 0; i < count * width; ++i) buffer[i] = static_cast<A>(from[i]);
    return buffer;
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
    scratch.resize(static_cast<size_t>(kRows * g.d + kCols * g.d + kCols * g.dv + kRows * kCols +
                                       kRows * g.dv + 2 * kRows));
    A* q_buffer = scratch.data();          // [rows, d] (16-bit inputs only)
    A* k_buffer = q_buffer + kRows * g.d;  // [cols, d] (16-bit inputs only)
    A* v_buffer = k_buffer + kCols * g.d;  // [cols, dv] (16-bit inputs only)
    A* s = v_buffer + kCols * g.dv;        // [rows, kCols]: scores, then probabilities
    A* acc = s + kRows * kCols;            // [rows, dv]
    A* running_max = acc + kRows * g.dv;   // [rows]
    A* running_sum = running_max + kRows;  // [rows]
    const A* qs = rows_as(qb, i0, rows, g.d, q_buffer);
    std::fill(acc, acc + rows * g.dv, A(0));
    std::fill(running_max, running_max + rows, kMinusInf<A>);
    std::fill(running_sum, running_sum + rows, A(0));
    // Under the causal mask no key past the tile's last row is visible: those tiles are skipped.
    const int64_t key_end = g.causal ? std::min(g.tk, i0 + rows) : g.tk;
    for (int64_t j0 = 0; j0 < key_end; j0 += kCols) {
      const int64_t cols = std::min(kCols, key_end - j0);
      const A* ks = rows_as(kb, j0, cols, g.d, k_buffer);
      const A* vs = rows_as(vb, j0, cols, g.dv, v_buffer);
      gemm(false, true, rows, cols, g.d, A(1), qs, g.d, ks, g.d, A(0), s, kCols);  // Q K^T
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t i = i0 + r;
        A* sr = s + r * kCols;
        const int64_t span = visible_span(g, i, j0, cols);
        A tile_max = kMinusInf<A>;
        if (visible.mask_b == nullptr) {
          for (int64_t c = 0; c < span; ++c) {
            sr[c] *= scale;
            tile_max = std::max(tile_max, sr[c]);
          }
        } else {
          for (int64_t c = 0; c < span; ++c) {
            sr[c] = visible(i, j0 + c) ? sr[c] * scale : kMinusInf<A>;
            tile_max = std::max(tile_max, sr[c]);
          }
        }
        std::fill(sr + span, sr + cols, A(0));
        if (tile_max == kMinusInf<A>) {  // nothing visible in this tile
          std::fill(sr, sr + span, A(0));
          continue;
        }
        const A new_max = std::max(running_max[r], tile_max);
        const A rescale = std::exp(running_max[r] - new_max);  // 0 for the first visible tile
        exp_shifted_row(sr, span, new_max);  // exp(-inf) = 0 for what the mask hides
        A tile_sum = 0;
        for (int64_t c = 0; c < span; ++c) tile_sum += sr[c];
        running_sum[r] = running_sum[r] * rescale + tile_sum;
        running_max[r] = new_max;
        A* ar = acc + r * g.dv;
        for (int64_t p = 0; p < g.dv; ++p) ar[p] *= rescale;
        if (dropout.active())
          for (int64_t c = 0; c < cols; ++c) sr[c] *= dropout(b, i, j0 + c);
      }
      gemm(false, false, rows, g.dv, cols, A(1), s, kCols, vs, g.dv, A(1), acc, g.dv);  // += P V
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
                                       kCols * (g.d + g.dv) + 3 * kRows * kCols));
    A* dk_acc = scratch.data();            // [tk, d]
    A* dv_acc = dk_acc + g.tk * g.d;       // [tk, dv]
    A* q_buffer = dv_acc + g.tk * g.dv;    // [kRows, d] (16-bit inputs only)
    A* dq_acc = q_buffer + kRows * g.d;    // [kRows, d]
    A* g_buffer = dq_acc + kRows * g.d;    // [kRows, dv]: output gradient rows (16-bit only)
    A* delta = g_buffer + kRows * g.dv;    // [kRows]: rowsum(dout * out)
    A* k_buffer = delta + kRows;           // [kCols, d] (16-bit inputs only)
    A* v_buffer = k_buffer + kCols * g.d;  // [kCols, dv] (16-bit inputs only)
    A* p = v_buffer + kCols * g.dv;        // [kRows, kCols]: probabilities
    A* pd = p + kRows * kCols;             // [kRows, kCols]: after dropout; then dS
    A* dpd = pd + kRows * kCols;           // [kRows, kCols]: d(probabilities after dropout)
    std::fill(dk_acc, dk_acc + g.tk * (g.d + g.dv), A(0));
    for (int64_t i0 = 0; i0 < g.tq; i0 += kRows) {
      const int64_t rows = std::min(kRows, g.tq - i0);
      const A* qs = rows_as(qb, i0, rows, g.d, q_buffer);
      const A* gs = rows_as(gb, i0, rows, g.dv, g_buffer);
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
        const A* ks = rows_as(kb, j0, cols, g.d, k_buffer);
        const A* vs = rows_as(vb, j0, cols, g.dv, v_buffer);
        // Probabilities from the forward's log-sum-exp, and after dropout.
        gemm(false, true, rows, cols, g.d, A(1), qs, g.d, ks, g.d, A(0), p, kCols);
        for (int64_t r = 0; r < rows; ++r) {
          const int64_t i = i0 + r;
          const A row_lse = lb[i];
          A* pr = p + r * kCols;
          // A row that sees nothing (log-sum-exp -inf) has probabilities 0.
          const int64_t span = row_lse == kMinusInf<A> ? 0 : visible_span(g, i, j0, cols);
          if (visible.mask_b == nullptr) {
            for (int64_t c = 0; c < span; ++c) pr[c] *= scale;
          } else {
            for (int64_t c = 0; c < span; ++c)
              pr[c] = visible(i, j0 + c) ? pr[c] * scale : kMinusInf<A>;
          }
          exp_shifted_row(pr, span, row_lse);
          std::fill(pr + span, pr + cols, A(0));
          A* pdr = pd + r * kCols;
          if (dropout.active()) {
            for (int64_t c = 0; c < cols; ++c)
              pdr[c] = pr[c] != A(0) ? pr[c] * dropout(b, i, j0 + c) : pr[c];
          } else {
            std::copy(pr, pr + cols, pdr);
          }
        }
        // dV += Pd^T dO; dPd = dO V^T.
        gemm(true, false, cols, g.dv, rows, A(1), pd, kCols, gs, g.dv, A(1), dv_acc + j0 * g.dv,
             g.dv);
        gemm(false, true, rows, cols, g.dv, A(1), gs, g.dv, vs, g.dv, A(0), dpd, kCols);
        // dS = P * (dP - delta), dP = dPd * the dropout factor; scaled for dQ and dK.
        for (int64_t r = 0; r < rows; ++r) {
          const int64_t i = i0 + r;
          const A* pr = p + r * kCols;
          A* dpr = dpd + r * kCols;
          if (dropout.active()) {
            for (int64_t c = 0; c < cols; ++c)
              if (pr[c] != A(0)) dpr[c] *= dropout(b, i, j0 + c);
          }
          A* dsr = pd + r * kCols;
          const A d = delta[r];
          for (int64_t c = 0; c < cols; ++c) {
            const A ds = pr[c] * (dpr[c] - d) * scale;
            dsr[c] = pr[c] == A(0) ? A(0) : ds;
          }
        }
        // dQ += dS K; dK += dS^T Q.
        gemm(false, false, rows, g.d, cols, A(1), pd, kCols, ks, g.d, A(1), dq_acc, g.d);
        gemm(true, false, cols, g.d, rows, A(1), pd, kCols, qs, g.d, A(1), dk_acc + j0 * g.d, g.d);
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
