// WorkerPool (internal/worker_pool.h).
#include "tandem/data/internal/worker_pool.h"

#include <algorithm>
#include <cmath>

namespace tandem::data::detail {

WorkerPool::WorkerPool(int workers) {
  for (int w = 1; w < workers; ++w) threads_.emplace_back([this, w] { loop(w); });
}

WorkerPool::~WorkerPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  start_.notify_all();
  for (std::thread& t : threads_) t.join();
}

void WorkerPool::run(int64_t tasks, const std::function<void(int64_t, int)>& fn, int max_workers) {
  if (tasks <= 0) return;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    fn_ = &fn;
    tasks_ = tasks;
    limit_ = max_workers <= 0 ? workers() : max_workers;
    next_.store(0);
    active_ = static_cast<int>(threads_.size());
    error_ = nullptr;
    ++generation_;
  }
  start_.notify_all();
  work(0);
  std::unique_lock<std::mutex> lock(mutex_);
  done_.wait(lock, [&] { return active_ == 0; });
  fn_ = nullptr;
  if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
}

void WorkerPool::loop(int worker) {
  uint64_t seen = 0;
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    start_.wait(lock, [&] { return stop_ || generation_ != seen; });
    if (stop_) return;
    seen = generation_;
    lock.unlock();
    work(worker);
    lock.lock();
    if (--active_ == 0) done_.notify_all();
  }
}

void WorkerPool::work(int worker) {
  if (worker >= limit_) return;
  for (;;) {
    const int64_t task = next_.fetch_add(1);
    if (task >= tasks_) return;
    try {
      (*fn_)(task, worker);
    } catch (...) {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!error_) error_ = std::current_exception();
    }
  }
}

void ParallelismTuner::record(int64_t elements, double busy_seconds, double period_seconds) {
  if (elements <= 0) return;
  const double n = static_cast<double>(elements);
  const auto smooth = [](double& value, double sample) {
    value = value == 0 ? sample : 0.5 * (value + sample);
  };
  smooth(per_element_, busy_seconds / n);
  if (period_seconds <= 0) return;
  smooth(period_, period_seconds / n);
  // Workers that map a round within 80% of the period; at most a quarter more than now (and
  // one), so that a round the map itself made short grows the count step by step.
  const double needed = per_element_ / (0.8 * period_);
  const int grown = std::max(workers_ + 1, (workers_ * 5 + 3) / 4);
  const double wanted = std::ceil(std::min(needed, static_cast<double>(grown)));
  workers_ = static_cast<int>(std::clamp(wanted, 1.0, static_cast<double>(max_)));
}

}  // namespace tandem::data::detail
