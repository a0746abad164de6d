// ReplicaContext's collectives (new tensors out, inputs untouched), merge_call's two rendezvous
// around the merge function that replica 0 runs in cross-replica context, and the thread-locals
// that say which replica (and which run) the calling thread is.
#include "tandem/distribute/replica_context.h"

#include <optional>

#include "tandem/collectives/in_process.h"
#include "tandem/distribute/internal/gradient_reducer.h"
#include "tandem/distribute/internal/host_reduce.h"
#include "tandem/distribute/internal/state.h"
#include "tandem/distribute/strategy.h"
#include "tandem/ops/ops.h"

namespace tandem {

namespace {
thread_local ReplicaContext* t_replica_context = nullptr;
thread_local uint64_t t_run_index = 0;  // which strategy.run this replica thread runs
thread_local std::optional<int64_t> t_global_batch_size;

/// "field\tvalue\n" lines; tabs and line breaks inside a value become spaces.
std::string encode_fields(const std::vector<std::pair<std::string, std::string>>& fields) {
  std::string out;
  for (const auto& [field, value] : fields) {
    for (const std::string* part : {&field, &value}) {
      for (char c : *part) out += (c == '\t' || c == '\n') ? ' ' : c;
      out += part == &field ? '\t' : '\n';
    }
  }
  return out;
}

std::vector<std::pair<std::string, std::string>> decode_fields(const std::string& text) {
  std::vector<std::pair<std::string, std::string>> out;
  size_t at = 0;
  while (at < text.size()) {
    const size_t tab = text.find('\t', at), end = text.find('\n', at);
    if (tab == std::string::npos || end == std::string::npos || tab > end) break;
    out.emplace_back(text.substr(at, tab - at), text.substr(tab + 1, end - tab - 1));
    at = end + 1;
  }
  return out;
}

}  // namespace

ReplicaContext* current_replica_context() { return t_replica_context; }

namespace detail {

void set_current_replica_context(ReplicaContext* context) { t_replica_context = context; }

uint64_t current_run_index() { return t_run_index; }

void set_current_run_index(uint64_t run_index) { t_run_index = run_index; }

std::optional<int64_t> last_global_batch_size() { return t_global_batch_size; }

void set_last_global_batch_size(int64_t global_batch_size) {
  t_global_batch_size = global_batch_size;
}

namespace {
thread_local int64_t t_step_global_batch_size = 0;
}  // namespace

int64_t step_global_batch_size() { return t_step_global_batch_size; }

void set_step_global_batch_size(int64_t examples) { t_step_global_batch_size = examples; }

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

bool ReplicaContext::begin(const std::vector<Tensor>& sources) { return reducer_->begin(sources); }

void ReplicaContext::ready(size_t index, const Tensor& gradient) {
  reducer_->ready(index, gradient);
}

void ReplicaContext::end(const std::vector<Tensor>& gradients) { reducer_->end(gradients); }

void ReplicaContext::set_communication(int64_t first_bucket_bytes, int64_t bucket_bytes,
                                       DType float32_wire) {
  reducer_->configure(first_bucket_bytes, bucket_bytes, float32_wire);
}

std::vector<Tensor> ReplicaContext::all_reduce_gradients(const std::vector<Tensor>& gradients) {
  const DType wire = reducer_->wire_dtype(DType::kFloat32);
  if (wire == DType::kFloat32) return all_reduce(ReduceOp::kSum, gradients);
  const autograd::NoRecordGuard no_record;
  const auto compressed = [&](const Tensor& g) {
    return g.defined() && g.dtype() == DType::kFloat32;
  };
  std::vector<Tensor> sent(gradients.size());
  for (size_t i = 0; i < gradients.size(); ++i)
    sent[i] = compressed(gradients[i]) ? ops::cast(gradients[i], wire) : gradients[i];
  std::vector<Tensor> summed = all_reduce(ReduceOp::kSum, sent);
  for (size_t i = 0; i < gradients.size(); ++i)
    if (compressed(gradients[i])) summed[i] = ops::cast(summed[i], DType::kFloat32);
  return summed;
}

void ReplicaContext::finish_task(bool succeeded) { reducer_->finish_run(succeeded); }

void ReplicaContext::forget_bucket_layout() { reducer_->forget_layout(); }

std::vector<Tensor> ReplicaContext::sum_across_replicas(const std::vector<Tensor>& gradients) {
  if (num_replicas_ == 1) return gradients;
  return reducer_->sum(gradients, nullptr, [&](const std::vector<Tensor>& values) {
    return all_reduce_gradients(values);
  });
}

void ReplicaContext::expect_micro_step(bool last, const std::vector<Tensor>& accumulators) {
  if (num_replicas_ > 1) reducer_->expect_micro_step(last, accumulators);
}

Tensor ReplicaContext::sum_of_shards(const Tensor& value) {
  if (num_replicas_ == 1) return value;
  return all_reduce(ReduceOp::kSum, value);
}

void ReplicaContext::agree_before_first_update(
    const std::vector<std::pair<std::string, std::string>>& description) {
  // One process: its replicas share the model and the optimizer. A worker of another job or
  // another program would otherwise train with these workers, unnoticed.
  if (strategy_->num_workers() <= 1) return;
  std::vector<std::pair<std::string, std::string>> fields = description;
  if (const std::optional<int64_t> batch = detail::last_global_batch_size())
    fields.emplace_back("global batch size (compute_average_loss)", std::to_string(*batch));
  const std::string mine = encode_fields(fields);
  // Every replica's text: their lengths, then their bytes concatenated in replica order.
  const std::vector<int64_t> lengths =
      all_gather(Tensor::from_vector(std::vector<int64_t>{static_cast<int64_t>(mine.size())}))
          .to_vector<int64_t>();
  const std::vector<uint8_t> bytes =
      all_gather(Tensor::from_vector(std::vector<uint8_t>(mine.begin(), mine.end())))
          .to_vector<uint8_t>();
  const int local = strategy_->num_local_replicas();
  std::vector<std::pair<std::string, std::string>> chief;
  size_t at = 0;
  for (int r = 0; r < num_replicas_; ++r) {
    const auto length = static_cast<size_t>(lengths[static_cast<size_t>(r)]);
    const auto theirs =
        decode_fields(std::string(bytes.begin() + static_cast<ptrdiff_t>(at),
                                  bytes.begin() + static_cast<ptrdiff_t>(at + length)));
    at += length;
    if (r == 0) {
      chief = theirs;
      continue;
    }
    const int worker = r / local;
    for (size_t f = 0; f < std::max(chief.size(), theirs.size()); ++f) {
      const bool same = f < chief.size() && f < theirs.size() && chief[f] == theirs[f];
      if (same) continue;
      const std::string field = f < chief.size() ? chief[f].first : theirs[f].first;
      const std::string on_chief = f < chief.size() ? chief[f].second : "(none)";
      const std::string on_worker =
          f < theirs.size() && theirs[f].first == field ? theirs[f].second : "(none)";
      TANDEM_THROW("the workers do not train the same thing: ", field, " is ", on_chief,
                   " on the chief (worker 0) and ", on_worker, " on worker ", worker,
                   "; every worker must build the same model and optimizer and pass the same "
                   "global batch size (is a worker of another job, or of another version of the "
                   "program, among them?)");
    }
  }
}

std::vector<Tensor> ReplicaContext::sum_accumulated(const std::vector<Tensor>& gradients,
                                                    const std::vector<Tensor>& accumulators) {
  if (num_replicas_ == 1) return add_into(accumulators, gradients);
  // The buckets hold accumulator + gradient when the backward pass packed them; else the
  // gradients are added here, once, before one batched all-reduce.
  return reducer_->sum(gradients, &accumulators, [&](const std::vector<Tensor>& values) {
    return all_reduce_gradients(add_into(values, gradients));
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
