// Strategy::Impl: what a strategy is made of (its replicas' devices, their collectives, replica
// contexts and threads), shared by strategy.cpp (construction, scope, variables, input) and
// cross_replica.cpp (reduce, gather, the cross-worker calls).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tandem/collectives/internal/strategy_collectives.h"
#include "tandem/core/workers.h"
#include "tandem/distribute/internal/replica_threads.h"
#include "tandem/distribute/internal/state.h"
#include "tandem/distribute/replica_context.h"
#include "tandem/distribute/strategy.h"

namespace tandem {

struct Strategy::Impl {
  std::string name;
  std::vector<Device> devices;  // this process's replicas
  bool is_default = false;
  // The replicas' collectives, and the workers of the job when the strategy spans them.
  std::unique_ptr<collectives::StrategyCollectives> collectives;
  // Makes a variable's initial value the chief's on every worker (set with Scope::kWorkers).
  // Called only where every worker creates the same variables in the same order (the main
  // thread, in scope()).
  std::function<Tensor(const std::string& name, const Tensor&)> broadcast_initial;
  std::shared_ptr<WorkerGroup> previous_worker_group;  // given back when this strategy ends
  CommunicationOptions communication;
  detail::MergeState merge;
  std::vector<std::unique_ptr<ReplicaContext>> contexts;
  std::unique_ptr<detail::ReplicaThreads> replicas;  // last: its threads use everything above

  int num_replicas() const { return static_cast<int>(devices.size()); }
  int num_workers() const { return collectives->num_workers(); }
  int worker_index() const { return collectives->worker_index(); }
};

namespace detail {

/// Raises unless the calling thread is in cross-replica context (outside strategy.run); `what`
/// names the call ("reduce", ...).
void check_cross_replica(const char* what);

}  // namespace detail

}  // namespace tandem
