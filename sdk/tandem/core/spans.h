// The step timeline's recording side: spans (a phase of a step, on a track, from one time to
// another) that any layer marks where its work happens. Recording is off unless a
// profile::Profiler (tandem/profile/profiler.h) turned it on; off, a span costs one relaxed
// atomic load, and the spans of phases that are not compute (collectives, the optimizer, host
// syncs, checkpoints) two clock reads more: they are the one measure of a replica's time
// outside compute and in collectives (outside_compute_ns, collective_ns). The profiler reads
// the spans back, splits them into steps and writes the trace.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string_view>
#include <vector>

namespace tandem::profile {

/// Where time goes in a step. Compute is what is left of a replica's task once the others are
/// taken out, so it is never recorded as such.
enum class Phase : uint8_t {
  kStep,        ///< strategy.run on the calling thread; a replica's whole task on its thread
  kInput,       ///< the training loop waited for the next distributed batch
  kCommWait,    ///< inside a collective, waiting for slower peers to arrive
  kCommData,    ///< inside a collective, moving and reducing data
  kOptimizer,   ///< the optimizer's update (after its gradients were reduced)
  kHostSync,    ///< a value read back to the host (Tensor::item, metric results)
  kCheckpoint,  ///< a checkpoint save
  kEpochEnd,    ///< an instant: a distributed dataset ran out of data (the epoch ended)
  /// An instant: a LossScaleOptimizer's scale after an update's decision (Event::value).
  kLossScale,
  /// An instant: an update skipped because the gradients were not finite (Event::value: the
  /// loss scale they overflowed at).
  kSkippedUpdate,
};
/// "step", "input", "comm_wait", "comm_data", "optimizer", "host_sync", "checkpoint",
/// "epoch_end", "loss_scale", "skipped_update".
std::string_view phase_name(Phase phase);

/// A timeline: the training loop, a replica, a replica's communicator, the input pipeline.
enum class TrackKind : uint8_t { kLoop, kReplica, kCommunicator, kInput };

/// One timeline of the trace: its kind and, for per-replica kinds, the replica.
struct Track {
  /// Whose timeline.
  TrackKind kind = TrackKind::kLoop;
  int index = 0;  ///< the local replica for kReplica and kCommunicator; 0 otherwise
};

/// One recorded span. Times are steady_clock nanoseconds.
struct Event {
  /// What the time was spent on.
  Phase phase;
  /// The timeline it belongs to.
  Track track;
  ///@{

  /// Start and end, steady_clock nanoseconds (equal for an instant).
  int64_t begin_ns, end_ns;
  ///@}
  int64_t bytes;  ///< data a collective moved (this rank's tensors); an input wait's examples
  /// Recorded by a thread that communicates while its replica computes (a gradient bucket's
  /// all-reduce): the time overlaps the replica's task instead of being part of it.
  bool overlapped;
  /// A replica's task (kStep on a kReplica track): its compute in nanoseconds, the figure
  /// strategy.run measured (outside_compute_ns); -1 for every other span.
  int64_t compute_ns;
  /// An instant's figure (kLossScale, kSkippedUpdate); 0 otherwise.
  double value = 0;
};

/// steady_clock now, in nanoseconds.
inline int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

/// True while a profiler records. One relaxed load: spans test it before anything else.
bool enabled();

/// The calling thread's track: replica threads are kReplica (set by the strategy), every other
/// thread kLoop unless it says otherwise.
Track current_track();
/// Sets the calling thread's track (strategies mark their replica threads).
void set_current_track(Track track);

/// Marks the calling thread as one whose collectives overlap its replica's compute (the
/// replica's communication thread for gradient buckets); its spans say so (Event::overlapped).
void set_current_thread_overlaps(bool overlaps);

/// True for the phases that are not compute when a replica's thread spends time in them:
/// collectives and waits for them (kCommWait, kCommData), the optimizer, host syncs and
/// checkpoints.
constexpr bool outside_compute(Phase phase) {
  return phase == Phase::kCommWait || phase == Phase::kCommData || phase == Phase::kOptimizer ||
         phase == Phase::kHostSync || phase == Phase::kCheckpoint;
}

/// Nanoseconds the calling thread has spent so far in spans of outside_compute phases, measured
/// whether or not a profiler records (a thread marked as overlapping counts none). A replica's
/// compute is its task's time less the growth of this figure over the task: the one measure
/// that strategy.run's speed-balanced split and the timeline both read (Event::compute_ns).
int64_t outside_compute_ns();
/// Nanoseconds the calling thread has spent so far inside collectives (kCommWait and kCommData
/// spans, which the backends open where they wait and where they move data), overlapping
/// threads included: what a Communicator's stats read around each call.
int64_t collective_ns();

/// Records a finished span (nothing when recording is off).
void record(const Event& event);
/// Records an instant of `phase` with its figure on the calling thread's track, now (nothing
/// when recording is off).
void record_instant(Phase phase, double value);

/// Named ranges opened and closed on the calling thread as spans begin and end while recording
/// (NVTX with CUDA, so Nsight Systems shows the same phases); null: none.
struct RangeHooks {
  /// Opens a range named `name` (a phase_name()).
  void (*push)(const char* name);
  /// Closes the innermost open range.
  void (*pop)();
};
/// Installs `hooks` (null: none); the object must outlive its use.
void set_range_hooks(const RangeHooks* hooks);
/// The installed hooks, or null.
const RangeHooks* range_hooks();

/// Marks `phase` on the calling thread's track (or `track`) from construction to destruction.
/// Collectives are marked on the communicator track of the calling replica.
class Span {
 public:
  /// Begins a span of `phase` on the calling thread's track.
  explicit Span(Phase phase) : Span(phase, current_track()) {}
  /// Begins a span of `phase` on `track`.
  Span(Phase phase, Track track)
      : on_(enabled()), timed_(outside_compute(phase)), phase_(phase), track_(track) {
    if (on_ || timed_) begin();
  }
  ~Span() {
    if (on_ || timed_) finish();
  }
  Span(const Span&) = delete;
  Span& operator=(const Span&) = delete;

  /// Data moved, for a collective's span.
  void set_bytes(int64_t bytes) { bytes_ = bytes; }
  /// A replica's task span: its compute (Event::compute_ns).
  void set_compute_ns(int64_t compute_ns) { compute_ns_ = compute_ns; }
  /// Ends the span now (the destructor then records nothing more).
  void end() {
    if (on_ || timed_) finish();
    on_ = false;
    timed_ = false;
  }

 private:
  void begin();
  void finish();

  bool on_;     // recording: the span becomes an Event
  bool timed_;  // an outside_compute phase: its time counts in outside_compute_ns()
  Phase phase_;
  Track track_;
  int64_t begin_ns_ = 0;
  int64_t bytes_ = 0;
  int64_t compute_ns_ = -1;
};

/// The communicator track of the calling thread's replica (kLoop's 0 off replica threads).
inline Track communicator_track() {
  const Track t = current_track();
  return {TrackKind::kCommunicator, t.kind == TrackKind::kReplica ? t.index : 0};
}

// ---- the profiler's side (tandem/profile) -------------------------------------------------

/// Starts recording (events recorded before are dropped).
void start_recording();
/// Stops recording; returns what was recorded since the last take_events() or start.
std::vector<Event> stop_recording();
/// What was recorded since the last call, by start time; recording goes on.
std::vector<Event> take_events();
/// Called after each kEpochEnd event is recorded, on the recording thread and outside any lock
/// (the profiler summarises the epoch there). An empty function removes it.
void set_epoch_listener(std::function<void()> listener);

}  // namespace tandem::profile
