// ReplicaContext's collectives (new tensors out, inputs untouched), merge_call's two rendezvous
// around the merge function that replica 0 runs in cross-replica context, and the thread-locals
// that say which replica (and which run) the calling thread is.
#include "tandem/distribute/replica_context.h"

#include "tandem/collectives/in_process.h"
#include "tandem/distribute/internal/gradient_reducer.h"
#include "tandem/distribute/internal/host_reduce.h"
#include "tandem/distribute/internal/state.h"

namespace tandem {

namespace {
thread_local ReplicaContext* t_replica_context = nullptr;
thread_local uint64_t t_run_index = 0;  // which strategy.run this replica thread runs
}  // namespace

ReplicaContext* current_replica_context() { return t_replica_context; }

namespace detail {

void set_current_replica_context(ReplicaContext* context) { t_replica_context = context; }

uint64_t current_run_index() { return t_run_index; }

void set_current_run_index(uint64_t run_index) { t_run_index = run_index; }

std::string describe_exception(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "an exception of unknown type";
  }
}

}  // namespace detail

ReplicaContext::ReplicaContext(Strategy* strategy, int replica_id, int num_replicas, Device device,
                               collectives::Communicator* communicator,
                               collectives::InProcessCommunicator* sync, detail::MergeState* merge)
    : strategy_(strategy),
      replica_id_(replica_id),
      num_replicas_(num_replicas),
      device_(device),
      communicator_(communicator),
      sync_(sync),
      merge_(merge),
      reducer_(std::make_unique<detail::GradientReducer>(*communicator, sync->rank(), replica_id)) {
}

ReplicaContext::~ReplicaContext() = default;

int ReplicaContext::local_replica_id() const { return sync_->rank(); }

size_t ReplicaContext::num_gradient_buckets() const { return reducer_->num_buckets(); }

uint64_t ReplicaContext::bucketed_steps() const { return reducer_->bucketed_steps(); }

Tensor ReplicaContext::all_reduce(ReduceOp op, const Tensor& value) {
  TANDEM_CHECK(value.defined(), "ctx.all_reduce: the value is undefined");
  if (num_replicas_ == 1) return value;
  return all_reduce(op, std::vector<Tensor>{value})[0];
}

std::vector<Tensor> ReplicaContext::all_reduce(ReduceOp op, const std::vector<Tensor>& values) {
  if (num_replicas_ == 1) return values;
  reducer_->wait_in_flight();  // collectives keep one order on every replica
  std::vector<Tensor> inputs;
  std::vector<Tensor> outputs;
  inputs.reserve(values.size());
  outputs.reserve(values.size());
  for (const Tensor& v : values) {
    if (!v.defined()) continue;  // no gradient: stays undefined (same on every replica)
    inputs.push_back(v);
    outputs.push_back(Tensor::empty_like(v));
  }
  communicator_->all_reduce(inputs, outputs, op)->wait();
  if (inputs.size() == values.size()) return outputs;
  std::vector<Tensor> result(values.size());
  size_t next = 0;
  for (size_t i = 0; i < values.size(); ++i)
    if (values[i].defined()) result[i] = std::move(outputs[next++]);
  return result;
}

std::vector<Tensor> ReplicaContext::sum_across_replicas(const std::vector<Tensor>& gradients) {
  if (num_replicas_ == 1) return gradients;
  return reducer_->sum(gradients, nullptr, [&](const std::vector<Tensor>& values) {
    return all_reduce(ReduceOp::kSum, values);
  });
}

void ReplicaContext::expect_micro_step(bool last, const std::vector<Tensor>& accumulators) {
  if (num_replicas_ > 1) reducer_->expect_micro_step(last, accumulators);
}

std::vector<Tensor> ReplicaContext::sum_accumulated(const std::vector<Tensor>& gradients,
                                                    const std::vector<Tensor>& accumulated) {
  if (num_replicas_ == 1) return accumulated;
  return reducer_->sum(gradients, &accumulated, [&](const std::vector<Tensor>& values) {
    return all_reduce(ReduceOp::kSum, values);
  });
}

Tensor ReplicaContext::all_gather(const Tensor& value, int64_t axis) {
  TANDEM_CHECK(value.defined(), "ctx.all_gather: the value is undefined");
  if (num_replicas_ == 1) return value;
  reducer_->wait_in_flight();
  std::vector<Tensor> parts;
  communicator_->all_gather(parts, value)->wait();
  return detail::concat_along(parts, axis, "ctx.all_gather");
}

Tensor ReplicaContext::broadcast(const Tensor& value, int root) {
  TANDEM_CHECK(value.defined(), "ctx.broadcast: the value is undefined");
  TANDEM_CHECK(root >= 0 && root < num_replicas_, "ctx.broadcast: root ", root, " is outside [0, ",
               num_replicas_, ")");
  if (num_replicas_ == 1) return value;
  reducer_->wait_in_flight();
  std::vector<Tensor> tensors{replica_id_ == root ? value.clone() : Tensor::empty_like(value)};
  communicator_->broadcast(tensors, root)->wait();
  return tensors[0];
}

std::shared_ptr<void> ReplicaContext::merge_call_erased(const void* my_arguments,
                                                        detail::MergeFn fn) {
  TANDEM_CHECK(current_replica_context() == this,
               "ctx.merge_call: call it from the replica function that received this context, "
               "on its own thread (not from inside another merge_call)");
  // merge_call meets this worker's replicas (local indices; with several workers each worker
  // runs the merge function on its own replicas' values).
  reducer_->wait_in_flight();
  const int local_id = sync_->rank();
  const int local_replicas = sync_->size();
  detail::MergeState& merge = *merge_;
  merge.arguments[static_cast<size_t>(local_id)] = my_arguments;
  // First rendezvous: every replica has published its arguments (the group's mutex orders the
  // write above before replica 0's reads in the merge function).
  sync_->rendezvous("merge_call");
  if (local_id == 0) {
    merge.result.reset();
    merge.error = nullptr;
    detail::CrossReplicaGuard cross_replica;
    try {
      merge.result = fn.call(fn.object, *strategy_, merge.arguments.data(), local_replicas);
    } catch (...) {
      merge.error = std::current_exception();
    }
  }
  // Second rendezvous: replica 0 has stored the result. It stays valid until replica 0 passes
  // the next merge_call's first rendezvous, which needs every replica to have left this one.
  sync_->rendezvous("merge_call result");
  if (merge.error) {
    if (local_id == 0) std::rethrow_exception(merge.error);
    throw collectives::AbortedError(
        detail::str_cat("merge_call: the merge function raised on replica 0: ",
                        detail::describe_exception(merge.error)));
  }
  return merge.result;
}

}  // namespace tandem
