// Internal to the distribute layer: the merge_call state the replicas of one strategy share,
// the per-thread replica context and run index (replica_context.cpp), the strategy whose scope
// is open (strategy.cpp), and the guard that enters cross-replica context.
#pragma once

#include <cstdint>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tandem/autograd/variable.h"
#include "tandem/distribute/replica_context.h"

namespace tandem::detail {

struct MergeState {
  std::vector<const void*> arguments;  // per replica: its argument tuple for the open merge_call
  std::shared_ptr<void> result;        // the merge function's result, read by every replica
  std::exception_ptr error;            // what the merge function raised
};

/// Sets the calling thread's replica context (nullptr: cross-replica context).
void set_current_replica_context(ReplicaContext* context);

/// The strategy whose scope is open on the calling thread, or nullptr.
const Strategy* current_scope_strategy();

/// Which strategy.run (1, 2, ...) the calling replica thread is running; 0 outside run.
uint64_t current_run_index();
/// Sets it (the replica threads, at the start of each run).
void set_current_run_index(uint64_t run_index);

/// The global batch size the calling replica thread last passed to compute_average_loss
/// explicitly (nothing when it never did, or let the function infer it).
std::optional<int64_t> last_global_batch_size();
void set_last_global_batch_size(int64_t global_batch_size);

/// The examples of the step the calling replica thread runs, over every replica and worker, as
/// the distributed dataset that delivered its batch knows them (data::Batch::global_batch_size;
/// 0: not known). strategy.run sets it for each run (set_step_global_batch_size, strategy.h).
int64_t step_global_batch_size();

/// The message of an exception_ptr ("an exception of unknown type" for non-std exceptions).
std::string describe_exception(const std::exception_ptr& error);

/// While alive, the calling thread is in cross-replica context: no replica context, and a
/// replica binding of {0, 1} (reads of mirrored variables see replica 0's copy).
class CrossReplicaGuard {
 public:
  CrossReplicaGuard() : context_(current_replica_context()), binding_(current_replica_binding()) {
    set_current_replica_context(nullptr);
    set_current_replica_binding({0, 1, 0});
  }
  ~CrossReplicaGuard() {
    set_current_replica_context(context_);
    set_current_replica_binding(binding_);
  }
  CrossReplicaGuard(const CrossReplicaGuard&) = delete;
  CrossReplicaGuard& operator=(const CrossReplicaGuard&) = delete;

 private:
  ReplicaContext* context_;
  ReplicaBinding binding_;
};

}  // namespace tandem::detail
