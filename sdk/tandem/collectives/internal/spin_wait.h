// spin_wait: the brief polling that precedes a blocking wait in the in-process rendezvous and
// in the strategy's run hand-off, with a budget that shrinks when the machine's cores are taken
// by other work (internal to Tandem).
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <thread>

namespace tandem::detail {

/// How a thread polls before it blocks.
enum class SpinPolicy {
  kPause,  ///< busy-poll with a CPU pause: every waiting thread has a core of its own
  kYield,  ///< poll, yielding the core after each look: threads outnumber cores
};

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#else
  std::this_thread::yield();
#endif
}

/// How long a wait site polls before its thread blocks, learnt from how long its waits take.
/// Why poll at all: waking a sleeping thread costs a futex call plus the scheduler's wake-up,
/// tens of microseconds on a virtual machine, and once one peer sleeps the next rendezvous finds
/// it late, so the peers fall into a convoy of sleeps; a budget longer than that wake-up keeps
/// peers that are merely a little apart awake. Why learn: when other processes hold the cores, a
/// peer is often descheduled for a whole time slice (milliseconds); polling then only burns the
/// core that peer needs (and yielding hands it to the other process for a slice), so a site
/// whose waits outlast the budget halves it, down to blocking at once, and a wait that ended
/// within the full budget (the machine is quiet again) doubles it back. Shared by the threads
/// that wait at one site (relaxed atomics: it is a hint).
class SpinBudget {
 public:
  static constexpr std::chrono::nanoseconds kFull = std::chrono::microseconds(200);
  static constexpr std::chrono::nanoseconds kFloor = std::chrono::microseconds(2);

  std::chrono::nanoseconds current() const {
    return std::chrono::nanoseconds(budget_ns_.load(std::memory_order_relaxed));
  }

  /// A wait that polled and then blocked took `waited` in all.
  void blocked_for(std::chrono::nanoseconds waited) {
    const int64_t now = budget_ns_.load(std::memory_order_relaxed);
    const int64_t next =
        waited <= kFull
            ? std::min<int64_t>(kFull.count(), std::max<int64_t>(now, kFloor.count()) * 2)
            : now / 2;
    budget_ns_.store(next < kFloor.count() ? 0 : next, std::memory_order_relaxed);
  }

 private:
  std::atomic<int64_t> budget_ns_{kFull.count()};
};

/// Polls `done()` for up to the budget and returns true as soon as it holds; false means the
/// caller should block on its condition variable (and then report the whole wait with
/// `budget.blocked_for`, see BlockedWait). With kYield the poller gives its core to runnable
/// peers between looks.
template <typename Done>
bool spin_wait(Done&& done, SpinPolicy policy, const SpinBudget& budget) {
  const std::chrono::nanoseconds limit = budget.current();
  if (limit.count() == 0) return done();
  const auto deadline = std::chrono::steady_clock::now() + limit;
  for (;;) {
    for (int i = 0; i < 32; ++i) {
      if (done()) return true;
      if (policy == SpinPolicy::kPause) {
        cpu_relax();
      } else {
        std::this_thread::yield();
      }
    }
    if (std::chrono::steady_clock::now() >= deadline) return done();
  }
}

/// One wait at a site: spin (spin_wait) and, when that did not see the condition, block; the
/// blocking part's length teaches the site's budget. Usage:
///   BlockedWait wait(budget);
///   if (!wait.spin(done, policy)) { ...block...; }   // the destructor reports the block
class BlockedWait {
 public:
  explicit BlockedWait(SpinBudget& budget)
      : budget_(budget), start_(std::chrono::steady_clock::now()) {}
  ~BlockedWait() {
    if (blocked_) budget_.blocked_for(std::chrono::steady_clock::now() - start_);
  }
  BlockedWait(const BlockedWait&) = delete;
  BlockedWait& operator=(const BlockedWait&) = delete;

  template <typename Done>
  bool spin(Done&& done, SpinPolicy policy) {
    blocked_ = !spin_wait(done, policy, budget_);
    return !blocked_;
  }

 private:
  SpinBudget& budget_;
  std::chrono::steady_clock::time_point start_;
  bool blocked_ = false;
};

}  // namespace tandem::detail
