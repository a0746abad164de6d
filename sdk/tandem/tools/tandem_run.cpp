// tandem-run: starts a job's workers on this machine, each with its TF_CONFIG, and keeps the
// job going (docs/fault-tolerance.md).
//
//   tandem-run --workers N [--min-workers M] [--max-restarts K] [--grace S] [--start-window S]
//              -- PROGRAM ARGS...
//
// Each worker's output is prefixed with "[worker I] ". When a worker fails, tandem-run stops
// the others (SIGTERM, then SIGKILL after --grace seconds) and starts all of them again, at
// most K times; the program resumes from its newest checkpoint (the samples do by default). A
// worker that fails within --start-window seconds of its start twice in a row is left out when
// at least M workers remain (the job resumes at the smaller replica count), else tandem-run
// stops naming it. A worker that exits with kPreemptedExitStatus (75) saved and stopped on
// SIGTERM: the job is restarted without counting a failure. SIGTERM or SIGINT to tandem-run is
// passed once to every worker, and tandem-run exits when they have (75 when they all saved);
// more SIGTERMs are ignored while they save (SIGKILL only --grace seconds after the SIGTERM,
// or at a second Ctrl-C).
// The last line says what happened; the exit status is 0 when the job finished.
#include <algorithm>
#include <cstdio>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "tandem/core/exit_status.h"
#include "tandem_run_nodes.h"
#include "tandem_run_options.h"
#include "tandem_run_workers.h"

using namespace tandem::run;  // NOLINT: this program's own namespace

namespace {

constexpr int kStartFailuresToLeaveOut = 2;  // failures at start in a row that leave a worker out

}  // namespace

int main(int argc, char** argv) {
  const std::optional<Options> parsed = parse(argc, argv);
  if (!parsed) return usage(stderr, kExitUsage);
  const Options& o = *parsed;
  install_signals();
  if (!o.rendezvous.empty()) return run_nodes(o);

  std::vector<int> slots;  // the workers still in the job
  for (int i = 0; i < o.workers; ++i) slots.push_back(i);
  std::vector<int> lost;
  std::pair<int, int> start_failures{-1, 0};  // (worker, its failures at start in a row)
  int restarts = 0, preemptions = 0;
  bool stop_requested = false;
  std::string last_failure = "none";
  auto summary = [&](const char* how, const std::string& why) {
    std::string lost_text;
    for (const int s : lost) lost_text += (lost_text.empty() ? "" : ", ") + std::to_string(s);
    std::printf(
        "tandem-run: %s: %s; %d of %d restarts used (last failure: %s), %d preemption%s, "
        "%zu worker%s lost%s%s%s\n",
        how, why.c_str(), restarts, o.max_restarts, last_failure.c_str(), preemptions,
        preemptions == 1 ? "" : "s", lost.size(), lost.size() == 1 ? "" : "s",
        lost.empty() ? "" : " (", lost_text.c_str(), lost.empty() ? "" : ")");
    std::fflush(stdout);
  };

  bool previous_saved = true;  // the previous attempt's workers all saved (preempted)
  for (int attempt = 0;; ++attempt) {
    // A stop asked for between attempts: no new workers (they would die before they could
    // install their handlers).
    if (stop_signal_pending()) {
      summary("stopped", previous_saved ? "asked to stop before the restart; every worker had "
                                          "saved and stopped"
                                        : "asked to stop before the restart");
      return previous_saved ? tandem::kPreemptedExitStatus : 1;
    }
    const std::vector<int> ports = free_ports("127.0.0.1", static_cast<int>(slots.size()));
    std::vector<std::string> addresses;
    for (const int port : ports) addresses.push_back("127.0.0.1:" + std::to_string(port));
    const std::string token = random_token();
    std::vector<Worker> workers(slots.size());
    const Clock::time_point started = Clock::now();
    std::string pids;
    for (size_t i = 0; i < slots.size(); ++i) {
      workers[i].slot = slots[i];
      start_worker(o, workers[i], tf_config(addresses, i), attempt, token);
      pids += " worker " + std::to_string(slots[i]) + " pid " + std::to_string(workers[i].pid) +
              (i + 1 < slots.size() ? "," : "");
    }
    std::fprintf(stderr,
                 "tandem-run: attempt %d: started %zu worker%s (chief at 127.0.0.1:%d):%s\n",
                 attempt + 1, slots.size(), slots.size() == 1 ? "" : "s", ports[0], pids.c_str());
    const Outcome outcome = supervise(o, workers, started, stop_requested);

    switch (outcome.kind) {
      case Outcome::kFinished:
        summary("finished", "the job ended on " + std::to_string(slots.size()) + " worker" +
                                (slots.size() == 1 ? "" : "s"));
        return 0;
      case Outcome::kStopped:
        summary("stopped", outcome.all_saved ? "asked to stop; every worker saved and stopped"
                                             : "asked to stop; not every worker saved");
        return outcome.all_saved ? tandem::kPreemptedExitStatus : 1;
      case Outcome::kPreempted:
        ++preemptions;
        previous_saved = true;
        std::fprintf(stderr,
                     "tandem-run: the workers saved and stopped (preempted); restarting "
                     "them (not counted as a failure)\n");
        continue;
      case Outcome::kFailed:
        previous_saved = false;
        break;
    }
    last_failure =
        "worker " + std::to_string(outcome.slot) + ", " + describe_status(outcome.status);
    // Failures at start in a row: the same worker, each within --start-window of its start.
    if (outcome.seconds < o.start_window_seconds) {
      start_failures = {outcome.slot,
                        outcome.slot == start_failures.first ? start_failures.second + 1 : 1};
    } else {
      start_failures = {-1, 0};
    }
    if (start_failures.second >= kStartFailuresToLeaveOut) {
      const int remain = static_cast<int>(slots.size()) - 1;
      if (remain < o.min_workers) {
        summary("failed", "worker " + std::to_string(outcome.slot) + " failed to start " +
                              std::to_string(start_failures.second) + " times in a row (" +
                              describe_status(outcome.status) + "); leaving it out would leave " +
                              std::to_string(remain) + " worker" + (remain == 1 ? "" : "s") +
                              ", fewer than --min-workers " + std::to_string(o.min_workers));
        return exit_code_of(outcome.status);
      }
      std::fprintf(stderr,
                   "tandem-run: worker %d failed to start %d times in a row; leaving it "
                   "out, %d workers remain (--min-workers %d)\n",
                   outcome.slot, start_failures.second, remain, o.min_workers);
      slots.erase(std::find(slots.begin(), slots.end(), outcome.slot));
      lost.push_back(outcome.slot);
      start_failures = {-1, 0};
    }
    if (restarts >= o.max_restarts) {
      summary("failed", "worker " + std::to_string(outcome.slot) + " failed (" +
                            describe_status(outcome.status) + ") and no restarts are left " +
                            "(--max-restarts " + std::to_string(o.max_restarts) + ")");
      return exit_code_of(outcome.status);
    }
    ++restarts;
    std::fprintf(stderr,
                 "tandem-run: restart %d of %d: starting the workers again; they resume "
                 "from the newest checkpoint\n",
                 restarts, o.max_restarts);
  }
}
