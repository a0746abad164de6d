// Optimizer: argument checks, clipping, learning rate, slot creation and the update counter
// around each optimizer's update_step; the replica-context apply_gradients sums the gradients
// across the replicas (through GradientSync) before the same update.
#include "tandem/optim/optimizer.h"

#include <algorithm>
#include <iterator>

#include "tandem/autograd/tape.h"
#include "tandem/core/check_numerics.h"
#include "tandem/core/error.h"
#include "tandem/core/internal/json.h"
#include "tandem/core/logging.h"
#include "tandem/core/spans.h"
#include "tandem/ops/ops.h"
#include "tandem/optim/clip.h"
#include "tandem/optim/internal/json_number.h"

namespace tandem::optim {

Optimizer::Optimizer(std::string name, LearningRate learning_rate,
                     std::optional<double> global_clipnorm, int gradient_accumulation_steps,
                     int shard_optimizer_state, std::vector<std::string> slot_names)
    : name_(std::move(name)),
      learning_rate_(std::move(learning_rate)),
      global_clipnorm_(global_clipnorm),
      slot_names_(std::move(slot_names)),
      accumulation_steps_(gradient_accumulation_steps),
      shard_stage_(shard_optimizer_state),
      iterations_(make_variable("iteration", Tensor::scalar(0, DType::kInt64),
                                /*trainable=*/false)) {
  TANDEM_CHECK(!global_clipnorm_ || *global_clipnorm_ > 0.0, name_,
               ": global_clipnorm must be positive, got ", global_clipnorm_.value_or(0.0));
  TANDEM_CHECK(accumulation_steps_ >= 1, name_, ": gradient_accumulation_steps must be >= 1, got ",
               accumulation_steps_);
  TANDEM_CHECK(shard_stage_ >= 0 && shard_stage_ <= 2, name_,
               ": shard_optimizer_state must be 0 (every replica holds every slot), 1 (each "
               "holds its own variables' slots) or 2 (and their summed gradients), got ",
               shard_stage_);
  if (accumulation_steps_ > 1) {
    micro_step_ = make_variable("grad_accum/micro_step", Tensor::scalar(0, DType::kInt64),
                                /*trainable=*/false);
  }
  keep_on_host(iterations_);
  if (micro_step_.defined()) keep_on_host(micro_step_);
}

Optimizer::Optimizer(std::string name, Optimizer& inner)
    : name_(std::move(name)),
      learning_rate_(inner.learning_rate()),  // unused: a wrapper reads the inner one's
      accumulation_steps_(1),
      inner_(&inner) {
  TANDEM_CHECK(inner.wrapper_ == nullptr, name_, ": optimizer \"", inner.name(),
               "\" is already wrapped by another optimizer (\"", inner.wrapper_->name(), "\")");
  inner.wrapper_ = this;
}

Optimizer::~Optimizer() {
  if (inner_ != nullptr) inner_->wrapper_ = nullptr;
}

Tensor Optimizer::scale_loss(const Tensor& loss) const { return loss; }

bool Optimizer::transform_gradients(std::vector<Tensor>& /*gradients*/, GradientSync* /*shards*/) {
  return true;
}

void Optimizer::keep_on_host(Variable& counter) {
  // The counters are read on the host at every update (learning rate, accumulation): copies on
  // a GPU would make every replica wait for its stream once per step. One CPU copy per replica.
  std::vector<Tensor> copies;
  for (int r = 0; r < counter.num_copies(); ++r)
    copies.push_back(counter.copy(r).to(Device::cpu()));
  counter.set_copies(std::move(copies));
}

int64_t Optimizer::iterations() const {
  if (inner_ != nullptr) return inner_->iterations();
  return iterations_.value_untracked().item<int64_t>();
}

void Optimizer::set_iterations(int64_t iterations) {
  if (inner_ != nullptr) return inner_->set_iterations(iterations);
  TANDEM_CHECK(iterations >= 0, name_, ": iterations must be >= 0, got ", iterations);
  const Tensor value = Tensor::scalar(static_cast<double>(iterations), DType::kInt64);
  for (int r = 0; r < iterations_.num_copies(); ++r) {
    Tensor copy = iterations_.copy(r);
    copy.copy_from(value);
  }
}

int64_t Optimizer::micro_step() const {
  if (inner_ != nullptr) return inner_->micro_step();
  if (accumulation_steps_ == 1) return 0;
  return micro_step_.value_untracked().item<int64_t>();
}

void Optimizer::set_micro_step(int64_t micro_step) {
  if (inner_ != nullptr) return inner_->set_micro_step(micro_step);
  TANDEM_CHECK(micro_step >= 0 && micro_step < accumulation_steps_, name_,
               ": micro_step must be in [0, gradient_accumulation_steps = ", accumulation_steps_,
               "), got ", micro_step);
  if (accumulation_steps_ == 1) return;
  const Tensor value = Tensor::scalar(static_cast<double>(micro_step), DType::kInt64);
  for (int r = 0; r < micro_step_.num_copies(); ++r) {
    Tensor copy = micro_step_.copy(r);
    copy.copy_from(value);
  }
}

double Optimizer::current_learning_rate() const { return learning_rate()(iterations()); }

namespace {
/// Whether the update_step call this thread is in gets weight decay (apply_update sets it per
/// group; every replica thread runs its own update).
thread_local bool decay_group = true;
}  // namespace

bool Optimizer::weight_decay_applies() { return decay_group; }

void Optimizer::exclude_from_weight_decay(const std::vector<Variable>& variables,
                                          const std::vector<std::string>& name_parts) {
  if (inner_ != nullptr) return inner_->exclude_from_weight_decay(variables, name_parts);
  std::lock_guard<std::mutex> lock(mutex_);
  for (const Variable& v : variables) {
    TANDEM_CHECK(v.defined(), name_, ": exclude_from_weight_decay got an undefined variable");
    no_decay_.insert(v.id());
  }
  for (const std::string& part : name_parts) {
    TANDEM_CHECK(!part.empty(), name_, ": exclude_from_weight_decay got an empty name part");
    no_decay_names_.push_back(part);
  }
}

bool Optimizer::use_weight_decay(const Variable& variable) const {
  if (inner_ != nullptr) return inner_->use_weight_decay(variable);
  std::lock_guard<std::mutex> lock(mutex_);
  if (no_decay_.count(variable.id()) != 0) return false;
  for (const std::string& part : no_decay_names_)
    if (variable.name().find(part) != std::string::npos) return false;
  return true;
}

Optimizer::Entry& Optimizer::entry_for(const Variable& variable) {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto it = index_.find(variable.id());
  if (it != index_.end()) return *entries_[it->second];
  auto entry = std::make_unique<Entry>();
  entry->variable = variable;
  const Tensor& value = variable.value_untracked();
  const auto layout = layout_parts_.find(variable.id());
  if (layout != layout_parts_.end()) {
    // Sharded: each part's slots live on its owner alone, one copy each (none here when the
    // owner is another worker's replica).
    for (const ParameterLayout::Part& p : layout->second) {
      Part part{.owner = p.owner, .begin = p.begin, .end = p.end, .slots = {}};
      const int local = local_copy_of(part.owner);
      const bool whole = part.begin == 0 && part.end == value.numel();
      for (const std::string& slot : slot_names_) {
        if (local < 0) {
          part.slots.emplace_back();
          continue;
        }
        const Tensor& copy = variable.copy(local);
        part.slots.emplace_back(
            slot + "/" + variable.name(),
            whole ? Tensor::zeros_like(copy)
                  : Tensor::zeros(Shape{part.end - part.begin}, copy.dtype(), copy.device()),
            /*trainable=*/false);
      }
      entry->parts.push_back(std::move(part));
    }
  } else {
    Part part{.owner = -1, .begin = 0, .end = value.numel(), .slots = {}};
    for (const std::string& slot : slot_names_) {
      part.slots.push_back(make_variable(slot + "/" + variable.name(), Tensor::zeros_like(value),
                                         /*trainable=*/false));
    }
    entry->parts.push_back(std::move(part));
  }
  if (accumulation_steps_ > 1) {
    entry->accumulator = make_variable("grad_accum/" + variable.name(), Tensor::zeros_like(value),
                                       /*trainable=*/false);
  }
  index_.emplace(variable.id(), entries_.size());
  entries_.push_back(std::move(entry));
  return *entries_.back();
}

void Optimizer::build(const std::vector<Variable>& variables) {
  if (inner_ != nullptr) return inner_->build(variables);
  for (const Variable& v : variables)
    TANDEM_CHECK(v.defined(), name_, ".build: an undefined variable");
  assign_owners(variables);
  for (const Variable& v : variables) entry_for(v);
}

void Optimizer::check_pairs(const std::vector<Tensor>& gradients,
                            const std::vector<Variable>& variables) {
  TANDEM_CHECK(gradients.size() == variables.size(), name_, ".apply_gradients: ", gradients.size(),
               " gradients for ", variables.size(),
               " variables; pass one gradient per variable, in order");
  bool any_defined = false;
  for (size_t i = 0; i < variables.size(); ++i) {
    const Variable& var = variables[i];
    TANDEM_CHECK(var.defined(), name_, ".apply_gradients: variable ", i, " is undefined");
    const Tensor& g = gradients[i];
    if (!g.defined()) {
      std::lock_guard<std::mutex> lock(mutex_);
      if (warned_.insert(var.id()).second) {
        TANDEM_LOG_WARNING(name_, ": no gradient for variable \"", var.name(),
                           "\" (the loss does not depend on it); it is left unchanged");
      }
      continue;
    }
    any_defined = true;
    const Tensor& value = var.value_untracked();
    TANDEM_CHECK(g.shape() == value.shape(), name_,
                 ".apply_gradients: the gradient for variable \"", var.name(), "\" has shape ",
                 g.shape(), " but the variable has shape ", value.shape());
    TANDEM_CHECK(g.dtype() == value.dtype(), name_,
                 ".apply_gradients: the gradient for variable \"", var.name(), "\" is ", g.dtype(),
                 " but the variable is ", value.dtype());
  }
  if (!variables.empty()) {
    TANDEM_CHECK(any_defined, name_, ".apply_gradients: no gradient is defined for any of the ",
                 variables.size(), " variables (first: \"", variables[0].name(),
                 "\"); was the loss computed under the GradientTape from these variables?");
  }
}

void Optimizer::check_numerics(const std::vector<Tensor>& gradients,
                               const std::vector<Variable>& variables,
                               const std::string& replica) const {
  // Under a loss scale a non-finite gradient is expected now and then: that update is skipped.
  if (!check_numerics_enabled()) return;
  for (const Optimizer* w = wrapper_; w != nullptr; w = w->wrapper_)
    if (w->expects_non_finite_gradients()) return;
  for (size_t i = 0; i < gradients.size(); ++i) {
    const ops::NonFinite found = ops::count_non_finite(gradients[i]);
    if (found.total() == 0) continue;
    // The step is the update these gradients are for (iterations counts updates done).
    std::string step = tandem::detail::str_cat("step ", iterations() + 1);
    if (accumulation_steps_ > 1)
      step += tandem::detail::str_cat(" (micro-step ", micro_step() + 1, " of ",
                                      accumulation_steps_, ")");
    TANDEM_THROW("TANDEM_CHECK_NUMERICS: non-finite gradient for ", variables[i].name(),
                 replica.empty() ? "" : " on ", replica, " at ", step, " (", found.nan, " NaN, ",
                 found.inf, " Inf of ", gradients[i].numel(), " values)");
  }
}

void Optimizer::apply_gradients(const std::vector<Tensor>& gradients,
                                const std::vector<Variable>& variables,
                                ApplyGradientsOptions options) {
  if (inner_ != nullptr) return inner_->apply_gradients(gradients, variables, options);
  // Inside a replica function of several replicas this would update each replica's copies with
  // its own gradients alone (tf.distribute would sum them): the replicas would drift apart.
  const ReplicaBinding binding = current_replica_binding();
  TANDEM_CHECK(binding.num_replicas_in_sync <= 1 || options.skip_gradients_aggregation, name_,
               ".apply_gradients(gradients, variables) was called inside strategy.run of ",
               binding.num_replicas_in_sync,
               " replicas without the replica context, so the gradients would not be summed "
               "across the "
               "replicas; pass the context the replica function received: "
               "optimizer.apply_gradients(ctx, gradients, variables) (or, for gradients already "
               "summed with ctx.all_reduce, add {.skip_gradients_aggregation = true})");
  check_pairs(gradients, variables);
  assign_owners(variables);
  TANDEM_CHECK(binding.num_replicas <= 1 || shard_stage_ == 0, name_,
               ".apply_gradients(gradients, variables) inside strategy.run cannot send the "
               "updated variables from their owners (shard_optimizer_state = ",
               shard_stage_,
               "); pass the context: optimizer.apply_gradients(ctx, gradients, variables)");
  // Every worker refuses alike: whether this one owns the variables must not decide it.
  TANDEM_CHECK(shard_stage_ == 0 || !shards_across_workers(), name_,
               ".apply_gradients(gradients, variables) outside strategy.run cannot update "
               "variables whose optimizer state other workers hold (shard_optimizer_state = ",
               shard_stage_,
               " in a multi-worker job); update inside strategy.run: "
               "optimizer.apply_gradients(ctx, gradients, variables)");
  check_numerics(gradients, variables, "");
  // Cross-replica context (outside strategy.run, or inside merge_call) with mirrored variables:
  // the same update on every replica's copies of the variables, slots and counters, as
  // tf.distribute's strategy.extended.update does, so the copies never drift apart.
  int copies = iterations_.num_copies();
  for (const Variable& v : variables) copies = std::max(copies, v.num_copies());
  if (binding.num_replicas > 1 || copies <= 1) {
    update_or_accumulate(gradients, variables);
    return;
  }
  for (int r = 0; r < copies; ++r) {
    set_current_replica_binding({.replica_id = r,
                                 .num_replicas = copies,
                                 .first_global_id = process_replica_offset(),
                                 .num_replicas_in_sync = binding.num_replicas_in_sync});
    try {
      std::vector<Tensor> on_copy(gradients.size());
      for (size_t i = 0; i < gradients.size(); ++i) {
        if (!gradients[i].defined()) continue;
        const Device device =
            variables[i].copy(std::min(r, variables[i].num_copies() - 1)).device();
        on_copy[i] = gradients[i].device() == device ? gradients[i] : gradients[i].to(device);
      }
      update_or_accumulate(on_copy, variables);
    } catch (...) {
      set_current_replica_binding(binding);
      throw;
    }
  }
  set_current_replica_binding(binding);
  // Sharded: each copy updated its own parts only; the owners' values go to the others.
  if (shard_stage_ == 0) return;
  for (size_t i = 0; i < variables.size(); ++i) {
    if (!gradients[i].defined()) continue;
    const Tensor& whole = variables[i].copy(0);
    const size_t element = dtype_size(whole.dtype());
    for (const Part& part : entry_for(variables[i]).parts) {
      const int owner = local_copy_of(part.owner);
      if (owner < 0) continue;
      const Shape shape{part.end - part.begin};
      const size_t at = static_cast<size_t>(part.begin) * element;
      const Tensor from = variables[i].copy(owner).view_as(shape, at);
      for (int r = 0; r < variables[i].num_copies(); ++r) {
        if (r == owner) continue;
        Tensor to = variables[i].copy(r).view_as(shape, at);
        to.copy_from(from);
      }
    }
  }
}

void Optimizer::update_or_accumulate(const std::vector<Tensor>& gradients,
                                     const std::vector<Variable>& variables) {
  if (accumulation_steps_ == 1) {
    apply_update(gradients, variables);
    return;
  }
  std::vector<Tensor> accumulated;
  if (accumulate(gradients, variables, accumulated) == accumulation_steps_)
    finish_accumulation(std::move(accumulated), variables);
}

std::vector<std::pair<std::string, std::string>> Optimizer::describe_update(
    const std::vector<Variable>& variables) const {
  std::vector<std::pair<std::string, std::string>> out;
  out.emplace_back("optimizer", name_);
  // Each hyper-parameter by its Keras name (learning_rate, beta_1, global_clipnorm, ...).
  const tandem::detail::Json config = tandem::detail::JsonReader::parse(config_json());
  for (const auto& [key, value] : config.object)
    if (key != "name") out.emplace_back(name_ + " " + key, tandem::detail::to_text(value));
  if (shard_stage_ > 0) out.emplace_back("shard_optimizer_state", std::to_string(shard_stage_));
  out.emplace_back("number of variables", std::to_string(variables.size()));
  for (size_t i = 0; i < variables.size(); ++i) {
    const Tensor& value = variables[i].value_untracked();
    std::string text = tandem::detail::str_cat("\"", variables[i].name(), "\" ", value.shape(), " ",
                                               value.dtype());
    // Sharded: who owns which elements (every worker must lay the state out alike).
    std::lock_guard<std::mutex> lock(mutex_);
    const auto it = layout_parts_.find(variables[i].id());
    if (it != layout_parts_.end())
      for (const ParameterLayout::Part& p : it->second)
        text += tandem::detail::str_cat(" [", p.begin, ", ", p.end, ") on replica ", p.owner);
    out.emplace_back(tandem::detail::str_cat("variable ", i), std::move(text));
  }
  return out;
}

void Optimizer::apply_gradients(GradientSync& ctx, const std::vector<Tensor>& gradients,
                                const std::vector<Variable>& variables) {
  if (inner_ != nullptr) return inner_->apply_gradients(ctx, gradients, variables);
  check_pairs(gradients, variables);
  assign_owners(variables);
  if (shard_stage_ > 0) {
    const ReplicaBinding binding = current_replica_binding();
    int replicas = 0;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      replicas = layout_replicas_;
    }
    TANDEM_CHECK(replicas == 0 || binding.num_replicas_in_sync == replicas, name_,
                 ": shard_optimizer_state = ", shard_stage_, ": the state is laid out over ",
                 replicas, " replicas but this strategy.run has ", binding.num_replicas_in_sync,
                 " in sync; use the optimizer with the strategy whose scope built it");
    // The entries (and slots) in the variables' order on every replica and worker, before a
    // replica's update makes its own first: the checkpoint gathers slots in this order.
    for (const Variable& v : variables) entry_for(v);
  }
  // Before this optimizer's first update on each replica: workers that build another model or
  // optimizer (another job's worker, another version of the program) raise here, by name.
  bool first = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    first = agreed_.insert(ctx.replica_id_in_sync_group()).second;
  }
  if (first) ctx.agree_before_first_update(describe_update(variables));
  // Before the all-reduce, so the replica that produced a NaN or Inf is the one named. Off (the
  // default), this is one flag read: not even the replica's name is built.
  if (check_numerics_enabled())
    check_numerics(gradients, variables,
                   tandem::detail::str_cat("replica ", ctx.replica_id_in_sync_group()));
  if (shard_stage_ > 0 && ctx.reduces_to_owners()) {
    apply_sharded(ctx, gradients, variables);
    return;
  }
  // Otherwise the sums are unsharded's (sharded, each replica then updates its own parts and
  // they are gathered).
  if (accumulation_steps_ == 1) {
    // One batched all-reduce (SUM) of every defined gradient: each replica divided its loss by
    // the global batch, so the sum is the global gradient. Every replica then holds the same
    // gradients, clips them identically (clipping happens inside the update, after this
    // reduction) and applies the same update to its own copies of the variables and slots.
    std::vector<bool> row_sparse(variables.size());
    for (size_t i = 0; i < variables.size(); ++i)
      row_sparse[i] = variables[i].row_sparse_gradient();
    if (apply_update(ctx.sum_across_replicas(gradients, row_sparse), variables))
      gather_updated(ctx, gradients, variables);
    return;
  }
  // Micro-steps 1..N-1 only add into this replica's accumulators: no collective. Micro-step N
  // all-reduces the accumulators (one batched call, or the gradient buckets its backward pass
  // filled with accumulator + gradient); every replica then divides by N and applies the same
  // update.
  if (micro_step() + 1 < accumulation_steps_) {
    std::vector<Tensor> accumulated;
    const int64_t done = accumulate(gradients, variables, accumulated);
    const bool last = done + 1 == accumulation_steps_;
    std::vector<Tensor> accumulators;
    if (last)
      for (const Variable& v : variables)
        accumulators.push_back(entry_for(v).accumulator.value_untracked());
    ctx.expect_micro_step(last, accumulators);
    return;
  }
  // Micro-step N: the sync adds this micro-step's gradients to the accumulators, once (the
  // buckets packed accumulator + gradient during the backward pass, or it adds them before one
  // batched all-reduce).
  std::vector<Tensor> accumulators(variables.size());
  for (size_t i = 0; i < variables.size(); ++i)
    if (gradients[i].defined())
      accumulators[i] = entry_for(variables[i]).accumulator.value_untracked();
  if (finish_accumulation(ctx.sum_accumulated(gradients, accumulators), variables))
    gather_updated(ctx, gradients, variables);
  ctx.expect_micro_step(false, {});  // micro-step 1 of the next update (N > 1)
}

const std::vector<Tensor>& GradientSync::add_into(const std::vector<Tensor>& accumulators,
                                                  const std::vector<Tensor>& gradients) {
  autograd::NoRecordGuard no_record;
  for (size_t i = 0; i < accumulators.size(); ++i) {
    if (!accumulators[i].defined() || !gradients[i].defined()) continue;
    Tensor acc = accumulators[i];
    ops::add_(acc, gradients[i]);
  }
  return accumulators;
}

int Optimizer::updating_replica() {
  const ReplicaBinding binding = current_replica_binding();
  // Owners are global replica ids; outside strategy.run, this process's copies are numbered
  // from its first replica's.
  return (binding.num_replicas_in_sync > 1 ? binding.first_global_id : process_replica_offset()) +
         binding.replica_id;
}

bool Optimizer::apply_update(const std::vector<Tensor>& gradients,
                             const std::vector<Variable>& variables) {
  autograd::NoRecordGuard no_record;  // updates are never differentiated
  if (shard_stage_ > 0) {
    // Every gradient is here whole (cross-replica context): the shards are views of them.
    std::vector<bool> present(variables.size());
    for (size_t i = 0; i < variables.size(); ++i) present[i] = gradients[i].defined();
    const std::vector<GradientSync::Shard> shards = shards_of(variables, present);
    std::vector<Tensor> sums;
    for (const GradientSync::Shard& shard : shards) {
      const Tensor& g = gradients[shard.index];
      sums.push_back(g.view_as(Shape{shard.end - shard.begin},
                               static_cast<size_t>(shard.begin) * dtype_size(g.dtype())));
    }
    return apply_shards(std::move(sums), shards, variables, nullptr);
  }
  const profile::Span span(profile::Phase::kOptimizer);
  std::vector<Tensor> grads = gradients;
  if (!run_transforms(grads, nullptr)) return false;
  if (global_clipnorm_) grads = clip_by_global_norm(grads, *global_clipnorm_).gradients;
  std::vector<UpdateItem> items;
  for (size_t i = 0; i < variables.size(); ++i) {
    if (!grads[i].defined()) continue;
    UpdateItem item{.gradient = grads[i],
                    .value = variables[i].value_untracked(),
                    .slots = {},
                    .decay = use_weight_decay(variables[i])};
    for (const Variable& slot : entry_for(variables[i]).parts.front().slots)
      item.slots.push_back(slot.value_untracked());
    items.push_back(std::move(item));
  }
  update_items(std::move(items));
  return true;
}

bool Optimizer::run_transforms(std::vector<Tensor>& gradients, GradientSync* sync) {
  // Outermost first: a loss scale unscales the gradients (so clipping sees the true ones), or
  // skips the update when they are not finite: iterations() does not count it (Keras 3).
  std::vector<Optimizer*> wrappers;
  for (Optimizer* w = wrapper_; w != nullptr; w = w->wrapper_) wrappers.push_back(w);
  for (auto w = wrappers.rbegin(); w != wrappers.rend(); ++w)
    if (!(*w)->transform_gradients(gradients, sync)) return false;
  return true;
}

void Optimizer::update_items(std::vector<UpdateItem> items) {
  const int64_t done = iterations();
  const double rate = learning_rate_(done);
  struct Group {
    std::vector<Tensor> gradients, values;
    std::vector<std::vector<Tensor>> slots;
  };
  // One group per dtype; tensors excluded from weight decay form groups of their own.
  std::vector<std::pair<std::pair<DType, bool>, Group>> groups;
  for (UpdateItem& item : items) {
    const std::pair<DType, bool> key{item.value.dtype(), item.decay};
    auto it =
        std::find_if(groups.begin(), groups.end(), [&](const auto& g) { return g.first == key; });
    if (it == groups.end()) {
      Group group;
      group.slots.resize(slot_names_.size());
      groups.emplace_back(key, std::move(group));
      it = std::prev(groups.end());
    }
    Group& group = it->second;
    group.gradients.push_back(std::move(item.gradient));
    group.values.push_back(std::move(item.value));
    for (size_t k = 0; k < item.slots.size(); ++k)
      group.slots[k].push_back(std::move(item.slots[k]));
  }
  for (auto& [key, group] : groups) {
    // Keras casts the (float32) learning rate to the variable's dtype.
    const double lr =
        key.first == DType::kFloat32 ? static_cast<double>(static_cast<float>(rate)) : rate;
    decay_group = key.second;
    update_step(group.gradients, group.values, group.slots, lr, done + 1);
  }
  decay_group = true;
  iterations_.assign(Tensor::scalar(static_cast<double>(done + 1), DType::kInt64));
}

std::vector<std::pair<std::string, Variable>> Optimizer::slot_variables() const {
  if (inner_ != nullptr) return inner_->slot_variables();
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<std::pair<std::string, Variable>> out;
  for (const auto& entry : entries_) {
    for (size_t k = 0; k < slot_names_.size(); ++k)
      out.emplace_back(slot_names_[k] + "/" + entry->variable.name(),
                       entry->parts.size() == 1 ? entry->parts.front().slots[k] : Variable());
  }
  return out;
}

Variable Optimizer::slot(const Variable& variable, const std::string& slot_name) const {
  if (inner_ != nullptr) return inner_->slot(variable, slot_name);
  std::lock_guard<std::mutex> lock(mutex_);
  const auto it = index_.find(variable.id());
  TANDEM_CHECK(it != index_.end(), name_, ": variable \"", variable.name(),
               "\" has no slots yet (build the optimizer or apply a gradient first)");
  const Entry& entry = *entries_[it->second];
  for (size_t k = 0; k < slot_names_.size(); ++k) {
    if (slot_names_[k] == slot_name)
      return entry.parts.size() == 1 ? entry.parts.front().slots[k] : Variable();
  }
  std::string names;
  for (const std::string& s : slot_names_) {
    if (!names.empty()) names += ", ";
    names += s;
  }
  TANDEM_THROW(name_, ": no slot \"", slot_name,
               "\" (this optimizer's slots: ", names.empty() ? std::string("none") : names, ")");
}

std::string Optimizer::base_config_json() const {
  const std::string clip = global_clipnorm_ ? detail::json_number(*global_clipnorm_) : "null";
  // Keras writes null for "no accumulation".
  const std::string steps =
      accumulation_steps_ > 1 ? std::to_string(accumulation_steps_) : std::string("null");
  return "\"name\": \"" + name_ + "\", \"learning_rate\": " + learning_rate_.schedule().to_json() +
         ", \"global_clipnorm\": " + clip + ", \"gradient_accumulation_steps\": " + steps;
}

std::string Optimizer::config_json() const {
  std::string out = "{";
  out += base_config_json();
  out += "}";
  return out;
}

}  // namespace tandem::optim
