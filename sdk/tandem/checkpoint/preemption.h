// PreemptionCheckpointHandler: a job that is asked to stop (SIGTERM from a scheduler that
// preempts the machine, SIGINT from Ctrl-C) saves at the next step boundary and stops, every
// worker at the same step, as tf.distribute's PreemptionCheckpointHandler does.
//
//   tandem::PreemptionCheckpointHandler preemption(strategy, manager);
//   for (const auto& batch : dist_train) {
//     strategy.run(train_step, batch);
//     preemption.save_checkpoint_if_preempted();   // saves and exits 75 once any worker is told
//   }
//
// Any worker may get the signal: at each call the workers agree on one flag (a maximum over
// the workers, one small all-reduce; nothing with one worker), so they all save the same step
// (the chief writes) and stop together. A restarted job resumes at that step, the data
// iterator where it was (track the DistributedDataset in the Checkpoint).
#pragma once

#include <optional>
#include <string>

#include "tandem/checkpoint/checkpoint_manager.h"
#include "tandem/core/exit_status.h"

namespace tandem {

class Strategy;

/// What the handler does once a preemption was agreed.
struct PreemptionOptions {
  /// After the save, exit the process with kPreemptedExitStatus (75), as TensorFlow's handler
  /// exits; false: save_checkpoint_if_preempted returns true and the caller stops.
  bool exit_process = true;
};

/// Saves at the next step boundary and stops when any worker is told to stop (SIGTERM,
/// SIGINT), every worker at the same step (tf.distribute's PreemptionCheckpointHandler):
///
///   tandem::PreemptionCheckpointHandler preemption(strategy, manager);
///   for (const auto& batch : dist_train) {
///     strategy.run(train_step, batch);
///     preemption.save_checkpoint_if_preempted();  // saves and exits 75 once any worker is told
///   }
class PreemptionCheckpointHandler {
 public:
  /// Installs handlers for SIGTERM and SIGINT that only set a flag (any number of SIGTERMs;
  /// a second Ctrl-C ends the program at once). The destructor puts the previous handlers
  /// back unless a stop was requested: then the flag-setting handlers stay, so that more
  /// SIGTERMs while the program saves and exits 75 cannot kill it. One handler at a time per
  /// process.
  PreemptionCheckpointHandler(const Strategy& strategy, CheckpointManager& manager,
                              const PreemptionOptions& options = {});
  ~PreemptionCheckpointHandler();
  PreemptionCheckpointHandler(const PreemptionCheckpointHandler&) = delete;
  PreemptionCheckpointHandler& operator=(const PreemptionCheckpointHandler&) = delete;

  /// Call it where a step ends, on every worker (outside strategy.run). When any worker was
  /// signalled: saves through the manager (every worker takes part; the chief writes, and
  /// waits for the file to be durable when the manager saves asynchronously) and
  /// exits with kPreemptedExitStatus, or returns true with exit_process = false. Otherwise
  /// returns false.
  bool save_checkpoint_if_preempted();
  /// The agreement alone, without a save: true when any worker was signalled (every worker
  /// calls it at the same point; one small all-reduce across workers). For a loop that has
  /// just saved, such as at an epoch's end.
  bool job_preempted() const;
  /// Whether this process got the signal (the job's agreement comes at the next
  /// save_checkpoint_if_preempted).
  bool signalled() const;
  /// The checkpoint written by the last save, when one was.
  const std::optional<std::string>& saved() const { return saved_; }
  /// As if this process had been signalled (for tests and for programs that learn of a
  /// preemption some other way, such as a cloud's metadata server).
  static void request_preemption();

 private:
  const Strategy& strategy_;
  CheckpointManager& manager_;
  PreemptionOptions options_;
  std::optional<std::string> saved_;
};

}  // namespace tandem
