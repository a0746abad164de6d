// spin_wait: the brief polling that precedes a blocking wait in the in-process rendezvous and
// in the strategy's run hand-off (internal to Tandem).
#pragma once

#include <chrono>
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

/// Polls `done()` for up to ~200 microseconds and returns true as soon as it holds; false means
/// the caller should block on its condition variable. Why poll at all: waking a sleeping
/// thread costs a futex call plus the scheduler's wake-up, tens of microseconds on a virtual
/// machine, and once one peer sleeps the next rendezvous finds it late, so the peers fall into
/// a convoy of sleeps. The budget is longer than that wake-up, so peers that are merely a
/// little apart never sleep. With kYield the poller gives its core to runnable peers.
template <typename Done>
bool spin_wait(Done&& done, SpinPolicy policy) {
  constexpr auto kBudget = std::chrono::microseconds(200);
  const auto deadline = std::chrono::steady_clock::now() + kBudget;
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

}  // namespace tandem::detail
