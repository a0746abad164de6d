// The step timeline and its advice: profile::Profiler records where each replica's time went in
// every step (waiting for input, compute, communication split into waiting for slower peers and
// moving data, the optimizer, host synchronisation, checkpoint saves), writes it as a Chrome
// trace (Perfetto, chrome://tracing), and at the end of each epoch prints a breakdown per replica
// with advice, each rule with the figure that triggered it.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tandem/core/spans.h"
#include "tandem/distribute/strategy.h"
#include "tandem/profile/summary.h"
#include "tandem/summary/summary_writer.h"

namespace tandem::profile {

/// Chrome Trace Event Format JSON of `events` ("X" complete events, "i" instants, "M" names):
/// one track per replica, per communicator, for the input pipeline and the training loop, in
/// process `worker` (named "worker K").
std::string chrome_trace(const std::vector<Event>& events, const std::vector<std::string>& devices,
                         int worker = 0);

/// What a Profiler writes besides recording: the trace file, printed and TensorBoard summaries.
struct ProfilerOptions {
  /// Where the Chrome trace goes when the profiler ends; empty: no trace. Checked when the
  /// profiler starts (on the chief, which writes it): a folder that cannot take the file, or a
  /// path that is a directory, FIFO or device, raises then, naming it. Written through a
  /// temporary file beside it, removed again if writing fails.
  std::string trace_file;
  /// Print each epoch's summary (stderr, info level) when the epoch ends.
  bool print_summaries = true;
  /// Also write each epoch's summary into this TensorBoard writer (which must outlive the
  /// profiler; the chief's writes): the step time, each part's share, the speed-up and
  /// efficiency, every replica's breakdown, the loss scale and skipped updates, and the advice
  /// as text (tags under "profile/", write_summary below).
  summary::Writer* tensorboard = nullptr;
  /// The step each epoch's summary is written at; unset: how many epochs this profiler has
  /// summarised (1, 2, ...). The samples pass their epoch number, which a resumed run continues.
  std::function<int64_t()> tensorboard_step = {};
  /// The training's optimizer (it must outlive the profiler): the start-up line and every
  /// summary then say how many bytes of parameters, summed gradients and optimizer state a
  /// replica holds (the most any does; Summary::memory). Null: not reported.
  const optim::Optimizer* optimizer = nullptr;
};

/// Writes `summary` into `writer` at `step`: profile/step_ms (mean), profile/step_ms_median,
/// profile/share/{input,compute,comm_wait,comm_data,optimizer,host_sync,checkpoint,other},
/// profile/speedup, profile/efficiency,
/// `profile/replica_<i>/{compute,input,comm_wait,comm_data,optimizer,host_sync,other}_ms`,
/// profile/loss_scale and profile/skipped_updates (with a loss scale), and the advice as text
/// (profile/advice).
void write_summary(summary::Writer& writer, int64_t step, const Summary& summary);

/// Records the timeline of `strategy`'s steps while it lives. Off (no profiler), recording costs
/// one flag read per span. One profiler at a time. With MultiWorkerMirroredStrategy every worker
/// creates one; when they end, the chief gathers every worker's events into its trace file (one
/// process per worker), so every worker must end its profiler (a collective).
class Profiler {
 public:
  /// Starts recording `strategy`'s steps (the strategy must outlive the profiler).
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
