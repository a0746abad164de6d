// Fused scaled dot-product attention on the CPU: softmax(q k^T * scale, masked) v without the
// [Tq, Tk] probabilities. The forward walks the keys in tiles with an online softmax (a running
// maximum and sum per query row) and keeps each row's log-sum-exp; the backward recomputes each
// tile's probabilities from it. Memory grows with the sequence, not with its square; tiles a
// causal mask hides entirely are skipped.
#pragma once

#include <cstdint>

#include "tandem/core/half.h"

namespace tandem::ops::cpu {

/// The shapes and options of one attention call: `batch` independent problems (the product of
/// the leading dimensions), each q [tq, d], k [tk, d], v [tk, dv] -> out [tq, dv], row-major and
/// contiguous.
struct AttentionGeometry {
  int64_t batch = 0, tq = 0, tk = 0, d = 0, dv = 0;
  double scale = 1.0;
  /// Query i attends key j only when j <= i (the top-left lower triangle, as Keras's
  /// use_causal_mask and PyTorch's is_causal).
  bool causal = false;
  /// Optional mask (null: none): query i of problem b attends key j only when
  /// mask[mask_offsets[b] + i * mask_row_stride + j * mask_col_stride] is nonzero (strides 0
  /// where the mask broadcasts).
  const uint8_t* mask = nullptr;
  const int64_t* mask_offsets = nullptr;
  int64_t mask_row_stride = 0, mask_col_stride = 0;
  /// Dropout on the probabilities (rate 0: none): element (b, i, j), flat index
  /// f = (b * tq + i) * tk + j, is kept when Philox block (first_block + f / 4) of (seed, stream),
  /// lane f % 4, as a unit float is >= rate, and then scaled by 1 / (1 - rate) in the dtype;
  /// the mask ops::dropout draws for the same probabilities from the same generator position.
  double dropout_rate = 0.0;
  uint64_t seed = 0, stream = 0, first_block = 0;
};

/// out [batch, tq, dv] and each query row's log-sum-exp of its scaled, masked scores lse
/// [batch, tq] (-inf for a row with no key to attend, whose output is zeros). float64 computes
/// in double; float32, bfloat16 and float16 in float32, the output rounded once.
void attention_forward(const AttentionGeometry& g, const float* q, const float* k, const float* v,
                       float* out, float* lse);
void attention_forward(const AttentionGeometry& g, const double* q, const double* k,
                       const double* v, double* out, double* lse);
void attention_forward(const AttentionGeometry& g, const bfloat16* q, const bfloat16* k,
                       const bfloat16* v, bfloat16* out, float* lse);
void attention_forward(const AttentionGeometry& g, const float16* q, const float16* k,
                       const float16* v, float16* out, float* lse);

/// The gradients dq, dk, dv of the forward above given the output gradient dout, the forward's
/// out and lse (recomputing the probabilities tile by tile).
void attention_backward(const AttentionGeometry& g, const float* q, const float* k, const float* v,
                        const float* out, const float* lse, const float* dout, float* dq, float* dk,
                        float* dv);
void attention_backward(const AttentionGeometry& g, const double* q, const double* k,
                        const double* v, const double* out, const double* lse, const double* dout,
                        double* dq, double* dk, double* dv);
void attention_backward(const AttentionGeometry& g, const bfloat16* q, const bfloat16* k,
                        const bfloat16* v, const bfloat16* out, const float* lse,
                        const bfloat16* dout, bfloat16* dq, bfloat16* dk, bfloat16* dv);
void attention_backward(const AttentionGeometry& g, const float16* q, const float16* k,
                        const float16* v, const float16* out, const float* lse, const float16* dout,
                        float16* dq, float16* dk, float16* dv);

}  // namespace tandem::ops::cpu
