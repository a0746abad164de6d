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
// passed to every worker, and tandem-run exits when they have (75 when they all saved).
// The last line says what happened; the exit status is 0 when the job finished.
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "tandem/core/exit_status.h"
#include "tandem_run_options.h"

namespace {

using Clock = std::chrono::steady_clock;
using tandem::run::kExitUsage;
using tandem::run::Options;
using tandem::run::parse;
using tandem::run::usage;

constexpr int kStartFailuresToLeaveOut = 2;  // failures at start in a row that leave a worker out
// Seconds the other workers get to notice a failed worker and exit by themselves (they raise,
// naming it, within milliseconds) before SIGTERM.
constexpr double kSelfStopSeconds = 2.0;

// ---- signals: a self-pipe the main loop polls ------------------------------------------------

int g_signal_pipe[2] = {-1, -1};

void on_signal(int signal) {
  const int saved = errno;
  const auto byte = static_cast<unsigned char>(signal);
  [[maybe_unused]] const ssize_t written = write(g_signal_pipe[1], &byte, 1);
  errno = saved;
}

void install_signals() {
  if (pipe2(g_signal_pipe, O_CLOEXEC | O_NONBLOCK) != 0) {
    std::perror("tandem-run: pipe");
    std::exit(1);
  }
  struct sigaction action {};
  action.sa_handler = on_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  for (const int s : {SIGCHLD, SIGTERM, SIGINT, SIGHUP}) sigaction(s, &action, nullptr);
}

/// Reads the signals that came in (without waiting); true when one asks tandem-run to stop.
bool stop_signal_pending() {
  bool stop = false;
  unsigned char signals[64];
  ssize_t n;
  while ((n = read(g_signal_pipe[0], signals, sizeof(signals))) > 0)
    for (ssize_t k = 0; k < n; ++k) stop = stop || signals[k] != SIGCHLD;
  return stop;
}

// ---- what the workers are told ---------------------------------------------------------------

/// `count` distinct free TCP ports on the loopback interface (held open until all are chosen).
std::vector<int> free_ports(int count) {
  std::vector<int> sockets, ports;
  for (int i = 0; i < count; ++i) {
    const int s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    address.sin_port = 0;
    socklen_t length = sizeof(address);
    if (s < 0 || bind(s, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0 ||
        getsockname(s, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
      std::perror("tandem-run: finding a free loopback port");
      std::exit(1);
    }
    sockets.push_back(s);
    ports.push_back(ntohs(address.sin_port));
  }
  for (const int s : sockets) close(s);
  return ports;
}

std::string random_token() {
  unsigned char bytes[16];
  if (getrandom(bytes, sizeof(bytes), 0) != static_cast<ssize_t>(sizeof(bytes))) {
    std::perror("tandem-run: getrandom");
    std::exit(1);
  }
  std::string out;
  char hex[3];
  for (const unsigned char b : bytes) {
    std::snprintf(hex, sizeof(hex), "%02x", b);
    out += hex;
  }
  return out;
}

std::string tf_config(const std::vector<int>& ports, size_t index) {
  std::string cluster;
  for (size_t i = 0; i < ports.size(); ++i)
    cluster += (i ? ", " : "") + std::string("\"127.0.0.1:") + std::to_string(ports[i]) + "\"";
  return "{\"cluster\": {\"worker\": [" + cluster + "]}, \"task\": {\"type\": \"worker\", " +
         "\"index\": " + std::to_string(index) + "}}";
}

std::string describe_status(int status) {
  if (WIFEXITED(status)) {
    const int code = WEXITSTATUS(status);
    return code == tandem::kPreemptedExitStatus
               ? "exit status " + std::to_string(code) + ", preempted"
               : "exit status " + std::to_string(code);
  }
  if (WIFSIGNALED(status)) {
    const int s = WTERMSIG(status);
    const char* name = sigabbrev_np(s);
    return "killed by signal " + std::to_string(s) +
           (name ? std::string(" (SIG") + name + ")" : "");
  }
  return "status " + std::to_string(status);
}

/// The status tandem-run exits with for a worker's wait status.
int exit_code_of(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

// ---- one attempt: the workers started together -------------------------------------------------

struct Stream {
  int fd = -1;
  FILE* sink = nullptr;
  std::string pending;  // a line not yet ended
};

struct Worker {
  int slot = 0;  // which of the --workers N it is (kept across restarts)
  pid_t pid = -1;
  Stream out, err;
  bool running = false;
  int status = 0;
};

void emit(const Worker& w, Stream& s, const char* data, size_t size) {
  s.pending.append(data, size);
  size_t start = 0;
  for (size_t nl; (nl = s.pending.find('\n', start)) != std::string::npos; start = nl + 1)
    std::fprintf(s.sink, "[worker %d] %.*s\n", w.slot, static_cast<int>(nl - start),
                 s.pending.data() + start);
  s.pending.erase(0, start);
  std::fflush(s.sink);
}

void drain(Worker& w, Stream& s) {
  char buffer[65536];
  // At most a few reads per wakeup: a worker that writes without pause must not keep the loop
  // from signals, reaping and the kill timer.
  for (int reads = 0; reads < 16; ++reads) {
    const ssize_t n = read(s.fd, buffer, sizeof(buffer));
    if (n > 0) {
      emit(w, s, buffer, static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && (errno == EINTR)) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    // End of the stream (or an error): the last partial line, then close.
    if (!s.pending.empty()) {
      std::fprintf(s.sink, "[worker %d] %s\n", w.slot, s.pending.c_str());
      std::fflush(s.sink);
      s.pending.clear();
    }
    close(s.fd);
    s.fd = -1;
    return;
  }
}

pid_t start_worker(const Options& o, Worker& w, const std::string& config, int attempt,
                   const std::string& token) {
  int out[2], err[2];
  if (pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0) {
    std::perror("tandem-run: pipe");
    std::exit(1);
  }
  const pid_t parent = getpid();
  // Signals stay blocked across the fork until the child has its default handlers back: one
  // meant for the worker must not run tandem-run's handler in the child (which would write to
  // tandem-run's self-pipe, as if tandem-run had been signalled).
  sigset_t all, previous;
  sigfillset(&all);
  sigprocmask(SIG_BLOCK, &all, &previous);
  const pid_t pid = fork();
  if (pid < 0) {
    std::perror("tandem-run: fork");
    std::exit(1);
  }
  if (pid == 0) {
    // The worker: its own process group (stopping it reaches what it started), stopped when
    // tandem-run dies, its output into the pipes, then the program.
    setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent) _exit(1);
    dup2(out[1], STDOUT_FILENO);
    dup2(err[1], STDERR_FILENO);
    // Not the terminal: a worker in a background process group reading it would stop.
    const int null_fd = open("/dev/null", O_RDONLY);
    if (null_fd >= 0) dup2(null_fd, STDIN_FILENO);
    struct sigaction action {};
    action.sa_handler = SIG_DFL;
    for (const int s : {SIGCHLD, SIGTERM, SIGINT, SIGHUP}) sigaction(s, &action, nullptr);
    close(g_signal_pipe[0]);
    close(g_signal_pipe[1]);
    sigprocmask(SIG_SETMASK, &previous, nullptr);
    setenv("TF_CONFIG", config.c_str(), 1);
    setenv("TANDEM_JOB_TOKEN", token.c_str(), 1);
    setenv("TANDEM_RUN_WORKER", std::to_string(w.slot).c_str(), 1);
    setenv("TANDEM_RUN_ATTEMPT", std::to_string(attempt).c_str(), 1);
    std::vector<char*> args;
    for (const std::string& a : o.command) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execvp(args[0], args.data());
    std::fprintf(stderr, "tandem-run: cannot run %s: %s\n", args[0], std::strerror(errno));
    _exit(127);
  }
  sigprocmask(SIG_SETMASK, &previous, nullptr);
  setpgid(pid, pid);  // also here, so that a signal sent right away reaches the group
  close(out[1]);
  close(err[1]);
  fcntl(out[0], F_SETFL, O_NONBLOCK);
  fcntl(err[0], F_SETFL, O_NONBLOCK);
  w.out = {out[0], stdout, {}};
  w.err = {err[0], stderr, {}};
  w.pid = pid;
  w.running = true;
  return pid;
}

struct Outcome {
  enum Kind { kFinished, kPreempted, kFailed, kStopped } kind = kFinished;
  int slot = -1;          // kFailed: the first worker that failed
  int status = 0;         // its wait status
  double seconds = 0;     // how long after the start it failed
  bool all_saved = true;  // kStopped: every worker exited preempted (or finished)
};

/// Runs one attempt until every worker has exited.
Outcome supervise(const Options& o, std::vector<Worker>& workers, Clock::time_point started,
                  bool& stop_requested) {
  Outcome outcome;
  bool stopping = false;      // the workers are being stopped
  bool term_pending = false;  // SIGTERM at term_at for workers still running
  bool kill_pending = false;  // SIGKILL at kill_at for workers still running
  Clock::time_point term_at = Clock::now(), kill_at = Clock::now();
  const auto after = [](double seconds) {
    return Clock::now() +
           std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
  };
  auto signal_all = [&](int signal) {
    for (const Worker& w : workers)
      if (w.running) kill(-w.pid, signal);
  };
  auto terminate_now = [&] {
    term_pending = false;
    signal_all(SIGTERM);
    kill_pending = true;
    kill_at = after(o.grace_seconds);
  };
  // `at_once`: SIGTERM now (tandem-run was asked to stop). Otherwise (a worker failed) the
  // others first get kSelfStopSeconds to notice the loss and exit by themselves, saying which
  // worker they lost: a SIGTERM could end them before they print it.
  auto begin_stop = [&](bool at_once) {
    if (stopping) {
      if (at_once && term_pending) terminate_now();
      return;
    }
    stopping = true;
    if (at_once) {
      terminate_now();
    } else {
      term_pending = true;
      term_at = after(std::min(kSelfStopSeconds, o.grace_seconds));
    }
  };
  for (;;) {
    bool any_open = false;
    for (const Worker& w : workers)
      any_open = any_open || w.running || w.out.fd >= 0 || w.err.fd >= 0;
    if (!any_open) break;
    std::vector<pollfd> fds{{g_signal_pipe[0], POLLIN, 0}};
    std::vector<std::pair<Worker*, Stream*>> streams;
    for (Worker& w : workers)
      for (Stream* s : {&w.out, &w.err})
        if (s->fd >= 0) {
          fds.push_back({s->fd, POLLIN, 0});
          streams.emplace_back(&w, s);
        }
    int timeout_ms = 1000;
    for (const auto& [pending, at] : {std::pair{term_pending, term_at}, {kill_pending, kill_at}}) {
      if (!pending) continue;
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(at - Clock::now());
      timeout_ms =
          std::min(timeout_ms, static_cast<int>(std::clamp<int64_t>(left.count(), 0, 1000)));
    }
    const int ready = poll(fds.data(), fds.size(), timeout_ms);
    if (ready < 0 && errno != EINTR) {
      std::perror("tandem-run: poll");
      std::exit(1);
    }
    for (size_t i = 1; ready > 0 && i < fds.size(); ++i)
      if (fds[i].revents) drain(*streams[i - 1].first, *streams[i - 1].second);
    if (ready > 0 && fds[0].revents) {
      unsigned char signals[64];
      ssize_t n;
      while ((n = read(g_signal_pipe[0], signals, sizeof(signals))) > 0) {
        for (ssize_t k = 0; k < n; ++k) {
          if (signals[k] == SIGCHLD) continue;
          if (stop_requested) {
            signal_all(SIGKILL);  // asked twice
          } else {
            stop_requested = true;
            const char* name = sigabbrev_np(signals[k]);
            std::fprintf(stderr, "tandem-run: SIG%s: asking every worker to save and stop\n",
                         name ? name : "NAL");
            begin_stop(/*at_once=*/true);
          }
        }
      }
    }
    // Reap.
    for (;;) {
      int status = 0;
      const pid_t pid = waitpid(-1, &status, WNOHANG);
      if (pid <= 0) break;
      for (Worker& w : workers) {
        if (w.pid != pid || !w.running) continue;
        w.running = false;
        w.status = status;
        // What the worker started and left behind (its process group) ends with it: nothing
        // may hold its output open, or keep running into the next attempt.
        kill(-w.pid, SIGKILL);
        const bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
        const bool preempted =
            WIFEXITED(status) && WEXITSTATUS(status) == tandem::kPreemptedExitStatus;
        if (!ok && !preempted && outcome.kind != Outcome::kFailed && !stopping) {
          outcome.kind = Outcome::kFailed;
          outcome.slot = w.slot;
          outcome.status = status;
          outcome.seconds = std::chrono::duration<double>(Clock::now() - started).count();
          std::fprintf(stderr,
                       "tandem-run: worker %d (pid %d) failed after %.1f s (%s); stopping "
                       "the other workers\n",
                       w.slot, static_cast<int>(pid), outcome.seconds,
                       describe_status(status).c_str());
          begin_stop(/*at_once=*/false);
        }
        if (!ok) outcome.all_saved = outcome.all_saved && preempted;
        if (!ok && stopping && outcome.slot != w.slot)
          std::fprintf(stderr, "tandem-run: worker %d (pid %d) ended: %s\n", w.slot,
                       static_cast<int>(pid), describe_status(status).c_str());
        if (preempted && outcome.kind == Outcome::kFinished) outcome.kind = Outcome::kPreempted;
      }
    }
    if (term_pending && Clock::now() >= term_at) terminate_now();
    if (kill_pending && Clock::now() >= kill_at) {
      for (const Worker& w : workers)
        if (w.running)
          std::fprintf(stderr,
                       "tandem-run: worker %d did not stop within %.0f s of SIGTERM; "
                       "killing it\n",
                       w.slot, o.grace_seconds);
      signal_all(SIGKILL);
      kill_pending = false;
    }
  }
  if (stop_requested) outcome.kind = Outcome::kStopped;
  return outcome;
}

}  // namespace

int main(int argc, char** argv) {
  const std::optional<Options> parsed = parse(argc, argv);
  if (!parsed) return usage(stderr, kExitUsage);
  const Options& o = *parsed;
  install_signals();

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
    const std::vector<int> ports = free_ports(static_cast<int>(slots.size()));
    const std::string token = random_token();
    std::vector<Worker> workers(slots.size());
    const Clock::time_point started = Clock::now();
    std::string pids;
    for (size_t i = 0; i < slots.size(); ++i) {
      workers[i].slot = slots[i];
      start_worker(o, workers[i], tf_config(ports, i), attempt, token);
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
