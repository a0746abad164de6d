// The step timeline's summary: where each replica's time went in the steps between two
// summaries (mean milliseconds per step by phase), the scaling estimate, and the advice rules
// with the figures that triggered them. summarize() makes one from recorded spans; the Profiler
// (profiler.h) calls it at each epoch's end.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tandem/core/spans.h"
#include "tandem/optim/optimizer.h"

namespace tandem::profile {

/// Where one replica's steps went, as mean milliseconds per step (all of them add up to the
/// step time; `other` is the training loop's own time between runs).
struct ReplicaBreakdown {
  int replica = 0;      ///< the replica's index in this worker
  std::string device;   ///< the replica's device ("cpu:0", "cuda:1")
  double input_ms = 0;  ///< the loop waited for the batch (shared by every replica)
  /// Forward, backward, the loss: the task less its time outside compute, the figure
  /// strategy.run measured (Event::compute_ns) and SplitPolicy::kBySpeed splits by.
  double compute_ms = 0;
  double comm_wait_ms = 0;  ///< in collectives waiting for slower peers
  double comm_data_ms = 0;  ///< in collectives moving and reducing data
  /// Gradient buckets: waiting in apply_gradients for buckets still in flight (the
  /// communication the backward pass did not hide; part of comm_wait_ms too).
  double bucket_wait_ms = 0;
  /// Gradient buckets: their all-reduces on the replica's communication thread, overlapping
  /// its compute (not part of the step's breakdown: the replica computed meanwhile).
  double comm_overlapped_ms = 0;
  double optimizer_ms = 0;   ///< the optimizer's update after its gradients were reduced
  double host_sync_ms = 0;   ///< values read back to the host (Tensor::item, metric results)
  double checkpoint_ms = 0;  ///< checkpoint saves
  double other_ms = 0;       ///< the loop between runs; handing the run to the replica and back
  double comm_bytes = 0;     ///< mean bytes this replica all-reduced per step
};

/// One piece of advice: which rule, its message (with the measured figure), and the figure.
struct Advice {
  /// "oversubscribed", "straggler", "input-bound", "communication-bound", "too-little-work",
  /// "loss-scale-floor"
  std::string rule;
  std::string message;  ///< what was seen and what to do, with the figure
  double figure = 0;    ///< the share (0..1) or ratio the message quotes
};

/// The steps between two summaries.
struct Summary {
  int64_t steps = 0;  ///< steps summarised
  int replicas = 0;   ///< replicas of this worker
  ///@{

  /// The step time's median, 10th and 90th percentiles, in milliseconds.
  double step_ms_median = 0, step_ms_p10 = 0, step_ms_p90 = 0;
  ///@}
  double examples_per_step = 0;  ///< this worker's examples per step (0: the loop read no dataset)
  std::vector<ReplicaBreakdown> per_replica;  ///< one breakdown per replica, in replica order
  /// The steps' mean time and each part's share of it, averaged over the replicas.
  double step_ms_mean = 0;
  ///@{

  /// Each part's share of step_ms_mean, in [0, 1], averaged over the replicas (see
  /// ReplicaBreakdown).
  double input_share = 0, compute_share = 0, comm_wait_share = 0, comm_data_share = 0,
         optimizer_share = 0, host_sync_share = 0, checkpoint_share = 0, other_share = 0;
  ///@}
  /// The estimate of one replica doing the same work alone: every replica's compute one after
  /// another, plus one optimizer update, the input wait and the loop's own time.
  double one_replica_step_ms = 0;
  double speedup = 0;     ///< one_replica_step_ms / step_ms_mean
  double efficiency = 0;  ///< speedup / replicas
  /// A LossScaleOptimizer's updates in these steps: its scale after the last one (0: no loss
  /// scale recorded), the updates it decided, and those it skipped (gradients not finite).
  double loss_scale = 0;
  int64_t loss_scale_updates = 0;  ///< updates the LossScaleOptimizer decided in these steps
  int64_t skipped_updates = 0;     ///< of those, the ones skipped (gradients not finite)
  std::vector<Advice> advice;      ///< the rules that fired, with their figures
  /// With ProfilerOptions::optimizer: the bytes the replica holding the most holds for training
  /// (parameters, summed gradients, optimizer state; optim::ReplicaMemory), and the optimizer's
  /// shard_optimizer_state. Parameters 0: not known.
  optim::ReplicaMemory memory;
  int shard_optimizer_state = 0;  ///< the stage `memory` was measured at

  /// The breakdown as a table, the step time's median and spread, the scaling estimate and the
  /// advice (or "no advice: ..."), as the profiler prints it.
  std::string to_string() const;
};

/// "memory per replica (the most any holds): parameters 192.1 MiB, summed gradients 48.0 MiB,
/// optimizer state 96.0 MiB (shard_optimizer_state 2)": what the profiler prints when it starts
/// and in each summary.
std::string memory_line(const optim::ReplicaMemory& memory, int shard_optimizer_state);

/// Summarises recorded events (what the Profiler does with them; exposed for tests and tools).
/// `devices` names the replicas.
Summary summarize(const std::vector<Event>& events, const std::vector<std::string>& devices);

}  // namespace tandem::profile
