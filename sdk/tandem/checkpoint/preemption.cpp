// PreemptionCheckpointHandler (preemption.h): a flag the signal handlers set, agreed on by
// every worker at a step boundary, then a save of the job's state and a stop.
#include "tandem/checkpoint/preemption.h"

#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <vector>

#include "tandem/core/error.h"
#include "tandem/core/logging.h"
#include "tandem/core/workers.h"
#include "tandem/distribute/strategy.h"

namespace tandem {

namespace {

// Written by the signal handlers, read by the training loop: lock-free atomics are safe in both.
std::atomic<bool> g_signalled{false};
// Set when the job agreed to stop (this worker's signal or another's): the process is on its way
// out, and keeps its flag-only handlers (see the destructor).
std::atomic<bool> g_stopping{false};
std::atomic<bool> g_installed{false};
struct sigaction g_previous_term {};
struct sigaction g_previous_int {};

std::atomic<int> g_interrupts{0};

// SIGTERM may come several times (a scheduler signals every process of the job, and tandem-run
// passes its own on): each only sets the flag. A second SIGINT (Ctrl-C twice) ends the program
// at once: the default action, restored and raised (both async-signal-safe).
extern "C" void on_stop_signal(int signal) {
  g_signalled.store(true, std::memory_order_relaxed);
  if (signal == SIGINT && g_interrupts.fetch_add(1, std::memory_order_relaxed) >= 1) {
    std::signal(SIGINT, SIG_DFL);
    std::raise(SIGINT);
  }
}

}  // namespace

PreemptionCheckpointHandler::PreemptionCheckpointHandler(const Strategy& strategy,
                                                         CheckpointManager& manager,
                                                         const PreemptionOptions& options)
    : strategy_(strategy), manager_(manager), options_(options) {
  TANDEM_CHECK(!g_installed.exchange(true), "PreemptionCheckpointHandler: another one is alive in ",
               "this process; make one per training loop");
  g_signalled.store(false, std::memory_order_relaxed);
  g_stopping.store(false, std::memory_order_relaxed);
  g_interrupts.store(0, std::memory_order_relaxed);
  struct sigaction action {};
  action.sa_handler = on_stop_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;  // interrupted system calls resume
  // After a preemption an earlier handler left on_stop_signal in place (see the destructor):
  // the actions to put back are still the ones it saved.
  struct sigaction term {};
  struct sigaction interrupt {};
  sigaction(SIGTERM, &action, &term);
  sigaction(SIGINT, &action, &interrupt);
  if (term.sa_handler != on_stop_signal) g_previous_term = term;
  if (interrupt.sa_handler != on_stop_signal) g_previous_int = interrupt;
}

PreemptionCheckpointHandler::~PreemptionCheckpointHandler() {
  // Once a stop was asked for (a signal to this worker, or the job's agreement to stop because
  // another worker was signalled), the process is on its way out (it saved, or is unwinding to
  // exit with kPreemptedExitStatus): SIGTERMs still coming (a scheduler signals every process
  // of the job, again and again) must not kill it with the default action on the way, which
  // would turn a preemption into a failure. The handlers stay; they only set the flag.
  if (!g_signalled.load(std::memory_order_relaxed) && !g_stopping.load(std::memory_order_relaxed)) {
    sigaction(SIGTERM, &g_previous_term, nullptr);
    sigaction(SIGINT, &g_previous_int, nullptr);
  }
  g_installed.store(false);
}

bool PreemptionCheckpointHandler::signalled() const {
  return g_signalled.load(std::memory_order_relaxed);
}

void PreemptionCheckpointHandler::request_preemption() {
  g_signalled.store(true, std::memory_order_relaxed);
}

bool PreemptionCheckpointHandler::job_preempted() const {
  const bool preempted = signalled();
  const std::shared_ptr<WorkerGroup> workers =
      strategy_.num_workers() > 1 ? worker_group() : nullptr;
  if (!workers) {
    if (preempted) g_stopping.store(true, std::memory_order_relaxed);
    return preempted;
  }
  // Every worker's flag, added: any worker's signal stops the whole job at this step.
  std::vector<double> flags = {preempted ? 1.0 : 0.0};
  workers->sum(flags,
               "preemption check (every worker calls save_checkpoint_if_preempted at "
               "the same step)");
  if (flags[0] > 0.0) g_stopping.store(true, std::memory_order_relaxed);
  return flags[0] > 0.0;
}

bool PreemptionCheckpointHandler::save_checkpoint_if_preempted() {
  if (!job_preempted()) return false;
  // An earlier background save that failed must not stop this one (it is reported here).
  try {
    manager_.wait();
  } catch (const std::exception& e) {
    TANDEM_LOG_ERROR("preemption: an earlier background save had failed: ", e.what());
  }
  saved_ = manager_.save({.step = std::nullopt, .check_interval = false});
  manager_.wait();  // with asynchronous saves: durable before the job stops
  if (strategy_.is_chief())
    TANDEM_LOG_WARNING("preempted: a worker was asked to stop; saved ", saved_.value_or("nothing"),
                       "; every worker stops with exit status ", kPreemptedExitStatus);
  if (options_.exit_process) {
    std::fflush(nullptr);
    std::exit(kPreemptedExitStatus);
  }
  return true;
}

}  // namespace tandem
