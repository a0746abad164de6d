// Span recording (core/spans.h): one flag read when off; when on, spans go to one shared
// buffer under a lock (a step records a few dozen spans, so the lock is never contended long).
#include "tandem/core/spans.h"

#include <algorithm>
#include <atomic>
#include <mutex>
#include <utility>

namespace tandem::profile {
namespace {

std::atomic<bool> g_enabled{false};

struct Buffer {
  std::mutex mutex;
  std::vector<Event> events;
  std::function<void()> epoch_listener;
};

Buffer& buffer() {
  static Buffer* b = new Buffer;  // never destroyed: threads may record while the process exits
  return *b;
}

thread_local Track t_track{};
thread_local bool t_overlaps = false;
thread_local int64_t t_outside_compute_ns = 0;
thread_local int64_t t_collective_ns = 0;
std::atomic<const RangeHooks*> g_range_hooks{nullptr};

}  // namespace

std::string_view phase_name(Phase phase) {
  switch (phase) {
    case Phase::kStep:
      return "step";
    case Phase::kInput:
      return "input";
    case Phase::kCommWait:
      return "comm_wait";
    case Phase::kCommData:
      return "comm_data";
    case Phase::kOptimizer:
      return "optimizer";
    case Phase::kHostSync:
      return "host_sync";
    case Phase::kCheckpoint:
      return "checkpoint";
    case Phase::kEpochEnd:
      return "epoch_end";
    case Phase::kLossScale:
      return "loss_scale";
    case Phase::kSkippedUpdate:
      return "skipped_update";
  }
  return "unknown";
}

bool enabled() { return g_enabled.load(std::memory_order_relaxed); }

Track current_track() { return t_track; }
void set_current_track(Track track) { t_track = track; }
void set_current_thread_overlaps(bool overlaps) { t_overlaps = overlaps; }

void record(const Event& event) {
  if (!enabled()) return;
  Buffer& b = buffer();
  std::function<void()> listener;
  {
    std::lock_guard<std::mutex> lock(b.mutex);
    b.events.push_back(event);
    if (event.phase == Phase::kEpochEnd) listener = b.epoch_listener;
  }
  if (listener) listener();
}

void record_instant(Phase phase, double value) {
  if (!enabled()) return;
  const int64_t now = now_ns();
  record({phase, current_track(), now, now, 0, false, -1, value});
}

void set_epoch_listener(std::function<void()> listener) {
  Buffer& b = buffer();
  std::lock_guard<std::mutex> lock(b.mutex);
  b.epoch_listener = std::move(listener);
}

void set_range_hooks(const RangeHooks* hooks) {
  g_range_hooks.store(hooks, std::memory_order_release);
}

const RangeHooks* range_hooks() { return g_range_hooks.load(std::memory_order_acquire); }

int64_t outside_compute_ns() { return t_outside_compute_ns; }
int64_t collective_ns() { return t_collective_ns; }

void Span::begin() {
  // The range is pushed once recording was seen on, and popped by finish() on this thread, so
  // pushes and pops pair up even if recording stops in between.
  if (on_)
    if (const RangeHooks* hooks = range_hooks()) hooks->push(phase_name(phase_).data());
  begin_ns_ = now_ns();
}

void Span::finish() {
  const int64_t end_ns = now_ns();
  if (timed_) {
    if (!t_overlaps) t_outside_compute_ns += end_ns - begin_ns_;
    if (phase_ == Phase::kCommWait || phase_ == Phase::kCommData)
      t_collective_ns += end_ns - begin_ns_;
  }
  if (!on_) return;
  record({phase_, track_, begin_ns_, end_ns, bytes_, t_overlaps, compute_ns_});
  if (const RangeHooks* hooks = range_hooks()) hooks->pop();
}

void start_recording() {
  Buffer& b = buffer();
  {
    std::lock_guard<std::mutex> lock(b.mutex);
    b.events.clear();
  }
  g_enabled.store(true, std::memory_order_relaxed);
}

std::vector<Event> take_events() {
  Buffer& b = buffer();
  std::vector<Event> out;
  {
    std::lock_guard<std::mutex> lock(b.mutex);
    out.swap(b.events);
    b.events.reserve(out.size());
  }
  // Spans are recorded when they end; the timeline wants them by start.
  std::stable_sort(out.begin(), out.end(),
                   [](const Event& a, const Event& b) { return a.begin_ns < b.begin_ns; });
  return out;
}

std::vector<Event> stop_recording() {
  g_enabled.store(false, std::memory_order_relaxed);
  return take_events();
}

}  // namespace tandem::profile
