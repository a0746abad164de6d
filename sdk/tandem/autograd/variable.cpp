// Variable storage and the per-thread replica binding that selects a mirrored copy.
#include "tandem/autograd/variable.h"

#include <atomic>

#include "tandem/autograd/tape.h"

namespace tandem {

namespace {
thread_local ReplicaBinding t_binding;
thread_local VariableCreator t_creator;
}  // namespace

Variable make_variable(std::string name, const Tensor& initial, bool trainable) {
  if (t_creator) return t_creator(std::move(name), initial, trainable);
  return Variable(std::move(name), initial, trainable);
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
