// The replica threads of a strategy: each waits for the next run, runs its piece of the task
// bound to its replica, and reports back; run() collects their errors, re-raises the cause with
// the replica id, and gives up on a replica stuck in user code instead of waiting forever.
#include "tandem/distribute/internal/replica_threads.h"

#include <algorithm>
#include <chrono>
#include <mutex>

#include "tandem/autograd/tape.h"
#include "tandem/collectives/internal/replica_list.h"
#include "tandem/core/cpu_isa.h"
#include "tandem/core/logging.h"
#include "tandem/core/spans.h"
#include "tandem/core/threading.h"
#include "tandem/distribute/internal/replica_scope.h"
#include "tandem/distribute/internal/state.h"

namespace tandem::detail {

namespace {

thread_local const ReplicaThreads* t_thread_of = nullptr;  // whose replica thread this is

/// How long run still waits for a replica once a peer's collective timed out waiting for it
/// (at most the collective timeout): time for the replicas released from that collective to
/// unwind.
constexpr std::chrono::milliseconds kStuckGrace{500};

bool is_aborted(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const collectives::AbortedError&) {
    return true;
  } catch (...) {
    return false;
  }
}

/// Once per process, as the first CPU replica threads start: how they behave on cores that other
/// processes share (core/threading.h), in the start-up log.
void report_core_sharing(int num_replicas) {
  static std::once_flag once;
  std::call_once(once, [num_replicas] {
    TANDEM_LOG_INFO("CPU kernels: ", cpu_isa_description(),
                    " (oneDNN's and Tandem's own; TANDEM_MAX_CPU_ISA=avx2, avx512_core, "
                    "avx512_core_bf16 or avx512_core_amx caps them)");
    const int cores = hardware_cores(), threads = std::max(1, cores / num_replicas);
    if (!core_sharing()) {
      TANDEM_LOG_INFO("CPU replicas: ", threads, " compute thread", threads == 1 ? "" : "s",
                      " each on ", cores, " core", cores == 1 ? "" : "s",
                      ", whether or not other processes keep some busy (TANDEM_SHARE_CORES=0)");
      return;
    }
    const bool slices = request_short_time_slices();
    TANDEM_LOG_INFO("CPU replicas: ", threads, " compute thread", threads == 1 ? "" : "s",
                    " each on ", cores, " core", cores == 1 ? "" : "s",
                    ", fewer while other processes keep cores busy; the loop's and the replicas' "
                    "threads ",
                    slices ? "run in 0.1 ms time slices"
                           : "keep the kernel's time slices (short ones need Linux 6.12)",
                    " (TANDEM_SHARE_CORES=0 turns both off)");
  });
}

bool is_timeout(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const TimeoutError&) {
    return true;
  } catch (...) {
    return false;
  }
}

}  // namespace

ReplicaThreads::ReplicaThreads(Options options)
    : options_(std::move(options)), num_replicas_(static_cast<int>(options_.devices.size())) {
  for (const Device& d : options_.devices) any_gpu_ = any_gpu_ || d.is_cuda();
  worker_spin_ = num_replicas_ < hardware_cores() ? SpinPolicy::kPause : SpinPolicy::kYield;
  errors_.assign(static_cast<size_t>(num_replicas_), nullptr);
  finished_.assign(static_cast<size_t>(num_replicas_), 0);
  task_seconds_.assign(static_cast<size_t>(num_replicas_), 0.0);
  compute_seconds_.assign(static_cast<size_t>(num_replicas_), 0.0);
  run_start_.resize(static_cast<size_t>(num_replicas_));
  run_end_.resize(static_cast<size_t>(num_replicas_));
  if (options_.on_calling_thread) return;
  if (!any_gpu_) report_core_sharing(num_replicas_);
  try {
    for (int r = 0; r < num_replicas_; ++r)
      threads_.emplace_back(&ReplicaThreads::thread_main, this, r);
  } catch (...) {
    stop();
    throw;
  }
}

ReplicaThreads::~ReplicaThreads() { stop(); }

int ReplicaThreads::stop() {
  int detached = 0;
  std::vector<char> returned;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
    // After a run gave up on replicas, only those that have returned since can be joined.
    returned = broken_.empty() ? std::vector<char>(threads_.size(), 1) : finished_;
  }
  work_cv_.notify_all();
  for (size_t r = 0; r < threads_.size(); ++r) {
    if (!threads_[r].joinable()) continue;
    // A thread still inside a replica function may never return: it keeps running
    // (detached) with this state, which the strategy then leaves to it.
    if (returned[r]) {
      threads_[r].join();
    } else {
      threads_[r].detach();
      ++detached;
    }
  }
  threads_.clear();
  return detached;
}

std::string ReplicaThreads::broken() {
  std::lock_guard<std::mutex> lock(mutex_);
  return broken_;
}

void ReplicaThreads::check_usable(const char* what) {
  std::lock_guard<std::mutex> lock(mutex_);
  TANDEM_CHECK(broken_.empty(), options_.name, ".", what,
               ": the strategy is unusable: an earlier run ", "gave up on its replicas: ", broken_,
               ". Its replica threads may still be running user code; create a new strategy "
               "(or end the process)");
}

// ---- a replica thread -------------------------------------------------------------------------

void ReplicaThreads::thread_main(int id) {
  ReplicaContext& ctx = *options_.contexts[static_cast<size_t>(id)];
  // Its compute threads: its share of the cores, or what a task of it set (below).
  int compute_budget = std::max(1, hardware_cores() / num_replicas_);
  // It sleeps at each hand-off: once woken, it should get a core before other processes' slices
  // end (core/threading.h).
  request_short_time_slices();
  const ReplicaScope scope({.context = &ctx,
                            .local_replica = id,
                            .num_local_replicas = num_replicas_,
                            .first_global_replica = options_.worker_index * num_replicas_,
                            .num_replicas_in_sync = options_.num_workers * num_replicas_,
                            .compute_threads = compute_budget,
                            .creator = options_.creator});
  t_thread_of = this;
  uint64_t seen = 0;
  for (;;) {
    ReplicaTask task{nullptr, nullptr, nullptr};
    // Training loops call run back to back: poll for the next generation a moment first.
    {
      BlockedWait wait(next_run_budget_);
      wait.spin([&] { return generation_.load(std::memory_order_acquire) != seen; }, worker_spin_);
      // Sleeps until run() publishes a new generation (or the strategy shuts down).
      std::unique_lock<std::mutex> lock(mutex_);
      work_cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      task = task_;
    }
    scope.begin_run(seen);
    {
      // Scoped so that this thread's reference to the exception is gone before the decrement
      // below lets run() read, re-raise and free it.
      std::exception_ptr error;
      try {
        // Subnormals flushed, as TensorFlow runs ops (core/threading.h); the OpenMP team this
        // thread starts is created with its mode and parallel loops pass it on.
        const ScopedFloatMode float_mode;
        // Fewer compute threads while other processes keep some of the cores busy: a team
        // wider than the cores it gets waits at every barrier for a descheduled member.
        const int adapted = adapt_compute_threads(compute_budget, num_replicas_);
        run_start_[static_cast<size_t>(id)].wait();
        // Compute: the task less its time outside compute on this thread (collectives, waits
        // for buckets, the optimizer, host syncs; profile::outside_compute_ns), the figure the
        // timeline reads from the task's span too.
        profile::Span step(profile::Phase::kStep);
        const int64_t start_ns = profile::now_ns();
        const int64_t outside_before = profile::outside_compute_ns();
        task.call(task.object, ctx);
        // A task that set this thread's compute-thread count (tandem::set_compute_threads)
        // keeps it: it becomes the replica's budget for the runs that follow.
        if (compute_threads() != adapted) compute_budget = compute_threads();
        ctx.finish_task(/*succeeded=*/true);  // buckets of a step never applied
        const int64_t task_ns = profile::now_ns() - start_ns;
        const int64_t compute_ns =
            std::max<int64_t>(0, task_ns - (profile::outside_compute_ns() - outside_before));
        step.set_compute_ns(compute_ns);
        step.end();
        // Each thread writes its own slot; run() returns (and readers read) after the decrement.
        task_seconds_[static_cast<size_t>(id)] = static_cast<double>(task_ns) * 1e-9;
        compute_seconds_[static_cast<size_t>(id)] = static_cast<double>(compute_ns) * 1e-9;
        run_end_[static_cast<size_t>(id)].record(ctx.device());
      } catch (...) {
        error = std::current_exception();
      }
      if (error) {
        // Releases the peers: whoever waits in (or later enters) a collective this replica
        // will never join raises AbortedError at once instead of waiting for the timeout.
        options_.group->abort(
            str_cat("replica ", id, " raised an exception: ", describe_exception(error)));
        // Its buckets in flight end at once in the aborted group; none may outlive the run.
        try {
          ctx.finish_task(/*succeeded=*/false);
        } catch (...) {
        }
        errors_[static_cast<size_t>(id)] = std::move(error);
      } else {
        // Peers still waiting for a collective this replica never made raise at once.
        options_.group->depart(id);
      }
    }
    {
      // After this decrement the caller may return: nothing of the task is touched below. The
      // caller learns of every return, not only the last: it times the stragglers from the first.
      std::lock_guard<std::mutex> lock(mutex_);
      finished_[static_cast<size_t>(id)] = 1;
      pending_.fetch_sub(1, std::memory_order_acq_rel);
      done_cv_.notify_all();
    }
  }
}

// ---- run ----------------------------------------------------------------------------------------

void ReplicaThreads::run(const ReplicaTask& task) {
  TANDEM_CHECK(t_thread_of != this && current_replica_context() == nullptr, options_.name,
               ".run was called from inside a replica function (or a merge_call function); "
               "strategy.run cannot nest. Call the function directly instead");
  std::lock_guard<std::mutex> run_lock(run_mutex_);
  check_usable("run");
  std::fill(errors_.begin(), errors_.end(), nullptr);
  // No replica is inside a collective between runs, so the group can restart its call numbers
  // (#1 is the first collective of this run) and forget the previous run's abort.
  options_.group->reset();
  // The run on the training loop's timeline; each replica marks its own task on its track.
  const profile::Span run_span(profile::Phase::kStep, {profile::TrackKind::kLoop, 0});

  if (options_.on_calling_thread) {
    const ReplicaScope scope({.context = options_.contexts[0],
                              .local_replica = 0,
                              .num_local_replicas = 1,
                              .first_global_replica = options_.worker_index,
                              .num_replicas_in_sync = options_.num_workers,
                              .compute_threads = std::nullopt,
                              .creator = std::nullopt});
    scope.begin_run(++generation_);
    try {
      const ScopedFloatMode float_mode;  // as on replica threads; restored for the caller
      const profile::Span step(profile::Phase::kStep);
      task.call(task.object, *options_.contexts[0]);
    } catch (...) {
      errors_[0] = std::current_exception();
    }
  } else {
    // The loop's thread sleeps while the replicas compute, and each step waits for it to wake.
    static thread_local const bool short_slices = request_short_time_slices();
    (void)short_slices;
    if (any_gpu_) {
      for (int r = 0; r < num_replicas_; ++r)
        run_start_[static_cast<size_t>(r)].record(options_.devices[static_cast<size_t>(r)]);
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      task_ = task;
      pending_ = num_replicas_;
      std::fill(finished_.begin(), finished_.end(), 0);
      ++generation_;
    }
    work_cv_.notify_all();
    // Every replica finishes (or is released from its collectives) before run returns, so
    // the task and its captures on this stack stay valid while any thread uses them...
    auto all_done = [&] { return pending_.load(std::memory_order_acquire) == 0; };
    BlockedWait wait(run_end_budget_);
    if (!wait.spin(all_done, SpinPolicy::kYield)) wait_for_replicas();
    if (any_gpu_)
      for (const StreamEvent& end : run_end_) end.wait();
  }
  // A replica failed: the others may have finished their step, buckets and all, before the
  // abort reached them. Every replica forgets its bucket layout, so that the next run lays them
  // out on every replica alike (a replica keeping its buckets while another made new ones would
  // pair a bucket with a whole-gradient all-reduce).
  if (std::any_of(errors_.begin(), errors_.end(), [](const std::exception_ptr& e) { return e; }) &&
      pending_.load(std::memory_order_acquire) == 0)
    for (ReplicaContext* ctx : options_.contexts) ctx->forget_bucket_layout();
  raise_errors();
}

void ReplicaThreads::wait_for_replicas() {
  // A replica that has not returned within the collective timeout after the first one did is
  // stuck in user code (a collective would have raised by then); so is one still running
  // kStuckGrace after a peer's collective timed out (the peer waited a whole timeout for it
  // already, and the replicas waiting with it are released at once). run gives up on it: the
  // strategy becomes unusable, the peers are released from their collectives, and run raises on
  // the calling thread instead of waiting for a thread that may never come back.
  using Clock = std::chrono::steady_clock;
  std::unique_lock<std::mutex> lock(mutex_);
  auto all_done = [&] { return pending_.load(std::memory_order_acquire) == 0; };
  auto any_done = [&] { return pending_.load(std::memory_order_acquire) < num_replicas_; };
  done_cv_.wait(lock, any_done);
  const std::chrono::milliseconds timeout = collectives::collective_timeout();
  const std::chrono::milliseconds grace = std::min(timeout, kStuckGrace);
  Clock::time_point deadline = Clock::now() + timeout;
  int timed_out = -1;  // a replica whose collective timed out (its error is a TimeoutError)
  // Each replica notifies done_cv_ when it returns, so the deadline is revised at each return.
  while (!all_done()) {
    for (int r = 0; r < num_replicas_ && timed_out < 0; ++r) {
      const std::exception_ptr& error = errors_[static_cast<size_t>(r)];
      if (finished_[static_cast<size_t>(r)] && error && is_timeout(error)) {
        timed_out = r;
        deadline = std::min(deadline, Clock::now() + grace);
      }
    }
    if (done_cv_.wait_until(lock, deadline) == std::cv_status::timeout) break;
  }
  if (all_done()) return;

  std::vector<int> stuck, returned;
  for (int r = 0; r < num_replicas_; ++r)
    (finished_[static_cast<size_t>(r)] ? returned : stuck).push_back(r);
  // What the replicas that returned raised: the first one's own error (not the AbortedError
  // of a replica released because of another's failure).
  int cause = -1;
  for (int r : returned) {
    const std::exception_ptr& error = errors_[static_cast<size_t>(r)];
    if (error &&
        (cause < 0 || (is_aborted(errors_[static_cast<size_t>(cause)]) && !is_aborted(error))))
      cause = r;
  }
  const double seconds = static_cast<double>(timeout.count()) / 1000.0;
  std::string reason =
      timed_out >= 0
          ? str_cat(replica_list(stuck), " did not return from the replica function: replica ",
                    timed_out, "'s collective timed out after ", seconds,
                    " s (TANDEM_COLLECTIVE_TIMEOUT) waiting for it, and it was still running ",
                    static_cast<double>(grace.count()) / 1000.0, " s later")
          : str_cat(replica_list(stuck), " did not return from the replica function ", "within ",
                    seconds, " s (TANDEM_COLLECTIVE_TIMEOUT) after ", replica_list(returned),
                    " finished");
  if (cause >= 0)
    reason += str_cat("; replica ", cause,
                      " raised: ", describe_exception(errors_[static_cast<size_t>(cause)]));
  broken_ = reason;
  lock.unlock();
  options_.group->abort(reason);  // a stuck replica that later enters a collective raises at once
  throw TimeoutError(
      str_cat(options_.name, ".run: ", reason,
              ". The strategy is unusable from now on: every later call raises at once, and the "
              "stuck replica threads are left running"));
}

void ReplicaThreads::raise_errors() {
  // The cause is the first replica whose error is its own (not AbortedError, which marks a
  // replica released from a collective because of another replica's failure).
  int cause = -1;
  for (int r = 0; r < num_replicas_ && cause < 0; ++r)
    if (errors_[static_cast<size_t>(r)] && !is_aborted(errors_[static_cast<size_t>(r)])) cause = r;
  for (int r = 0; r < num_replicas_ && cause < 0; ++r)
    if (errors_[static_cast<size_t>(r)]) cause = r;
  if (cause < 0) return;

  const std::exception_ptr error = errors_[static_cast<size_t>(cause)];
  // Replicas usually fail alike (the same bad argument reaches every replica): one message,
  // naming every replica that raised it, instead of the same text once per replica.
  const std::string cause_text = describe_exception(error);
  std::vector<int> same{cause};
  std::vector<int> released;
  std::vector<std::pair<int, std::string>> others;  // a replica and its own, different, error
  for (int r = 0; r < num_replicas_; ++r) {
    const std::exception_ptr& e = errors_[static_cast<size_t>(r)];
    if (r == cause || !e) continue;
    if (is_aborted(e)) {
      released.push_back(r);
      continue;
    }
    std::string text = describe_exception(e);
    if (text == cause_text)
      same.push_back(r);
    else
      others.emplace_back(r, std::move(text));
  }
  std::string message = str_cat(replica_list(same), ": ", cause_text);
  for (const auto& [r, text] : others)
    message += str_cat(" [replica ", r, " also failed: ", text, "]");
  if (!released.empty())
    message += str_cat(" [", replica_list(released), released.size() == 1 ? " was" : " were",
                       " released from pending collectives]");
  // The same type, and where the library raised it (Error::location()).
  try {
    std::rethrow_exception(error);
  } catch (const TimeoutError& e) {
    throw TimeoutError(message, e.location());
  } catch (const NotBuiltError& e) {
    throw NotBuiltError(message, e.location());
  } catch (const Error& e) {
    throw Error(message, e.location());
  } catch (...) {
    throw Error(message);
  }
}

}  // namespace tandem::detail
