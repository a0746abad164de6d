// ReplicaThreads: how strategy.run executes a task on a strategy's replicas. One persistent
// thread per replica (or, for one replica, the calling thread), the hand-off of each run, error
// collection and re-raising, and giving up on a replica stuck in user code.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "tandem/autograd/variable.h"
#include "tandem/collectives/in_process.h"
#include "tandem/collectives/internal/spin_wait.h"
#include "tandem/core/device.h"
#include "tandem/distribute/replica_context.h"
#include "tandem/distribute/strategy.h"
#include "tandem/tensor/device_runtime.h"

namespace tandem::detail {

class ReplicaThreads {
 public:
  struct Options {
    std::string name;             ///< the strategy, at the start of messages
    std::vector<Device> devices;  ///< one per local replica
    /// One replica, run on the thread that calls run() (OneDeviceStrategy, default_strategy()).
    bool on_calling_thread = false;
    int worker_index = 0;
    int num_workers = 1;
    /// The replicas' rendezvous: aborted when a replica raises, departed when one returns,
    /// reset before each run.
    collectives::InProcessRendezvous* group = nullptr;
    std::vector<ReplicaContext*> contexts;  ///< one per local replica
    /// Installed on every replica thread, so variables created inside run are mirrored too.
    VariableCreator creator;
  };

  /// Starts one thread per replica (none with on_calling_thread).
  explicit ReplicaThreads(Options options);
  /// Ends the threads (see stop).
  ~ReplicaThreads();
  ReplicaThreads(const ReplicaThreads&) = delete;
  ReplicaThreads& operator=(const ReplicaThreads&) = delete;

  /// Runs `task` on every replica and waits; raises the first replica's error as documented in
  /// Strategy::run (and TimeoutError when it gives up on a replica stuck in user code).
  void run(const ReplicaTask& task);
  /// Raises at once once a run has given up on a replica. `what` names the call ("run",
  /// "reduce", ...).
  void check_usable(const char* what);
  /// Ends the replica threads; returns how many it had to detach (stuck in a replica function,
  /// still using this object, which must then outlive them).
  int stop();
  /// Why a run gave up on its replicas; empty while the replicas are usable.
  std::string broken();
  /// Runs so far (the last one's number); for each replica, the seconds of that run's task, and
  /// of its compute (the task less its time outside compute: profile::outside_compute_ns).
  /// Read between runs. (A replica that ran on the calling thread is not timed.)
  uint64_t runs() const { return generation_.load(std::memory_order_acquire); }
  const std::vector<double>& task_seconds() const { return task_seconds_; }
  const std::vector<double>& compute_seconds() const { return compute_seconds_; }

 private:
  void thread_main(int id);
  /// Waits for every replica to return from the current run, or gives up on the stuck ones.
  void wait_for_replicas();
  /// Re-raises the current run's error, if a replica raised one.
  void raise_errors();

  const Options options_;
  const int num_replicas_;
  bool any_gpu_ = false;

  // The hand-off between run() and the replica threads: run publishes a task and bumps
  // `generation_`; each thread runs it once and decrements `pending_`; run waits for zero.
  // Both counters change under `mutex_` (so condition-variable waits never miss an update) and
  // are atomic so that waiters can poll them briefly before sleeping.
  std::mutex mutex_;
  std::condition_variable work_cv_;
  std::condition_variable done_cv_;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> pending_{0};
  bool stop_ = false;
  // How replica threads poll for the next run before sleeping: pause when they and the caller
  // each have a core, yield otherwise. The caller always yields while it waits for a run to
  // finish, so that it never takes a core from a replica's compute threads.
  SpinPolicy worker_spin_ = SpinPolicy::kYield;
  // How long they poll (one budget for the replicas' wait for a run, one for the caller's wait
  // for its end; see SpinBudget).
  SpinBudget next_run_budget_, run_end_budget_;
  ReplicaTask task_{nullptr, nullptr, nullptr};
  std::vector<std::exception_ptr> errors_;  // per replica, for the current run
  std::vector<char> finished_;              // per replica: returned from the current run
  std::vector<double> task_seconds_;        // per replica: its task's wall time in the last run
  std::vector<double> compute_seconds_;     // per replica: that less its time outside compute
  // Set (under `mutex_`) when a run gave up on replicas that did not return: the strategy then
  // refuses every later call, and its destructor leaves the stuck threads its state.
  std::string broken_;
  // GPU replicas: the caller's stream -> replica streams at the start of a run (what the caller
  // queued, e.g. input copies, is done before a replica uses it), and replica streams -> the
  // caller's stream at the end (results are complete before the caller uses them). Events
  // only: no host thread waits for a GPU. Unused (no-ops) for CPU replicas.
  std::vector<StreamEvent> run_start_;  // per replica, recorded by the caller
  std::vector<StreamEvent> run_end_;    // per replica, recorded by the replica
  std::vector<std::thread> threads_;
  std::mutex run_mutex_;  // one run at a time (runs from several user threads queue here)
};

}  // namespace tandem::detail
