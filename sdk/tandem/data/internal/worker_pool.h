// WorkerPool (internal): a fixed set of threads that run the tasks of one call at a time, the
// calling thread working alongside them; used by map(fn, num_parallel_calls).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
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
  /// Calls fn(task, worker) for every task in [0, tasks), each once, spread over the workers;
  /// returns when all are done. The first exception a task threw is rethrown then.
  void run(int64_t tasks, const std::function<void(int64_t task, int worker)>& fn);

 private:
  void loop(int worker);
  void work(int worker);

  std::vector<std::thread> threads_;
  std::mutex mutex_;
  std::condition_variable start_;
  std::condition_variable done_;
  const std::function<void(int64_t, int)>* fn_ = nullptr;
  int64_t tasks_ = 0;
  std::atomic<int64_t> next_{0};
  int active_ = 0;
  uint64_t generation_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;
};

}  // namespace tandem::data::detail
