// GradientSync: what an optimizer needs from the replica it runs on to combine gradients across
// the replicas in sync. The distribute layer's ReplicaContext implements it, so
// optimizer.apply_gradients(ctx, grads, vars) reads the way a gradient goes.
#pragma once

#include <vector>

#include "tandem/tensor/tensor.h"

namespace tandem::optim {

class GradientSync {
 public:
  /// This replica's index among the replicas in sync (it names the replica in errors).
  virtual int replica_id_in_sync_group() const = 0;
  /// The SUM over every replica in sync of each tensor of `gradients`, as new tensors, in ONE
  /// batched collective; undefined entries (variables without a gradient) stay undefined. Every
  /// replica calls it with the same shapes, dtypes and undefined entries.
  virtual std::vector<Tensor> sum_across_replicas(const std::vector<Tensor>& gradients) = 0;

 protected:
  ~GradientSync() = default;
};

}  // namespace tandem::optim
