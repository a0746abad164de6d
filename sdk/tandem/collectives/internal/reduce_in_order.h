// reduce_in_order: the one host loop that combines buffers element-wise in a fixed order (the
// in-process CPU reduction, strategy.reduce, the workers' small all-reduces), so that every
// path adds in the same order and gives the same bits.
#pragma once

#include <cstdint>
#include <vector>

#include "tandem/collectives/internal/reduce_max.h"
#include "tandem/collectives/reduce_op.h"
#include "tandem/core/half.h"

namespace tandem::detail {

/// acc = source 0 op source 1 op ... op source num_src - 1, element-wise over `count` elements,
/// combining the sources in that order (kSum and kMean add, kMax keeps NaN; kMean then divides
/// by num_src); 16-bit floating values add in float32 and round once. `acc` holds source 0 on
/// entry; `source(k)` gives source k (a `const T*`) for k = 1, 2, ... in that order, once each.
template <typename T, typename Source>
void reduce_in_order(T* acc, int64_t count, int64_t num_src, ReduceOp op, Source&& source) {
  if constexpr (is_half_v<T>) {
    // 16-bit values (gradients sent compressed) add in float32 and round once: the sum of
    // every source, in source order, as float32 would make it, then rounded to T.
    const T* few[16];
    std::vector<const T*> many(num_src > 16 ? static_cast<size_t>(num_src) : 0);
    const T** sources = num_src > 16 ? many.data() : few;
    sources[0] = acc;
    for (int64_t k = 1; k < num_src; ++k) sources[k] = source(k);
    if (op == ReduceOp::kMax) {
      for (int64_t k = 1; k < num_src; ++k) {
        const T* in = sources[k];
        for (int64_t i = 0; i < count; ++i) acc[i] = max_propagating_nan(acc[i], in[i]);
      }
      return;
    }
    // In blocks whose float32 sums stay in L1 (the loops vectorize).
    constexpr int64_t kBlock = 1024;
    float sum[kBlock];
    for (int64_t done = 0; done < count; done += kBlock) {
      const int64_t len = count - done < kBlock ? count - done : kBlock;
      for (int64_t i = 0; i < len; ++i) sum[i] = static_cast<float>(acc[done + i]);
      for (int64_t k = 1; k < num_src; ++k) {
        const T* in = sources[k] + done;
        for (int64_t i = 0; i < len; ++i) sum[i] += static_cast<float>(in[i]);
      }
      if (op == ReduceOp::kMean)
        for (int64_t i = 0; i < len; ++i) sum[i] /= static_cast<float>(num_src);
      for (int64_t i = 0; i < len; ++i) acc[done + i] = T(sum[i]);
    }
    return;
  } else {
    for (int64_t k = 1; k < num_src; ++k) {
      const T* in = source(k);
      if (op == ReduceOp::kMax) {
        for (int64_t i = 0; i < count; ++i) acc[i] = max_propagating_nan(acc[i], in[i]);
      } else {
        for (int64_t i = 0; i < count; ++i) acc[i] = static_cast<T>(acc[i] + in[i]);
      }
    }
    if (op == ReduceOp::kMean) {
      for (int64_t i = 0; i < count; ++i) acc[i] = static_cast<T>(acc[i] / num_src);
    }
  }
}

}  // namespace tandem::detail
