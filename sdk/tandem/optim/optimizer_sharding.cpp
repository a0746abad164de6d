// Optimizer-state sharding: which replica owns each variable (ParameterLayout) and how the
// owners' updates reach the other replicas.
#include <algorithm>

#include "tandem/core/error.h"
#include "tandem/optim/optimizer.h"
#include "tandem/optim/parameter_layout.h"

namespace tandem::optim {

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

}  // namespace

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
    if (!mirrored || owners_.contains(v.id()) || index_.contains(v.id())) continue;
    if (std::find_if(fresh.begin(), fresh.end(),
                     [&](const Variable* f) { return f->id() == v.id(); }) == fresh.end())
      fresh.push_back(&v);
  }
  if (fresh.empty()) return;
  const int replicas = where.across_workers ? job_replicas().in_sync : fresh.front()->num_copies();
  std::vector<int64_t> bytes;
  for (const Variable* v : fresh) {
    TANDEM_CHECK(where.across_workers || v->num_copies() == replicas, name_,
                 ": shard_optimizer_state: variable \"", v->name(), "\" has ", v->num_copies(),
                 " copies but \"", fresh.front()->name(), "\" has ", replicas,
                 "; build the model and the optimizer in one strategy.scope()");
    const Tensor& value = v->copy(0);
    bytes.push_back(value.numel() * static_cast<int64_t>(dtype_size(value.dtype())));
  }
  TANDEM_CHECK(layout_replicas_ == 0 || layout_replicas_ == replicas, name_,
               ": shard_optimizer_state: variable \"", fresh.front()->name(),
               "\" would be laid out over ", replicas,
               " replicas but this optimizer's others are over ", layout_replicas_,
               "; use one optimizer per strategy");
  layout_replicas_ = replicas;
  // Every worker lays out the same variables alike: owners are global replica ids.
  const ParameterLayout layout(std::move(bytes), replicas);
  for (size_t i = 0; i < fresh.size(); ++i) owners_.emplace(fresh[i]->id(), layout.owner(i));
}

bool Optimizer::shards_across_workers() { return sharding().across_workers; }

int Optimizer::local_copy_of(int owner) {
  const Sharding where = sharding();
  if (!where.across_workers) return owner;
  const int local = owner - where.offset;
  return local >= 0 && local < where.local ? local : -1;
}

int Optimizer::owner_of(const Variable& variable) const {
  if (inner_ != nullptr) return inner_->owner_of(variable);
  std::lock_guard<std::mutex> lock(mutex_);
  const auto it = owners_.find(variable.id());
  return it == owners_.end() ? -1 : it->second;
}

void Optimizer::publish_updates(GradientSync& ctx, const std::vector<Tensor>& gradients,
                                const std::vector<Variable>& variables) {
  std::vector<Tensor> values;
  std::vector<int> owners;
  for (size_t i = 0; i < variables.size(); ++i) {
    if (!gradients[i].defined()) continue;
    const int owner = entry_for(variables[i]).owner;
    if (owner < 0) continue;
    values.push_back(variables[i].value_untracked());
    owners.push_back(owner);
  }
  if (!values.empty()) ctx.broadcast_from_owners(values, owners);
}

std::vector<Optimizer::SlotPlacement> Optimizer::slot_placements() const {
  if (inner_ != nullptr) return inner_->slot_placements();
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<SlotPlacement> out;
  for (const auto& entry : entries_)
    for (size_t k = 0; k < entry->slots.size(); ++k)
      out.push_back({.name = slot_names_[k] + "/" + entry->variable.name(),
                     .slot = entry->slots[k],
                     .variable = entry->variable,
                     .owner = entry->owner});
  return out;
}

ReplicaMemory Optimizer::memory_of(int replica) const {
  if (inner_ != nullptr) return inner_->memory_of(replica);
  std::lock_guard<std::mutex> lock(mutex_);
  ReplicaMemory out;
  for (const auto& entry : entries_) {
    const auto bytes = static_cast<int64_t>(entry->variable.copy(0).nbytes());
    const bool own = entry->owner < 0 || entry->owner == replica;
    out.parameters += bytes;
    if (own || shard_stage_ < 2) out.gradients += bytes;
    // A slot has its variable's shape and dtype (another worker's replica holds it undefined
    // here).
    if (own) out.optimizer_state += bytes * static_cast<int64_t>(entry->slots.size());
    if (entry->accumulator.defined()) out.optimizer_state += bytes;
  }
  return out;
}

}  // namespace tandem::optim
