// WorkerPool (internal): a fixed set of threads that run the tasks of one call at a time, the
// calling thread working alongside them; used by map(fn, num_parallel_calls). ParallelismTuner:
// how many of them a map(fn, kAutotune) uses, from the measured time per element.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <numeric>
#include <thread>
#include <utility>
#include <vector>

namespace tandem::data::detail {

class WorkerPool {
 public:
  /// `workers` threads of work in all: the caller and workers - 1 started here.
  explicit WorkerPool(int workers);
  /// Stops and joins the threads.
  ~WorkerPool();
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  /// The number of workers (the caller included); worker ids are 0 (the caller) to workers-1.
  int workers() const { return static_cast<int>(threads_.size()) + 1; }
  /// Calls fn(task, worker) for every task in [0, tasks), each once, spread over workers
  /// 0 to max_workers - 1 (0: all); returns when all are done. The first exception a task threw
  /// is rethrown then.
  void run(int64_t tasks, const std::function<void(int64_t task, int worker)>& fn,
           int max_workers = 0);

 private:
  void loop(int worker);
  void work(int worker);

  std::vector<std::thread> threads_;
  std::mutex mutex_;
  std::condition_variable start_;
  std::condition_variable done_;
  const std::function<void(int64_t, int)>* fn_ = nullptr;
  int64_t tasks_ = 0;
  int limit_ = 0;  // workers taking tasks in this call
  std::atomic<int64_t> next_{0};
  int active_ = 0;
  uint64_t generation_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;
};

/// kAutotune's parallelism: enough workers that a round of elements (a batch, a window) is
/// mapped within 80% of the pipeline's period (from one round's start to the next's), from the
/// measured time per element. When the consumer waits for the map, the period is the round
/// itself and the count grows by a quarter per round up to the maximum; when the consumer is
/// slower (a training step), it falls to what keeps up, leaving the other cores to the step.
class ParallelismTuner {
 public:
  explicit ParallelismTuner(int max_workers) : max_(max_workers), workers_(max_workers) {}
  /// Workers for the next round.
  int workers() const { return workers_; }
  /// A round of `elements` took `busy_seconds` of mapping summed over its workers, and
  /// `period_seconds` since the previous round started (0 for the first round: not used).
  void record(int64_t elements, double busy_seconds, double period_seconds);

 private:
  int max_;
  int workers_;
  double per_element_ = 0;  // smoothed seconds of one element on one worker
  double period_ = 0;       // smoothed seconds per element of the pipeline's period
};

/// Times one round of a pool for a ParallelismTuner (and nothing without one): the tasks'
/// durations summed per worker, and the period since the previous round started.
class RoundTimer {
 public:
  using Clock = std::chrono::steady_clock;
  /// `last_start`: the previous round's start, kept by the caller (updated by finish()).
  RoundTimer(ParallelismTuner* tuner, int workers, Clock::time_point& last_start)
      : tuner_(tuner),
        busy_(tuner != nullptr ? static_cast<size_t>(workers) : 0, 0.0),
        last_start_(last_start),
        start_(tuner != nullptr ? Clock::now() : Clock::time_point{}) {}

  /// Adds the lifetime of this object (one task) to `worker`'s busy time.
  class Task {
   public:
    Task(RoundTimer& timer, int worker)
        : timer_(timer.tuner_ != nullptr ? &timer : nullptr),
          worker_(static_cast<size_t>(worker)),
          start_(timer_ != nullptr ? Clock::now() : Clock::time_point{}) {}
    ~Task() {
      if (timer_ != nullptr)
        timer_->busy_[worker_] += std::chrono::duration<double>(Clock::now() - start_).count();
    }
    Task(const Task&) = delete;
    Task& operator=(const Task&) = delete;

   private:
    RoundTimer* timer_;
    size_t worker_;
    Clock::time_point start_;
  };

  /// The round of `elements` is done: tells the tuner.
  void finish(int64_t elements) {
    if (tuner_ == nullptr) return;
    const double period = last_start_ == Clock::time_point{}
                              ? 0.0
                              : std::chrono::duration<double>(start_ - last_start_).count();
    last_start_ = start_;
    tuner_->record(elements, std::accumulate(busy_.begin(), busy_.end(), 0.0), period);
  }

 private:
  ParallelismTuner* tuner_;
  std::vector<double> busy_;  // each worker writes its own entry
  Clock::time_point& last_start_;
  Clock::time_point start_;
};

}  // namespace tandem::data::detail
