// tandem-run's workers on this machine (tandem_run.cpp): starting them with their TF_CONFIG,
// passing their output on with a "[worker I] " prefix, and watching one attempt until every
// worker has exited. Used alone on one machine, and by each machine of a several-machine job
// (tandem_run_nodes.cpp), which also watches its link to the rendezvous.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <string>
#include <vector>

#include "tandem_run_options.h"

namespace tandem::run {

using Clock = std::chrono::steady_clock;

/// Seconds the other workers get to notice a failed worker and exit by themselves (they raise,
/// naming it, within milliseconds) before SIGTERM.
inline constexpr double kSelfStopSeconds = 2.0;

/// SIGCHLD, SIGTERM, SIGINT and SIGHUP go to a self-pipe that supervise() polls.
void install_signals();
/// Reads the signals that came in (without waiting); true when one asks tandem-run to stop.
bool stop_signal_pending();
/// The read end of the self-pipe (to poll beside other descriptors).
int signal_fd();

/// `count` distinct free TCP ports on the IPv4 address `host` ("127.0.0.1" for loopback).
std::vector<int> free_ports(const std::string& host, int count);
/// 32 random hex digits (a job token).
std::string random_token();
/// TF_CONFIG for the worker at `index` of `addresses` ("host:port" each).
std::string tf_config(const std::vector<std::string>& addresses, size_t index);
/// "exit status 3", "killed by signal 9 (SIGKILL)", ...
std::string describe_status(int status);
/// The status tandem-run exits with for a worker's wait status.
int exit_code_of(int status);
/// A duration from now.
Clock::time_point after(double seconds);

struct Stream {
  int fd = -1;
  FILE* sink = nullptr;
  std::string pending;  // a line not yet ended
};

struct Worker {
  int slot = 0;  // the worker's index as printed and in TANDEM_RUN_WORKER (kept across restarts)
  pid_t pid = -1;
  Stream out, err;
  bool running = false;
  int status = 0;
};

/// Starts `w` running o.command with TF_CONFIG=config, TANDEM_JOB_TOKEN=token,
/// TANDEM_RUN_WORKER=w.slot and TANDEM_RUN_ATTEMPT=attempt, in its own process group.
void start_worker(const Options& o, Worker& w, const std::string& config, int attempt,
                  const std::string& token);

struct Outcome {
  enum Kind { kFinished, kPreempted, kFailed, kStopped } kind = kFinished;
  int slot = -1;           // kFailed: the first worker that failed
  int status = 0;          // its wait status
  double seconds = 0;      // how long after the start it failed
  bool all_saved = true;   // kStopped: every worker exited preempted (or finished)
  std::string stopped_by;  // kFailed with slot -1: what the other machines reported
};

/// The other machines of a job, as one attempt sees them.
class Link {
 public:
  virtual ~Link() = default;
  /// A descriptor to poll for reading.
  virtual int fd() const = 0;
  /// Something came already (read with an earlier message, or the other end closed): call
  /// on_readable() without waiting for the descriptor.
  virtual bool ready() const { return false; }
  /// Reads what came; returns a reason to stop the workers here ("" to go on).
  virtual std::string on_readable() = 0;
  /// A worker here failed (`what` names it; `status`: what tandem-run would exit with): tell
  /// the others now.
  virtual void worker_failed(const std::string& what, int status) = 0;
};

/// Runs one attempt until every worker has exited. `link` (may be null) is polled beside the
/// workers; `address` names this machine in messages ("" on one machine).
Outcome supervise(const Options& o, std::vector<Worker>& workers, Clock::time_point started,
                  bool& stop_requested, Link* link = nullptr, const std::string& address = "");

}  // namespace tandem::run
