// ReplicaScope: everything that binds the calling thread to one replica, installed together and
// undone together. Both ways strategy.run executes a replica (its own thread, or the caller's
// thread for a single replica) bind it through this one object.
#pragma once

#include <cstdint>
#include <optional>

#include "tandem/autograd/replica_sum.h"
#include "tandem/autograd/tape.h"
#include "tandem/autograd/variable.h"
#include "tandem/core/spans.h"
#include "tandem/distribute/replica_context.h"

namespace tandem::detail {

class ReplicaScope {
 public:
  struct Binding {
    ReplicaContext* context = nullptr;  ///< the replica's context (collectives, buckets)
    int local_replica = 0;              ///< its index among this process's replicas
    int num_local_replicas = 1;
    int first_global_replica = 0;  ///< global id of local replica 0 (worker x local replicas)
    int num_replicas_in_sync = 1;
    /// Compute threads of the replica (OpenMP team size); unset: the thread's own.
    std::optional<int> compute_threads;
    /// Installed for variables created inside run (mirrored); unset: the thread's own.
    std::optional<VariableCreator> creator;
  };

  /// Binds the calling thread: its replica context and replica binding (which copy of a
  /// mirrored variable it reads), its timeline track, its tapes' gradient listener (the
  /// context's buckets), autograd::replica_sum (the context's all-reduce), and, when given, its
  /// compute threads and variable creator.
  explicit ReplicaScope(const Binding& binding);
  /// Gives the thread back what it had before.
  ~ReplicaScope();
  ReplicaScope(const ReplicaScope&) = delete;
  ReplicaScope& operator=(const ReplicaScope&) = delete;

  /// The start of a run on this replica: the run's number (current_run_index()).
  void begin_run(uint64_t run_index) const;

 private:
  ReplicaContext* saved_context_;
  ReplicaBinding saved_binding_;
  profile::Track saved_track_;
  autograd::GradientListener* saved_listener_;
  autograd::ReplicaSumFn saved_replica_sum_;
  uint64_t saved_run_index_;
  std::optional<int> saved_compute_threads_;
  std::optional<VariableCreator> saved_creator_;
};

}  // namespace tandem::detail
