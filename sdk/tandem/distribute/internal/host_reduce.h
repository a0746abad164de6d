// Host-side building blocks of cross-replica reductions (strategy.reduce, gather, all_gather):
// element-wise combination in a fixed replica order, reduction over one axis, concatenation
// along any axis. Internal to the distribute layer; not recorded on gradient tapes.
#pragma once

#include <cstdint>
#include <vector>

#include "tandem/collectives/reduce_op.h"
#include "tandem/tensor/tensor.h"

namespace tandem::detail {

/// values[0] op values[1] op ... element-wise, in that order (kMean divides the sum by the
/// count of values). Shapes and dtypes must agree (the message starts with `what`).
Tensor combine_elementwise(const std::vector<Tensor>& values, ReduceOp op, const char* what);

/// Sums (kSum, kMean) or maxes (kMax) `x` over `axis` (removed from the shape). Summing an
/// empty axis gives 0; the max of an empty axis raises.
Tensor reduce_over_axis(const Tensor& x, int64_t axis, ReduceOp op, const char* what);

/// x / divisor element-wise (a new tensor of x's dtype).
Tensor divide_by(const Tensor& x, double divisor);

/// Concatenates `parts` along `axis`; their shapes agree everywhere else (the message starts
/// with `what`). Parts may be empty along `axis`.
Tensor concat_along(const std::vector<Tensor>& parts, int64_t axis, const char* what);

}  // namespace tandem::detail
