// ReplicaScope: the replica bindings of the calling thread (internal/replica_scope.h).
#include "tandem/distribute/internal/replica_scope.h"

#include <utility>
#include <vector>

#include "tandem/core/threading.h"
#include "tandem/distribute/internal/state.h"

namespace tandem::detail {

ReplicaScope::ReplicaScope(const Binding& binding)
    : saved_context_(current_replica_context()),
      saved_binding_(current_replica_binding()),
      saved_track_(profile::current_track()),
      saved_listener_(nullptr),
      saved_run_index_(current_run_index()) {
  if (binding.compute_threads) {
    saved_compute_threads_ = compute_threads();
    // Replicas split the cores: replicas x compute threads <= cores.
    set_compute_threads(*binding.compute_threads);
  }
  // Variables created inside run (a model built on first use, optimizer slots) are mirrored
  // too; code that creates them lazily does so once, under its own lock, not once per replica.
  if (binding.creator) saved_creator_ = set_variable_creator(*binding.creator);
  set_current_replica_binding({binding.local_replica, binding.num_local_replicas,
                               binding.first_global_replica, binding.num_replicas_in_sync});
  profile::set_current_track({profile::TrackKind::kReplica, binding.local_replica});
  set_current_replica_context(binding.context);
  // This thread's backward passes hand their gradients to the replica's buckets as they become
  // final.
  saved_listener_ = autograd::set_gradient_listener(
      binding.context != nullptr ? binding.context->gradient_listener() : nullptr);
  // Layers that combine the replicas in their forward pass (synchronized batch norm) sum
  // through the replica's collectives.
  autograd::ReplicaSumFn sum;
  if (ReplicaContext* ctx = binding.context)
    sum = [ctx](const std::vector<Tensor>& values) {
      return ctx->all_reduce(ReduceOp::kSum, values);
    };
  saved_replica_sum_ = autograd::set_replica_sum(std::move(sum));
}

ReplicaScope::~ReplicaScope() {
  autograd::set_replica_sum(std::move(saved_replica_sum_));
  autograd::set_gradient_listener(saved_listener_);
  set_current_replica_context(saved_context_);
  profile::set_current_track(saved_track_);
  set_current_replica_binding(saved_binding_);
  if (saved_creator_) set_variable_creator(std::move(*saved_creator_));
  if (saved_compute_threads_) set_compute_threads(*saved_compute_threads_);
  set_current_run_index(saved_run_index_);
}

void ReplicaScope::begin_run(uint64_t run_index) const { set_current_run_index(run_index); }

}  // namespace tandem::detail
