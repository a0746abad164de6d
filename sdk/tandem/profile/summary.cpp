// The summary (summary.h): from recorded spans to steps. Each run of strategy.run on the
// training loop's track closes a step (the time since the previous run ended), and every
// replica's spans inside the run are added up by phase; the means per step give the breakdown,
// the rules the advice.
#include "tandem/profile/summary.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <sstream>
#include <utility>

#include "tandem/core/error.h"
#include "tandem/core/threading.h"

namespace tandem::profile {
namespace {

// Rules' thresholds, as shares of the step (see docs/performance.md).
constexpr double kInputBound = 0.10;         // the loop waited for data this long
constexpr double kCommDataBound = 0.20;      // moving gradients
constexpr double kCommBound = 0.30;          // moving them and waiting at the rendezvous
constexpr double kStragglerSlower = 0.15;    // the slowest replica's compute over the others'
constexpr double kStragglerWait = 0.10;      // ...while they waited this long
constexpr double kBusyTooLow = 0.50;         // compute share below which a replica idles
constexpr double kCommTargetPerStep = 0.10;  // accumulation sized to bring communication here

/// Spans of one phase on one track, by start; sums overlaps with windows that move forward.
class SpanList {
 public:
  void add(const Event& e) { spans_.push_back(e); }
  /// Nanoseconds of the spans inside [lo, hi) and their bytes (a span counts its bytes once,
  /// in the window where it starts). Windows must come in increasing order.
  std::pair<double, double> take(int64_t lo, int64_t hi) {
    while (next_ < spans_.size() && spans_[next_].end_ns <= lo) ++next_;
    double ns = 0, bytes = 0;
    for (size_t i = next_; i < spans_.size() && spans_[i].begin_ns < hi; ++i) {
      const int64_t b = std::max(lo, spans_[i].begin_ns), e = std::min(hi, spans_[i].end_ns);
      if (e > b) ns += static_cast<double>(e - b);
      if (spans_[i].begin_ns >= lo) bytes += static_cast<double>(spans_[i].bytes);
    }
    return {ns, bytes};
  }
  double time(int64_t lo, int64_t hi) { return take(lo, hi).first; }
  /// Nanoseconds of compute of the replica tasks that end inside [lo, hi] (Event::compute_ns,
  /// strategy.run's own figure; a task that raised has none).
  double compute(int64_t lo, int64_t hi) {
    while (next_compute_ < spans_.size() && spans_[next_compute_].end_ns <= lo) ++next_compute_;
    double ns = 0;
    for (size_t i = next_compute_; i < spans_.size() && spans_[i].begin_ns < hi; ++i)
      if (spans_[i].end_ns <= hi && spans_[i].compute_ns > 0)
        ns += static_cast<double>(spans_[i].compute_ns);
    return ns;
  }
  bool empty() const { return spans_.empty(); }
  const std::vector<Event>& spans() const { return spans_; }

 private:
  std::vector<Event> spans_;
  size_t next_ = 0;
  size_t next_compute_ = 0;
};

struct ReplicaSpans {
  SpanList task, comm_wait, comm_data, optimizer, host_sync, checkpoint;
  SpanList bucket_wait;      // the replica waiting for gradient buckets (exposed communication)
  SpanList comm_overlapped;  // its communication thread's collectives, overlapping the task
};

double quantile(std::vector<double> values, double q) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const double pos = q * static_cast<double>(values.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(pos));
  const size_t hi = std::min(lo + 1, values.size() - 1);
  return values[lo] + (values[hi] - values[lo]) * (pos - static_cast<double>(lo));
}

std::string percent(double share) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.0f%%", share * 100.0);
  return text;
}

std::string fixed(double value, int digits) {
  char text[48];
  std::snprintf(text, sizeof(text), "%.*f", digits, value);
  return text;
}

void add_advice(Summary& s) {
  // The loss scale at its floor: the gradients overflow even (almost) unscaled, so updates are
  // being skipped instead of made.
  if (s.loss_scale > 0 && s.loss_scale <= 1 && s.skipped_updates > 0)
    s.advice.push_back(
        {"loss-scale-floor",
         detail::str_cat("the loss scale fell to ", s.loss_scale, " and ", s.skipped_updates,
                         " of ", s.loss_scale_updates,
                         " updates were skipped (gradients not finite): the model overflows "
                         "even unscaled; look for Inf or NaN in the inputs and the loss, lower "
                         "the learning rate, or compute in mixed_bfloat16 (float32's range)"),
         static_cast<double>(s.skipped_updates) /
             static_cast<double>(std::max<int64_t>(s.loss_scale_updates, 1))});
  const double step = s.step_ms_mean;
  if (step <= 0) return;
  const int n = s.replicas;
  auto share = [&](double ms) { return ms / step; };

  // CPU replicas beyond the cores take turns on them: a replica waiting for a core looks like
  // one waiting at the rendezvous.
  int cpu_replicas = 0;
  for (const ReplicaBreakdown& r : s.per_replica) cpu_replicas += r.device.starts_with("cpu");
  const bool oversubscribed = cpu_replicas > hardware_cores();
  if (oversubscribed)
    s.advice.push_back(
        {"oversubscribed",
         detail::str_cat(cpu_replicas, " CPU replicas share ", hardware_cores(),
                         " cores, so they take turns: waiting (", percent(s.comm_wait_share),
                         " of the step) is mostly replicas waiting for a core. Use at most one "
                         "CPU replica per core (TANDEM_CPU_REPLICAS, --replicas)"),
         static_cast<double>(cpu_replicas) / hardware_cores()});

  bool straggler = false;
  if (n >= 2 && !oversubscribed) {
    // The replica with the most compute against the mean of the others.
    size_t slowest = 0;
    for (size_t r = 1; r < s.per_replica.size(); ++r)
      if (s.per_replica[r].compute_ms > s.per_replica[slowest].compute_ms) slowest = r;
    double others_compute = 0, others_wait = 0;
    for (size_t r = 0; r < s.per_replica.size(); ++r) {
      if (r == slowest) continue;
      others_compute += s.per_replica[r].compute_ms;
      others_wait += s.per_replica[r].comm_wait_ms;
    }
    others_compute /= static_cast<double>(n - 1);
    others_wait /= static_cast<double>(n - 1);
    const double slower =
        others_compute > 0 ? s.per_replica[slowest].compute_ms / others_compute - 1 : 0;
    if (slower >= kStragglerSlower && share(others_wait) >= kStragglerWait) {
      straggler = true;
      const ReplicaBreakdown& r = s.per_replica[slowest];
      s.advice.push_back(
          {"straggler",
           detail::str_cat("replica ", r.replica, " (", r.device, ") was ", percent(slower),
                           " slower than the others; they waited ", percent(share(others_wait)),
                           " of each step. Give it less of each batch "
                           "(DistributeOptions::split = SplitPolicy::kBySpeed), or find what "
                           "slows it (a slower device, cores shared with other work)"),
           slower});
    }
  }

  if (s.input_share >= kInputBound)
    s.advice.push_back({"input-bound",
                        detail::str_cat("replicas waited for data ", percent(s.input_share),
                                        " of each step: prefetch more (Dataset::prefetch), "
                                        "make the map functions cheaper, or decode the data "
                                        "once before training"),
                        s.input_share});

  if (n >= 2) {
    const double data = s.comm_data_share;
    const double comm = data + (straggler || oversubscribed ? 0.0 : s.comm_wait_share);
    if (data >= kCommDataBound || comm >= kCommBound) {
      double bytes = 0;
      for (const ReplicaBreakdown& r : s.per_replica) bytes += r.comm_bytes;
      bytes /= static_cast<double>(n);
      const int steps = std::max(2, static_cast<int>(std::ceil(comm / kCommTargetPerStep)));
      s.advice.push_back(
          {"communication-bound",
           detail::str_cat("communication took ", percent(comm), " of the step (", percent(data),
                           " moving ", fixed(bytes / 1e6, 1), " MB of gradients per replica, ",
                           percent(comm - data), " at the rendezvous) for ",
                           percent(s.compute_share), " of compute: use gradient accumulation (",
                           steps, " steps per all-reduce) or a larger per-replica batch"),
           comm});
    }
  }

  if (s.advice.empty() && s.compute_share < kBusyTooLow) {
    const ReplicaBreakdown& r = s.per_replica.front();
    const std::string batch =
        s.examples_per_step > 0
            ? detail::str_cat("per-replica batch ",
                              fixed(s.examples_per_step / static_cast<double>(n), 0))
            : std::string("the per-replica batch");
    s.advice.push_back(
        {"too-little-work",
         detail::str_cat(batch, " keeps ", r.device, " busy ", percent(s.compute_share),
                         " of the step; the rest is fixed cost per step (the optimizer ",
                         percent(s.optimizer_share), ", host synchronisation ",
                         percent(s.host_sync_share), ", the loop ", percent(s.other_share),
                         "): raise the per-replica batch"),
         s.compute_share});
  }
}

}  // namespace

Summary summarize(const std::vector<Event>& events, const std::vector<std::string>& devices) {
  Summary s;
  int replicas = static_cast<int>(devices.size());
  for (const Event& e : events)
    if (e.track.kind == TrackKind::kReplica || e.track.kind == TrackKind::kCommunicator)
      replicas = std::max(replicas, e.track.index + 1);
  s.replicas = replicas;

  std::vector<Event> runs;
  SpanList input, loop_checkpoint, loop_host_sync;
  std::vector<ReplicaSpans> per(static_cast<size_t>(replicas));
  for (const Event& e : events) {
    const size_t r = static_cast<size_t>(std::max(e.track.index, 0));
    switch (e.track.kind) {
      case TrackKind::kLoop:
        if (e.phase == Phase::kStep) runs.push_back(e);
        if (e.phase == Phase::kCheckpoint) loop_checkpoint.add(e);
        if (e.phase == Phase::kHostSync) loop_host_sync.add(e);
        break;
      case TrackKind::kInput:
        if (e.phase == Phase::kInput) input.add(e);
        break;
      case TrackKind::kReplica:
        if (e.phase == Phase::kStep) per[r].task.add(e);
        if (e.phase == Phase::kOptimizer) per[r].optimizer.add(e);
        if (e.phase == Phase::kHostSync) per[r].host_sync.add(e);
        if (e.phase == Phase::kCheckpoint) per[r].checkpoint.add(e);
        if (e.phase == Phase::kCommWait) per[r].bucket_wait.add(e);
        break;
      case TrackKind::kCommunicator:
        if (e.overlapped) {
          if (e.phase == Phase::kCommWait || e.phase == Phase::kCommData)
            per[r].comm_overlapped.add(e);
        } else {
          if (e.phase == Phase::kCommWait) per[r].comm_wait.add(e);
          if (e.phase == Phase::kCommData) per[r].comm_data.add(e);
        }
        break;
    }
  }
  std::sort(runs.begin(), runs.end(),
            [](const Event& a, const Event& b) { return a.begin_ns < b.begin_ns; });
  int64_t last_scale_ns = 0;
  for (const Event& e : events) {
    if (e.phase == Phase::kSkippedUpdate) ++s.skipped_updates;
    if (e.phase != Phase::kLossScale) continue;
    ++s.loss_scale_updates;
    if (s.loss_scale_updates == 1 || e.begin_ns >= last_scale_ns) {
      s.loss_scale = e.value;
      last_scale_ns = e.begin_ns;
    }
  }
  s.steps = static_cast<int64_t>(runs.size());
  if (runs.empty()) return s;

  // The first step starts where the loop began waiting for its batch, else at its run.
  int64_t previous_end = runs.front().begin_ns;
  for (const Event& e : input.spans())
    if (e.end_ns <= runs.front().begin_ns) previous_end = e.begin_ns;

  s.per_replica.resize(static_cast<size_t>(replicas));
  for (int r = 0; r < replicas; ++r) {
    s.per_replica[static_cast<size_t>(r)].replica = r;
    s.per_replica[static_cast<size_t>(r)].device = r < static_cast<int>(devices.size())
                                                       ? devices[static_cast<size_t>(r)]
                                                       : detail::str_cat("replica ", r);
  }
  std::vector<double> step_ms;
  double examples = 0;
  for (const Event& run : runs) {
    const int64_t lo = previous_end, hi = run.end_ns;
    const double step = static_cast<double>(hi - lo);
    const auto [input_ns, input_examples] = input.take(lo, hi);
    examples += input_examples;
    const double loop_checkpoint_ns = loop_checkpoint.time(lo, hi);
    const double loop_sync_ns = loop_host_sync.time(lo, hi);
    const double run_ns = static_cast<double>(run.end_ns - run.begin_ns);
    const double other =
        std::max(0.0, step - input_ns - loop_checkpoint_ns - loop_sync_ns - run_ns);
    for (int r = 0; r < replicas; ++r) {
      ReplicaSpans& spans = per[static_cast<size_t>(r)];
      ReplicaBreakdown& b = s.per_replica[static_cast<size_t>(r)];
      const double task = spans.task.time(run.begin_ns, run.end_ns);
      const double bucket_wait = spans.bucket_wait.time(run.begin_ns, run.end_ns);
      const double wait = spans.comm_wait.time(run.begin_ns, run.end_ns) + bucket_wait;
      const auto [data, own_bytes] = spans.comm_data.take(run.begin_ns, run.end_ns);
      const auto [overlapped, overlapped_bytes] =
          spans.comm_overlapped.take(run.begin_ns, run.end_ns);
      const double bytes = own_bytes + overlapped_bytes;
      const double optimizer = spans.optimizer.time(run.begin_ns, run.end_ns);
      const double sync = spans.host_sync.time(run.begin_ns, run.end_ns);
      const double checkpoint = spans.checkpoint.time(run.begin_ns, run.end_ns);
      b.input_ms += input_ns;
      b.compute_ms += spans.task.compute(run.begin_ns, run.end_ns);
      b.comm_wait_ms += wait;
      b.comm_data_ms += data;
      b.bucket_wait_ms += bucket_wait;
      b.comm_overlapped_ms += overlapped;
      b.optimizer_ms += optimizer;
      b.host_sync_ms += sync + loop_sync_ns;
      b.checkpoint_ms += checkpoint + loop_checkpoint_ns;
      // Time in the run outside the task: handing it to the replica thread and back.
      b.other_ms += other + std::max(0.0, run_ns - task);
      b.comm_bytes += bytes;
    }
    step_ms.push_back(step * 1e-6);
    previous_end = run.end_ns;
  }

  const double n = static_cast<double>(s.steps);
  for (ReplicaBreakdown& b : s.per_replica) {
    for (double* v :
         {&b.input_ms, &b.compute_ms, &b.comm_wait_ms, &b.comm_data_ms, &b.bucket_wait_ms,
          &b.comm_overlapped_ms, &b.optimizer_ms, &b.host_sync_ms, &b.checkpoint_ms, &b.other_ms})
      *v = *v * 1e-6 / n;
    b.comm_bytes /= n;
  }
  s.examples_per_step = examples / n;
  s.step_ms_median = quantile(step_ms, 0.5);
  s.step_ms_p10 = quantile(step_ms, 0.1);
  s.step_ms_p90 = quantile(step_ms, 0.9);
  double total = 0;
  for (double v : step_ms) total += v;
  s.step_ms_mean = total / n;

  const double m = static_cast<double>(replicas) * s.step_ms_mean;
  double compute_sum = 0;
  for (const ReplicaBreakdown& b : s.per_replica) {
    s.input_share += b.input_ms / m;
    s.compute_share += b.compute_ms / m;
    s.comm_wait_share += b.comm_wait_ms / m;
    s.comm_data_share += b.comm_data_ms / m;
    s.optimizer_share += b.optimizer_ms / m;
    s.host_sync_share += b.host_sync_ms / m;
    s.checkpoint_share += b.checkpoint_ms / m;
    s.other_share += b.other_ms / m;
    compute_sum += b.compute_ms;
  }
  const ReplicaBreakdown& first = s.per_replica.front();
  s.one_replica_step_ms = compute_sum + first.optimizer_ms + first.input_ms + first.host_sync_ms +
                          first.checkpoint_ms + first.other_ms;
  s.speedup = s.step_ms_mean > 0 ? s.one_replica_step_ms / s.step_ms_mean : 0;
  s.efficiency = s.speedup / static_cast<double>(replicas);
  add_advice(s);
  return s;
}

std::string memory_line(const optim::ReplicaMemory& memory, int shard_optimizer_state) {
  const auto mib = [](int64_t bytes) {
    const auto b = static_cast<double>(bytes);
    if (b >= 1024.0 * 1024.0 * 1024.0) return fixed(b / (1024.0 * 1024.0 * 1024.0), 2) + " GiB";
    if (b >= 1024.0 * 1024.0) return fixed(b / (1024.0 * 1024.0), 1) + " MiB";
    return fixed(b / 1024.0, 1) + " KiB";
  };
  return "memory per replica (the most any holds): parameters " + mib(memory.parameters) +
         ", summed gradients " + mib(memory.gradients) + ", optimizer state " +
         mib(memory.optimizer_state) + " (shard_optimizer_state " +
         std::to_string(shard_optimizer_state) + ")";
}

std::string Summary::to_string() const {
  std::ostringstream out;
  if (steps == 0) return "profile: no steps recorded";
  out << "profile: " << steps << " steps, " << replicas << " replica" << (replicas == 1 ? "" : "s")
      << ", step " << fixed(step_ms_median, 2) << " ms median (p10 " << fixed(step_ms_p10, 2)
      << ", p90 " << fixed(step_ms_p90, 2) << ")";
  if (examples_per_step > 0) out << ", " << fixed(examples_per_step, 0) << " examples per step";
  out << "\n";
  char line[256];
  std::snprintf(line, sizeof(line), "  %-7s %-8s %9s %9s %9s %9s %9s %9s %9s %9s\n", "replica",
                "device", "compute", "waiting", "comm", "optimizer", "input", "host", "ckpt",
                "other");
  out << line;
  for (const ReplicaBreakdown& b : per_replica) {
    auto cell = [&](double ms) {
      return fixed(ms, ms < 10 ? 2 : 1) + " " + percent(step_ms_mean > 0 ? ms / step_ms_mean : 0);
    };
    std::snprintf(line, sizeof(line), "  %-7d %-8s %9s %9s %9s %9s %9s %9s %9s %9s\n", b.replica,
                  b.device.c_str(), cell(b.compute_ms).c_str(), cell(b.comm_wait_ms).c_str(),
                  cell(b.comm_data_ms).c_str(), cell(b.optimizer_ms).c_str(),
                  cell(b.input_ms).c_str(), cell(b.host_sync_ms).c_str(),
                  cell(b.checkpoint_ms).c_str(), cell(b.other_ms).c_str());
    out << line;
  }
  out << "  (ms per step and share of it; waiting = for slower peers, comm = moving data)\n";
  if (memory.parameters > 0) out << "  " << memory_line(memory, shard_optimizer_state) << "\n";
  if (per_replica.front().comm_overlapped_ms > 0) {
    const ReplicaBreakdown& b = per_replica.front();
    out << "  gradient buckets: replica " << b.replica << "'s all-reduces took "
        << fixed(b.comm_overlapped_ms, 2) << " ms per step beside the backward pass; it waited "
        << fixed(b.bucket_wait_ms, 2) << " ms for them (in waiting)\n";
  }
  if (replicas > 1) {
    out << "  scaling: one replica doing this work alone would take about "
        << fixed(one_replica_step_ms, 2) << " ms per step";
    if (examples_per_step > 0)
      out << " (" << fixed(examples_per_step / one_replica_step_ms * 1e3, 0) << " vs "
          << fixed(examples_per_step / step_ms_mean * 1e3, 0) << " examples/s measured)";
    out << ": speed-up " << fixed(speedup, 2) << "x, efficiency " << percent(efficiency) << "\n";
  }
  if (loss_scale_updates > 0)
    out << "  loss scale: " << loss_scale << " after the last update; " << skipped_updates << " of "
        << loss_scale_updates << " updates skipped (gradients not finite)\n";
  if (advice.empty()) {
    out << "  advice: none (no input wait, communication, straggler or idle share above its "
           "threshold)\n";
  } else {
    for (const Advice& a : advice) out << "  advice (" << a.rule << "): " << a.message << "\n";
  }
  return out.str();
}

}  // namespace tandem::profile
