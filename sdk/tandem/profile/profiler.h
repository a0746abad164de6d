// The step timeline and its advice: profile::Profiler records where each replica's time went in
// every step (waiting for input, compute, communication split into waiting for slower peers and
// moving data, the optimizer, host synchronisation, checkpoint saves), writes it as a Chrome
// trace (Perfetto, chrome://tracing), and at the end of each epoch prints a breakdown per replica
// with advice, each rule with the figure that triggered it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tandem/core/profile.h"
#include "tandem/distribute/strategy.h"

namespace tandem::profile {

/// Where one replica's steps went, as mean milliseconds per step (all of them add up to the
/// step time; `other` is the training loop's own time between runs).
struct ReplicaBreakdown {
  int replica = 0;
  std::string device;
  double input_ms = 0;      ///< the loop waited for the batch (shared by every replica)
  double compute_ms = 0;    ///< forward, backward, the loss: the task minus what follows
  double comm_wait_ms = 0;  ///< in collectives waiting for slower peers
  double comm_data_ms = 0;  ///< in collectives moving and reducing data
  /// Gradient buckets: waiting in apply_gradients for buckets still in flight (the
  /// communication the backward pass did not hide; part of comm_wait_ms too).
  double bucket_wait_ms = 0;
  /// Gradient buckets: their all-reduces on the replica's communication thread, overlapping
  /// its compute (not part of the step's breakdown: the replica computed meanwhile).
  double comm_overlapped_ms = 0;
  double optimizer_ms = 0;
  double host_sync_ms = 0;
  double checkpoint_ms = 0;
  double other_ms = 0;    ///< the loop between runs; handing the run to the replica and back
  double comm_bytes = 0;  ///< mean bytes this replica all-reduced per step
};

/// One piece of advice: which rule, its message (with the measured figure), and the figure.
struct Advice {
  /// "oversubscribed", "straggler", "input-bound", "communication-bound", "too-little-work"
  std::string rule;
  std::string message;
  double figure = 0;  ///< the share (0..1) or ratio the message quotes
};

/// The steps between two summaries.
struct Summary {
  int64_t steps = 0;
  int replicas = 0;
  double step_ms_median = 0, step_ms_p10 = 0, step_ms_p90 = 0;
  double examples_per_step = 0;  ///< this worker's examples per step (0: the loop read no dataset)
  std::vector<ReplicaBreakdown> per_replica;
  /// The steps' mean time and each part's share of it, averaged over the replicas.
  double step_ms_mean = 0;
  double input_share = 0, compute_share = 0, comm_wait_share = 0, comm_data_share = 0,
         optimizer_share = 0, host_sync_share = 0, checkpoint_share = 0, other_share = 0;
  /// The estimate of one replica doing the same work alone: every replica's compute one after
  /// another, plus one optimizer update, the input wait and the loop's own time.
  double one_replica_step_ms = 0;
  double speedup = 0;     ///< one_replica_step_ms / step_ms_mean
  double efficiency = 0;  ///< speedup / replicas
  std::vector<Advice> advice;

  /// The breakdown as a table, the step time's median and spread, the scaling estimate and the
  /// advice (or "no advice: ..."), as the profiler prints it.
  std::string to_string() const;
};

/// Summarises recorded events (what the Profiler does with them; exposed for tests and tools).
/// `devices` names the replicas.
Summary summarize(const std::vector<Event>& events, const std::vector<std::string>& devices);

/// Chrome Trace Event Format JSON of `events` ("X" complete events, "i" instants, "M" names):
/// one track per replica, per communicator, for the input pipeline and the training loop, in
/// process `worker` (named "worker K").
std::string chrome_trace(const std::vector<Event>& events, const std::vector<std::string>& devices,
                         int worker = 0);

struct ProfilerOptions {
  /// Where the Chrome trace goes when the profiler ends; empty: no trace. Checked when the
  /// profiler starts (on the chief, which writes it): a folder that cannot take the file, or a
  /// path that is a directory, FIFO or device, raises then, naming it. Written through a
  /// temporary file beside it, removed again if writing fails.
  std::string trace_file;
  /// Print each epoch's summary (stderr, info level) when the epoch ends.
  bool print_summaries = true;
};

/// Records the timeline of `strategy`'s steps while it lives. Off (no profiler), recording costs
/// one flag read per span. One profiler at a time. With MultiWorkerMirroredStrategy every worker
/// creates one; when they end, the chief gathers every worker's events into its trace file (one
/// process per worker), so every worker must end its profiler (a collective).
class Profiler {
 public:
  explicit Profiler(const Strategy& strategy, ProfilerOptions options = {});
  /// A profiler writing to TANDEM_PROFILE's file when that variable is set, else null.
  static std::unique_ptr<Profiler> from_environment(const Strategy& strategy);
  /// Stops recording, prints the summary of the steps since the last epoch's, writes the trace.
  ~Profiler();
  Profiler(const Profiler&) = delete;
  Profiler& operator=(const Profiler&) = delete;

  /// Summarises the steps since the last summary (called at each epoch's end by itself).
  Summary end_epoch();
  /// Every summary so far, one per epoch.
  const std::vector<Summary>& summaries() const;
  /// Every event recorded so far (for tools and tests).
  const std::vector<Event>& events() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tandem::profile
