// Gradient clipping by global norm (Keras/TensorFlow clip_by_global_norm).
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "tandem/tensor/tensor.h"

namespace tandem::optim {

/// sqrt(sum over tensors of sum(t^2)) as a scalar tensor of the first defined tensor's dtype and
/// device, the sums taken per block of kNormBlock elements; undefined tensors are skipped; 0
/// when none is defined.
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

/// global_norm's terms are the sums of squares of blocks of this many elements of each
/// gradient (one term for a gradient of at most that many), summed in order: a gradient split
/// among replicas on block boundaries (optimizer-state sharding) gives the same terms.
inline constexpr int64_t kNormBlock = int64_t{1} << 16;

/// Where a shard of a gradient lies, for the sharded clip_by_global_norm: its elements
/// [begin, end) of the flattened gradient (begin a multiple of kNormBlock), and whether this
/// replica adds its terms (it holds the shard; of a shard every replica holds, one of them).
struct ShardExtent {
  int64_t begin = 0;     ///< the shard's first element of the flattened gradient
  int64_t end = 0;       ///< one past its last
  bool counted = false;  ///< whether this replica adds the shard's terms
};

/// clip_by_global_norm when each replica holds only its own shards of the gradients
/// (optimizer-state sharding), bitwise what clip_by_global_norm gives on the whole gradients:
/// `shards` are 1-D, in the order of the gradients and of their elements, defined where this
/// replica holds them (those are scaled); `sum_across_replicas` sums a tensor over the replicas
/// (each term is nonzero on one replica only, so the sum is exact); `dtype` and `device` are
/// those of the first gradient.
ClippedGradients clip_by_global_norm(
    const std::vector<Tensor>& shards, const std::vector<ShardExtent>& extents, double clip_norm,
    const std::function<Tensor(const Tensor&)>& sum_across_replicas, DType dtype, Device device);

}  // namespace tandem::optim
