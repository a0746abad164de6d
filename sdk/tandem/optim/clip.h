// Gradient clipping by global norm (Keras/TensorFlow clip_by_global_norm).
#pragma once

#include <functional>
#include <vector>

#include "tandem/tensor/tensor.h"

namespace tandem::optim {

/// sqrt(sum over tensors of sum(t^2)) as a scalar tensor of the first defined tensor's dtype and
/// device; undefined tensors are skipped; 0 when none is defined.
Tensor global_norm(const std::vector<Tensor>& tensors);

/// What clip_by_global_norm returns.
struct ClippedGradients {
  std::vector<Tensor> gradients;  ///< the clipped list (undefined entries stay undefined)
  Tensor global_norm;             ///< the norm before clipping (scalar)
};

/// Scales every gradient by clip_norm / max(global_norm, clip_norm), computed as Keras does:
/// scale = clip_norm * min(1 / norm, 1 / clip_norm), plus (norm - norm) so that a NaN or Inf
/// norm makes every gradient NaN. clip_norm must be > 0.
ClippedGradients clip_by_global_norm(const std::vector<Tensor>& gradients, double clip_norm);

/// clip_by_global_norm when each replica holds only its own gradients (optimizer-state
/// sharding, stage 2), bitwise what clip_by_global_norm gives on the whole list: `present[i]`
/// says whether gradient i exists at all (on some replica), `gradients[i]` is defined where it
/// is this replica's; `sum_across_replicas` sums a tensor over the replicas (each replica's
/// terms are zero where another holds the gradient, so the sum is exact); `dtype` and `device`
/// are those of the first present gradient.
ClippedGradients clip_by_global_norm(
    const std::vector<Tensor>& gradients, const std::vector<bool>& present, double clip_norm,
    const std::function<Tensor(const Tensor&)>& sum_across_replicas, DType dtype, Device device);

}  // namespace tandem::optim
