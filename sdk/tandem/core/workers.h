// WorkerGroup: the processes of a multi-worker job, and the library's one way to them outside
// the strategy itself (metrics that combine every worker's state, checkpoints that gather it to
// the chief or restore from the chief's file, the profiler that gathers every worker's trace).
// MultiWorkerMirroredStrategy installs one for the process while it lives; with one worker
// there is none.
#pragma once

#include <memory>
#include <utility>
#include <vector>

namespace tandem {

/// The processes of a multi-worker job, as the library reaches them outside the strategy. sum,
/// all_gather and the broadcasts are collectives: every worker makes them, in the same
/// order.
class WorkerGroup {
 public:
  virtual ~WorkerGroup() = default;
  /// How many processes the job has.
  virtual int num_workers() const = 0;
  /// This process's worker index; 0 is the chief.
  virtual int worker_index() const = 0;
  /// Sums `values` element-wise over every worker, in place. Every worker must call it, with
  /// as many values; `label` names the call in errors.
  virtual void sum(std::vector<double>& values, const char* label) = 0;
  /// Every worker's bytes, in worker order. Every worker must call it.
  virtual std::vector<std::vector<char>> all_gather(const std::vector<char>& mine,
                                                    const char* label) = 0;
  /// Worker `worker`'s `bytes` on every worker (what the others pass is ignored). Every worker
  /// must call it, with the same `worker`.
  virtual std::vector<char> broadcast_from(int worker, std::vector<char> bytes,
                                           const char* label) = 0;
  /// The chief's `bytes` on every worker: broadcast_from(0, ...).
  std::vector<char> broadcast_from_chief(std::vector<char> bytes, const char* label) {
    return broadcast_from(0, std::move(bytes), label);
  }
};

/// The job's workers while a multi-worker strategy lives in this process; null otherwise.
std::shared_ptr<WorkerGroup> worker_group();
/// Installs `group` (null removes it) and returns the previous one. Strategies call this.
std::shared_ptr<WorkerGroup> set_worker_group(std::shared_ptr<WorkerGroup> group);

}  // namespace tandem
