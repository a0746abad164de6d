// GradientSync: what an optimizer needs from the replica it runs on to combine gradients across
// the replicas in sync. The distribute layer's ReplicaContext implements it, so
// optimizer.apply_gradients(ctx, grads, vars) reads the way a gradient goes.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "tandem/tensor/tensor.h"

namespace tandem::optim {

/// The optimizer's view of the replica it runs on: how its gradients are summed across the
/// replicas in sync. ReplicaContext implements it; pass the step's ctx to apply_gradients.
class GradientSync {
 public:
  /// This replica's index among the replicas in sync (it names the replica in errors).
  virtual int replica_id_in_sync_group() const = 0;
  /// The SUM over every replica in sync of each tensor of `gradients`, as new tensors, in ONE
  /// batched collective; undefined entries (variables without a gradient) stay undefined. Every
  /// replica calls it with the same shapes, dtypes and undefined entries.
  virtual std::vector<Tensor> sum_across_replicas(const std::vector<Tensor>& gradients) = 0;
  /// The same, told which gradients are row-sparse (VariableOptions::row_sparse_gradient: an
  /// embedding table's, most of whose rows are zero): a sync may sum those by gathering their
  /// nonzero rows, with the same result bit for bit. The default ignores the hint.
  virtual std::vector<Tensor> sum_across_replicas(const std::vector<Tensor>& gradients,
                                                  const std::vector<bool>& row_sparse) {
    (void)row_sparse;
    return sum_across_replicas(gradients);
  }

  /// Called once per replica before an optimizer's first update through this sync, with what
  /// every worker of a job must have alike ({field, value}: the optimizer and its
  /// hyper-parameters, the variables' names, shapes and dtypes). A sync across workers compares
  /// them and raises on every replica, naming the first field that differs and both values;
  /// the default (one process) has nothing to compare.
  virtual void agree_before_first_update(
      const std::vector<std::pair<std::string, std::string>>& /*description*/) {}

  /// Optimizer-state sharding: elements [begin, end) of the flattened gradient (and variable)
  /// `index`, owned by replica `owner` (its replica_id_in_sync_group; -1: every replica).
  struct Shard {
    size_t index = 0;   ///< which gradient (and variable)
    int64_t begin = 0;  ///< its first element, flattened
    int64_t end = 0;    ///< one past its last
    int owner = -1;     ///< the replica that receives its sum; -1: every replica
  };
  /// Optimizer-state sharding: whether sum_to_owners moves only each owner's share (a true
  /// reduce-scatter). Where it would run the whole all-reduce anyway, an optimizer sums as
  /// unsharded (the same call, the same bits) and keeps its shards. The default: true.
  virtual bool reduces_to_owners() const { return true; }
  /// Optimizer-state sharding: the SUM over every replica in sync of each shard of `gradients`,
  /// delivered to its owner alone (a reduce-scatter): entry k is a 1-D tensor of
  /// shards[k].end - shards[k].begin elements where shards[k].owner is this replica or -1,
  /// undefined elsewhere; bitwise those elements of sum_across_replicas. Every replica calls it
  /// with the same shards, of defined gradients. The default sums everything and keeps the
  /// owned elements.
  virtual std::vector<Tensor> sum_to_owners(const std::vector<Tensor>& gradients,
                                            const std::vector<Shard>& shards);
  /// Optimizer-state sharding: the element-wise SUM of `value` over every replica in sync (what
  /// a replica's own gradients contribute to a decision every replica must take alike: squared
  /// norms, non-finite counts). Exact where at most one replica's entry is nonzero. The
  /// default (one replica) returns `value`.
  virtual Tensor sum_of_shards(const Tensor& value) { return value; }
  /// Optimizer-state sharding: copies each shard of `values` (this replica's tensors, the
  /// shards updated by their owners) from its owner into the same elements of every other
  /// replica's tensor, in place (an all-gather); shards of owner -1 stay as they are. Every
  /// replica calls it with the same shapes, dtypes and shards. The default (one replica) has
  /// no one to send to.
  virtual void gather_from_owners(const std::vector<Tensor>& values,
                                  const std::vector<Shard>& shards) {
    (void)values;
    (void)shards;
  }

  // Gradient accumulation (gradient_accumulation_steps = N > 1).
  /// Told after each micro-step that does not update: whether the next backward pass is the
  /// last micro-step before an update and, when it is, this replica's accumulators (one per
  /// variable, in apply_gradients' order). A sync that reduces gradients during the backward
  /// pass (gradient buckets) then packs accumulator + gradient as each gradient becomes final,
  /// and packs nothing in the other micro-steps.
  virtual void expect_micro_step(bool /*last*/, const std::vector<Tensor>& /*accumulators*/) {}
  /// The last micro-step: the SUM over every replica in sync of accumulator + gradient, where
  /// `accumulators` are this replica's accumulators before this micro-step's `gradients` (one
  /// per variable, undefined where the gradient is). The addition is made once, here: by the
  /// buckets that packed accumulator + gradient during the backward pass, or into the
  /// accumulators before one batched sum (what this default does). The accumulators' contents
  /// are unspecified afterwards (the optimizer resets them).
  virtual std::vector<Tensor> sum_accumulated(const std::vector<Tensor>& gradients,
                                              const std::vector<Tensor>& accumulators) {
    return sum_across_replicas(add_into(accumulators, gradients));
  }

 protected:
  ~GradientSync() = default;
  /// Adds each defined gradient into its accumulator (in place, unrecorded); returns the
  /// accumulators.
  static const std::vector<Tensor>& add_into(const std::vector<Tensor>& accumulators,
                                             const std::vector<Tensor>& gradients);
};

}  // namespace tandem::optim
