// reduce_in_order: the one host loop that combines buffers element-wise in a fixed order (the
// in-process CPU reduction, strategy.reduce, the workers' small all-reduces), so that every
// path adds in the same order and gives the same bits.
#pragma once

#include <cstdint>

#include "tandem/collectives/internal/reduce_max.h"
#include "tandem/collectives/reduce_op.h"

namespace tandem::detail {

/// acc = source 0 op source 1 op ... op source num_src - 1, element-wise over `count` elements,
/// combining the sources in that order (kSum and kMean add, kMax keeps NaN; kMean then divides
/// by num_src). `acc` holds source 0 on entry; `source(k)` gives source k (a `const T*`) for
/// k = 1, 2, ... in that order, once each.
template <typename T, typename Source>
void reduce_in_order(T* acc, int64_t count, int64_t num_src, ReduceOp op, Source&& source) {
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

}  // namespace tandem::detail
