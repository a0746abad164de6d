// tandem-run's workers on this machine (tandem_run_workers.h).
#include "tandem_run_workers.h"

#include <arpa/inet.h>
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
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "tandem/core/exit_status.h"

namespace tandem::run {

namespace {

// ---- signals: a self-pipe the main loop polls ------------------------------------------------

int g_signal_pipe[2] = {-1, -1};

void on_signal(int signal) {
  const int saved = errno;
  const auto byte = static_cast<unsigned char>(signal);
  [[maybe_unused]] const ssize_t written = write(g_signal_pipe[1], &byte, 1);
  errno = saved;
}

}  // namespace

int signal_fd() { return g_signal_pipe[0]; }

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

std::vector<int> free_ports(const std::string& host, int count) {
  std::vector<int> sockets, ports;
  for (int i = 0; i < count; ++i) {
    const int s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_port = 0;
    socklen_t length = sizeof(address);
    if (inet_pton(AF_INET, host.c_str(), &address.sin_addr) != 1) {
      std::fprintf(stderr, "tandem-run: \"%s\" is not an IPv4 address\n", host.c_str());
      std::exit(1);
    }
    if (s < 0 || bind(s, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0 ||
        getsockname(s, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
      std::fprintf(stderr, "tandem-run: finding a free port on %s: %s\n", host.c_str(),
                   std::strerror(errno));
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

std::string tf_config(const std::vector<std::string>& addresses, size_t index) {
  std::string cluster;
  for (size_t i = 0; i < addresses.size(); ++i)
    cluster += (i ? ", \"" : "\"") + addresses[i] + "\"";
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

Clock::time_point after(double seconds) {
  return Clock::now() +
         std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}

namespace {

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

}  // namespace

void start_worker(const Options& o, Worker& w, const std::string& config, int attempt,
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
    const int null_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
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
}

/// Runs one attempt until every worker has exited.
Outcome supervise(const Options& o, std::vector<Worker>& workers, Clock::time_point started,
                  bool& stop_requested, Link* link, const std::string& address) {
  Outcome outcome;
  bool stopping = false;       // the workers are being stopped
  bool term_pending = false;   // SIGTERM at term_at for workers still running
  bool kill_pending = false;   // SIGKILL at kill_at for workers still running
  int interrupts = 0;          // SIGINTs to tandem-run (two kill the workers at once)
  bool told_absorbed = false;  // a repeated stop signal was reported (once)
  Clock::time_point term_at = Clock::now(), kill_at = Clock::now();
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
    if (link) fds.push_back({link->fd(), POLLIN, 0});
    const size_t first_stream = fds.size();
    std::vector<std::pair<Worker*, Stream*>> streams;
    for (Worker& w : workers)
      for (Stream* s : {&w.out, &w.err})
        if (s->fd >= 0) {
          fds.push_back({s->fd, POLLIN, 0});
          streams.emplace_back(&w, s);
        }
    int timeout_ms = link && link->ready() ? 0 : 1000;
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
    for (size_t i = first_stream; ready > 0 && i < fds.size(); ++i)
      if (fds[i].revents)
        drain(*streams[i - first_stream].first, *streams[i - first_stream].second);
    if (link && ((ready > 0 && fds[1].revents) || link->ready())) {
      const std::string reason = link->on_readable();
      if (!reason.empty() && outcome.kind != Outcome::kFailed && !stopping) {
        // Another machine's worker failed (or the rendezvous is gone): these workers lose a
        // peer and raise by themselves; stop them as after a failure here.
        outcome.kind = Outcome::kFailed;
        outcome.stopped_by = reason;
        outcome.seconds = std::chrono::duration<double>(Clock::now() - started).count();
        std::fprintf(stderr, "tandem-run: %s; stopping the workers here\n", reason.c_str());
        begin_stop(/*at_once=*/false);
      }
    }
    if (ready > 0 && fds[0].revents) {
      unsigned char signals[64];
      ssize_t n;
      while ((n = read(g_signal_pipe[0], signals, sizeof(signals))) > 0) {
        for (ssize_t k = 0; k < n; ++k) {
          const int signal = signals[k];
          if (signal == SIGCHLD) continue;
          const char* name = sigabbrev_np(signal);
          if (signal == SIGINT) ++interrupts;
          if (!stop_requested) {
            stop_requested = true;
            std::fprintf(stderr, "tandem-run: SIG%s: asking every worker to save and stop\n",
                         name ? name : "NAL");
            begin_stop(/*at_once=*/true);
          } else if (signal == SIGINT && interrupts >= 2) {
            // Ctrl-C twice: somebody who will not wait for the save.
            if (interrupts == 2)
              std::fprintf(stderr, "tandem-run: SIGINT again: killing the workers now\n");
            signal_all(SIGKILL);
            kill_pending = false;
          } else if (!told_absorbed) {
            // A storm (a scheduler signals every process of the job, often more than once):
            // the workers are saving; one SIGTERM each was enough, and --grace bounds the wait.
            told_absorbed = true;
            std::fprintf(stderr,
                         "tandem-run: SIG%s again: the workers are already saving and stopping; "
                         "more are ignored; SIGKILL comes %.0f s after their SIGTERM (--grace), or "
                         "at a second Ctrl-C\n",
                         name ? name : "NAL", o.grace_seconds);
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
          if (link)
            link->worker_failed("worker " + std::to_string(w.slot) + " on " + address + " (" +
                                    describe_status(status) + ")",
                                exit_code_of(status));
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

}  // namespace tandem::run
