// Variable storage and the per-thread replica binding that selects a mirrored copy.
#include "tandem/autograd/variable.h"

#include <atomic>

#include "tandem/autograd/tape.h"
#include "tandem/ops/ops.h"

namespace tandem {

namespace {
thread_local ReplicaBinding t_binding;
thread_local VariableCreator t_creator;
}  // namespace

Variable make_variable(std::string name, const Tensor& initial, bool trainable) {
  if (t_creator) return t_creator(std::move(name), initial, trainable);
  return Variable(std::move(name), initial, trainable);
}

Variable make_variable(std::string name, const Tensor& initial, const VariableOptions& options) {
  if (options.synchronization == VariableSynchronization::kOnRead)
    TANDEM_CHECK(!options.trainable, "variable \"", name,
                 "\": a trainable variable cannot be synchronized on read (its gradient updates "
                 "would differ between replicas); make it with .trainable = false");
  Variable v = make_variable(std::move(name), initial, options.trainable);
  v.set_synchronization(options.synchronization, options.aggregation);
  v.set_row_sparse_gradient(options.row_sparse_gradient);
  return v;
}

const char* to_string(VariableSynchronization synchronization) {
  return synchronization == VariableSynchronization::kOnRead ? "on_read" : "on_write";
}

const char* to_string(VariableAggregation aggregation) {
  switch (aggregation) {
    case VariableAggregation::kNone:
      return "none";
    case VariableAggregation::kSum:
      return "sum";
    case VariableAggregation::kMean:
      return "mean";
    case VariableAggregation::kOnlyFirstReplica:
      return "only_first_replica";
  }
  return "unknown";
}

VariableCreator set_variable_creator(VariableCreator creator) {
  VariableCreator previous = std::move(t_creator);
  t_creator = std::move(creator);
  return previous;
}

ReplicaBinding current_replica_binding() { return t_binding; }

namespace {
std::atomic<int> g_process_replica_offset{0};
}  // namespace
int process_replica_offset() { return g_process_replica_offset.load(std::memory_order_relaxed); }
void set_process_replica_offset(int offset) {
  g_process_replica_offset.store(offset, std::memory_order_relaxed);
}
namespace {
std::atomic<int> g_job_in_sync{0};
std::atomic<int> g_job_local{0};
}  // namespace
JobReplicas job_replicas() {
  return {.in_sync = g_job_in_sync.load(std::memory_order_relaxed),
          .local = g_job_local.load(std::memory_order_relaxed)};
}
void set_job_replicas(JobReplicas replicas) {
  g_job_in_sync.store(replicas.in_sync, std::memory_order_relaxed);
  g_job_local.store(replicas.local, std::memory_order_relaxed);
}
void set_current_replica_binding(ReplicaBinding binding) { t_binding = binding; }

Variable::Variable(std::string name, const Tensor& initial, bool trainable)
    : state_(std::make_shared<State>()) {
  TANDEM_CHECK(initial.defined(), "Variable \"", name, "\": the initial value is undefined");
  state_->name = std::move(name);
  state_->trainable = trainable;
  state_->copies.push_back(initial.clone());
}

const std::string& Variable::name() const {
  TANDEM_CHECK(state_ != nullptr, "use of an undefined Variable");
  return state_->name;
}

bool Variable::trainable() const { return state_ != nullptr && state_->trainable; }

VariableSynchronization Variable::synchronization() const {
  return state_ ? state_->synchronization : VariableSynchronization::kOnWrite;
}

bool Variable::row_sparse_gradient() const { return state_ && state_->row_sparse_gradient; }

void Variable::set_row_sparse_gradient(bool row_sparse) const {
  TANDEM_CHECK(state_ != nullptr, "set_row_sparse_gradient on an undefined variable");
  state_->row_sparse_gradient = row_sparse;
}

VariableAggregation Variable::aggregation() const {
  return state_ ? state_->aggregation : VariableAggregation::kNone;
}

void Variable::set_synchronization(VariableSynchronization synchronization,
                                   VariableAggregation aggregation) const {
  TANDEM_CHECK(state_ != nullptr, "use of an undefined Variable");
  TANDEM_CHECK(synchronization != VariableSynchronization::kOnRead || !state_->trainable,
               "variable \"", state_->name,
               "\": a trainable variable cannot be synchronized on read (its gradient updates "
               "would differ between replicas); make it with .trainable = false");
  const auto a = static_cast<int>(aggregation);
  TANDEM_CHECK(a >= 0 && a <= static_cast<int>(VariableAggregation::kOnlyFirstReplica),
               "variable \"", state_->name, "\": aggregation ", a,
               " is none of kNone, kSum, kMean, kOnlyFirstReplica");
  state_->synchronization = synchronization;
  state_->aggregation = aggregation;
}

Tensor Variable::aggregated() const {
  TANDEM_CHECK(state_ != nullptr, "use of an undefined Variable");
  const std::vector<Tensor>& copies = state_->copies;
  if (state_->synchronization == VariableSynchronization::kOnWrite || copies.size() == 1 ||
      state_->aggregation == VariableAggregation::kOnlyFirstReplica)
    return copies[0];
  TANDEM_CHECK(state_->aggregation != VariableAggregation::kNone, "variable \"", state_->name,
               "\" is synchronized on read with aggregation none, so its ", copies.size(),
               " replica copies cannot be read as one value outside strategy.run (nor saved); "
               "give it an aggregation (kSum, kMean or kOnlyFirstReplica)");
  const autograd::NoRecordGuard no_record;
  // In replica order, on copy 0's device: the same bits for every reader.
  Tensor sum = copies[0].clone();
  for (size_t r = 1; r < copies.size(); ++r)
    ops::add_(sum, copies[r].device() == sum.device() ? copies[r] : copies[r].to(sum.device()));
  if (state_->aggregation == VariableAggregation::kMean)
    return ops::div(
        sum, Tensor::scalar(static_cast<double>(copies.size()), sum.dtype()).to(sum.device()));
  return sum;
}

void Variable::assign_all(const Tensor& value) const {
  TANDEM_CHECK(state_ != nullptr, "use of an undefined Variable");
  const autograd::NoRecordGuard no_record;
  Tensor each = value;
  if (state_->synchronization == VariableSynchronization::kOnRead &&
      state_->aggregation == VariableAggregation::kSum && state_->copies.size() > 1)
    each = ops::div(value.to(state_->copies[0].device()),
                    Tensor::scalar(static_cast<double>(state_->copies.size()), value.dtype())
                        .to(state_->copies[0].device()));
  for (Tensor& copy : state_->copies) copy.copy_from(each);
}

const Tensor& Variable::value_untracked() const {
  TANDEM_CHECK(state_ != nullptr, "use of an undefined Variable");
  const ReplicaBinding binding = t_binding;
  const int n = static_cast<int>(state_->copies.size());
  if (n == 1) {
    TANDEM_CHECK(binding.num_replicas <= 1, "variable \"", state_->name,
                 "\" was created outside strategy.scope() but is used inside a strategy.run "
                 "of ",
                 binding.num_replicas,
                 " replicas; create it (build the model, the optimizer) while "
                 "`auto scope = strategy.scope();` is alive, so every replica gets its copy");
    return state_->copies[0];
  }
  if (binding.num_replicas <= 1 && state_->synchronization == VariableSynchronization::kOnRead) {
    // Cross-replica context: the copies' aggregate, kept until the next such read.
    state_->read = aggregated();
    return state_->read;
  }
  TANDEM_CHECK(binding.replica_id < n, "variable \"", state_->name, "\" has ", n,
               " replica copies but is read by replica ", binding.replica_id);
  return state_->copies[binding.replica_id];
}

const Tensor& Variable::value() const {
  const Tensor& v = value_untracked();
  if (state_->trainable) autograd::watch_on_active_tapes(v);
  return v;
}

void Variable::assign(const Tensor& new_value) const {
  if (state_ != nullptr && state_->synchronization == VariableSynchronization::kOnRead &&
      state_->copies.size() > 1 && t_binding.num_replicas <= 1) {
    assign_all(new_value);  // cross-replica context: every replica's copy
    return;
  }
  Tensor target = value_untracked();
  target.copy_from(new_value);
}

int Variable::num_copies() const { return state_ ? static_cast<int>(state_->copies.size()) : 0; }

const Tensor& Variable::copy(int replica) const {
  TANDEM_CHECK(state_ != nullptr && replica >= 0 && replica < num_copies(), "variable \"", name(),
               "\": no copy for replica ", replica, " (", num_copies(), " copies)");
  return state_->copies[replica];
}

void Variable::set_copies(std::vector<Tensor> copies) const {
  TANDEM_CHECK(state_ != nullptr && !copies.empty(), "Variable::set_copies: needs copies");
  state_->copies = std::move(copies);
}

}  // namespace tandem
