// Optimizer-state sharding: which replica owns which part of each variable (ParameterLayout),
// the update of the owned parts, and how it reaches the other replicas.
#include <algorithm>

#include "tandem/autograd/tape.h"
#include "tandem/core/error.h"
#include "tandem/core/spans.h"
#include "tandem/ops/ops.h"
#include "tandem/optim/clip.h"
#include "tandem/optim/optimizer.h"
#include "tandem/optim/parameter_layout.h"

namespace tandem::optim {

static_assert(ParameterLayout::kBlock % kNormBlock == 0,
              "a part of a variable must start on a block of the global norm's terms");

namespace {

/// The replicas a sharded optimizer lays its state out over: every worker's in a multi-worker
/// job (global ids), else the mirrored variables' copies in this process.
struct Sharding {
  bool across_workers = false;
  int local = 0;   // this process's replicas (across workers)
  int offset = 0;  // global id of its first
};

Sharding sharding() {
  const JobReplicas job = job_replicas();
  if (job.local > 0 && job.in_sync > job.local)
    return {.across_workers = true, .local = job.local, .offset = process_replica_offset()};
  return {};
}

/// Elements [begin, end) of the flattened `t`, as a 1-D view.
Tensor flat_part(const Tensor& t, int64_t begin, int64_t end) {
  return t.view_as(Shape{end - begin}, static_cast<size_t>(begin) * dtype_size(t.dtype()));
}

}  // namespace

std::vector<Tensor> GradientSync::sum_to_owners(const std::vector<Tensor>& gradients,
                                                const std::vector<Shard>& shards) {
  const std::vector<Tensor> sums = sum_across_replicas(gradients);
  std::vector<Tensor> out(shards.size());
  for (size_t k = 0; k < shards.size(); ++k) {
    const Shard& s = shards[k];
    if (s.owner < 0 || s.owner == replica_id_in_sync_group())
      out[k] = flat_part(sums[s.index], s.begin, s.end);
  }
  return out;
}

void Optimizer::assign_owners(const std::vector<Variable>& variables) {
  if (shard_stage_ == 0) return;
  const Sharding where = sharding();
  std::lock_guard<std::mutex> lock(mutex_);
  // The mirrored variables met for the first time (a variable with one copy is every
  // replica's, and one with an entry keeps how it was made). Across workers, a variable with
  // this process's count of copies (one each with one replica per worker) is the job's.
  std::vector<const Variable*> fresh;
  for (const Variable& v : variables) {
    const bool mirrored =
        v.defined() && (where.across_workers ? v.num_copies() == where.local : v.num_copies() > 1);
    if (!mirrored || layout_parts_.contains(v.id()) || index_.contains(v.id())) continue;
    if (std::find_if(fresh.begin(), fresh.end(),
                     [&](const Variable* f) { return f->id() == v.id(); }) == fresh.end())
      fresh.push_back(&v);
  }
  if (fresh.empty()) return;
  const int replicas = where.across_workers ? job_replicas().in_sync : fresh.front()->num_copies();
  std::vector<int64_t> numels, element_bytes;
  for (const Variable* v : fresh) {
    TANDEM_CHECK(where.across_workers || v->num_copies() == replicas, name_,
                 ": shard_optimizer_state: variable \"", v->name(), "\" has ", v->num_copies(),
                 " copies but \"", fresh.front()->name(), "\" has ", replicas,
                 "; build the model and the optimizer in one strategy.scope()");
    const Tensor& value = v->copy(0);
    numels.push_back(value.numel());
    element_bytes.push_back(static_cast<int64_t>(dtype_size(value.dtype())));
  }
  TANDEM_CHECK(layout_replicas_ == 0 || layout_replicas_ == replicas, name_,
               ": shard_optimizer_state: variable \"", fresh.front()->name(),
               "\" would be laid out over ", replicas,
               " replicas but this optimizer's others are over ", layout_replicas_,
               "; use one optimizer per strategy");
  layout_replicas_ = replicas;
  // Every worker lays out the same variables alike: owners are global replica ids.
  const ParameterLayout layout(numels, element_bytes, replicas);
  for (size_t i = 0; i < fresh.size(); ++i) layout_parts_.emplace(fresh[i]->id(), layout.parts(i));
}

bool Optimizer::shards_across_workers() { return sharding().across_workers; }

int Optimizer::local_copy_of(int owner) {
  if (owner < 0) return -1;
  const Sharding where = sharding();
  if (!where.across_workers) return owner;
  const int local = owner - where.offset;
  return local >= 0 && local < where.local ? local : -1;
}

int Optimizer::owner_of(const Variable& variable) const {
  if (inner_ != nullptr) return inner_->owner_of(variable);
  std::lock_guard<std::mutex> lock(mutex_);
  const auto it = layout_parts_.find(variable.id());
  return it == layout_parts_.end() ? -1 : it->second.front().owner;
}

std::vector<GradientSync::Shard> Optimizer::shards_of(const std::vector<Variable>& variables,
                                                      const std::vector<bool>& present) {
  std::vector<GradientSync::Shard> out;
  for (size_t i = 0; i < variables.size(); ++i) {
    if (!present[i]) continue;
    for (const Part& part : entry_for(variables[i]).parts)
      out.push_back({.index = i, .begin = part.begin, .end = part.end, .owner = part.owner});
  }
  return out;
}

void Optimizer::apply_sharded(GradientSync& ctx, const std::vector<Tensor>& gradients,
                              const std::vector<Variable>& variables) {
  std::vector<bool> present(variables.size());
  for (size_t i = 0; i < variables.size(); ++i) present[i] = gradients[i].defined();
  const std::vector<GradientSync::Shard> shards = shards_of(variables, present);
  std::vector<Tensor> sums;
  if (accumulation_steps_ == 1) {
    sums = ctx.sum_to_owners(gradients, shards);
  } else {
    // Micro-steps 1..N-1 add into this replica's (whole) accumulators; micro-step N adds its
    // gradients too and reduce-scatters the accumulators, as unsharded all-reduces them.
    std::vector<Tensor> accumulated;
    if (accumulate(gradients, variables, accumulated) < accumulation_steps_) return;
    sums = ctx.sum_to_owners(accumulated, shards);
    autograd::NoRecordGuard no_record;
    for (Tensor& g : sums) {
      if (!g.defined()) continue;
      g = ops::div(g,
                   Tensor::scalar(static_cast<double>(accumulation_steps_), g.dtype(), g.device()));
    }
  }
  const bool updated = apply_shards(std::move(sums), shards, variables, &ctx);
  if (accumulation_steps_ > 1) reset_accumulators();
  if (updated) gather_updated(ctx, gradients, variables);
}

void Optimizer::gather_updated(GradientSync& ctx, const std::vector<Tensor>& gradients,
                               const std::vector<Variable>& variables) {
  if (shard_stage_ == 0) return;
  std::vector<bool> present(variables.size());
  std::vector<Tensor> values;
  values.reserve(variables.size());
  for (size_t i = 0; i < variables.size(); ++i) {
    present[i] = gradients[i].defined();
    values.push_back(variables[i].value_untracked());
  }
  ctx.gather_from_owners(values, shards_of(variables, present));
}

bool Optimizer::apply_shards(std::vector<Tensor> sums,
                             const std::vector<GradientSync::Shard>& shards,
                             const std::vector<Variable>& variables, GradientSync* sync) {
  autograd::NoRecordGuard no_record;  // updates are never differentiated
  const profile::Span span(profile::Phase::kOptimizer);
  const int replica = updating_replica();
  // The wrappers' transforms first (a loss scale's decision agreed through `sync`), then
  // clipping, on every shard held here.
  if (!run_transforms(sums, sync)) return false;
  if (global_clipnorm_ && !shards.empty()) {
    std::vector<ShardExtent> extents;
    for (const GradientSync::Shard& s : shards) {
      // A shard every replica holds counts once, on replica 0.
      const bool counted = sync == nullptr || s.owner == replica || (s.owner < 0 && replica == 0);
      extents.push_back({.begin = s.begin, .end = s.end, .counted = counted});
    }
    // global_norm's dtype and device: the first gradient's (its variable's).
    const Tensor& like = variables[shards.front().index].value_untracked();
    const auto sum = [&](const Tensor& terms) {
      return sync != nullptr ? sync->sum_of_shards(terms) : terms;
    };
    sums = clip_by_global_norm(sums, extents, *global_clipnorm_, sum, like.dtype(), like.device())
               .gradients;
  }

  // This replica's shards as 1-D views of the variables and slots: the update is element-wise,
  // so each element gets stage 0's arithmetic.
  std::vector<UpdateItem> items;
  for (size_t k = 0; k < shards.size(); ++k) {
    const GradientSync::Shard& s = shards[k];
    if (!sums[k].defined() || (s.owner >= 0 && s.owner != replica)) continue;
    const Entry& entry = entry_for(variables[s.index]);
    const auto part = std::find_if(entry.parts.begin(), entry.parts.end(),
                                   [&](const Part& p) { return p.begin == s.begin; });
    TANDEM_CHECK(part != entry.parts.end() && part->end == s.end, name_, ": variable \"",
                 variables[s.index].name(), "\" has no part [", s.begin, ", ", s.end, ")");
    UpdateItem item{.gradient = sums[k],
                    .value = flat_part(variables[s.index].value_untracked(), s.begin, s.end),
                    .slots = {},
                    .decay = use_weight_decay(variables[s.index])};
    for (const Variable& slot : part->slots)
      item.slots.push_back(
          flat_part(part->owner >= 0 ? slot.copy(0) : slot.value_untracked(), 0, s.end - s.begin));
    items.push_back(std::move(item));
  }
  update_items(std::move(items));
  return true;
}

std::vector<Optimizer::SlotPlacement> Optimizer::slot_placements() const {
  if (inner_ != nullptr) return inner_->slot_placements();
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<SlotPlacement> out;
  for (const auto& entry : entries_)
    for (size_t k = 0; k < slot_names_.size(); ++k)
      for (const Part& part : entry->parts)
        out.push_back({.name = slot_names_[k] + "/" + entry->variable.name(),
                       .slot = part.slots[k],
                       .variable = entry->variable,
                       .owner = part.owner,
                       .begin = part.begin,
                       .end = part.end});
  return out;
}

bool Optimizer::load_slot(const std::string& name, const Tensor& value) {
  if (inner_ != nullptr) return inner_->load_slot(name, value);
  bool found = false;
  for (const SlotPlacement& p : slot_placements()) {
    if (p.name != name) continue;
    found = true;
    if (!p.slot.defined()) continue;  // another worker's
    TANDEM_CHECK(value.numel() == p.variable.copy(0).numel(), name_, ": slot \"", name, "\" has ",
                 value.numel(), " elements but its variable has ", p.variable.copy(0).numel());
    const Tensor source = flat_part(value, p.begin, p.end);
    for (int r = 0; r < p.slot.num_copies(); ++r) {
      Tensor copy = p.slot.copy(r);
      Tensor target = flat_part(copy, 0, p.end - p.begin);
      target.copy_from(source.device() == copy.device() ? source : source.to(copy.device()));
    }
  }
  return found;
}

ReplicaMemory Optimizer::memory_of(int replica) const {
  if (inner_ != nullptr) return inner_->memory_of(replica);
  std::lock_guard<std::mutex> lock(mutex_);
  ReplicaMemory out;
  for (const auto& entry : entries_) {
    const Tensor& value = entry->variable.copy(0);
    const auto element = static_cast<int64_t>(dtype_size(value.dtype()));
    out.parameters += static_cast<int64_t>(value.nbytes());
    for (const Part& part : entry->parts) {
      if (part.owner >= 0 && part.owner != replica) continue;
      // The summed gradient and each slot of the part (another worker's replica holds its
      // slots undefined here: counted by size).
      const int64_t bytes = (part.end - part.begin) * element;
      out.gradients += bytes;
      out.optimizer_state += bytes * static_cast<int64_t>(part.slots.size());
    }
    if (entry->accumulator.defined()) out.optimizer_state += static_cast<int64_t>(value.nbytes());
  }
  return out;
}

}  // namespace tandem::optim
