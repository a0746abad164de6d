// tandem-run on one machine of several (tandem_run_nodes.h): joins the rendezvous each round,
// starts this machine's workers as it says, and reports how they ended.
#include "tandem_run_nodes.h"

#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "tandem/core/exit_status.h"
#include "tandem_run_net.h"
#include "tandem_run_workers.h"

namespace tandem::run {

namespace {

pid_t g_rendezvous = 0;  // node 0: the rendezvous process

/// Node 0, after the job's end: the rendezvous exits once it has told every machine (it ends
/// with this process, and a machine it had not told yet would wait for it in vain).
void wait_for_rendezvous() {
  if (g_rendezvous <= 0) return;
  const Clock::time_point give_up = after(10.0);
  while (Clock::now() < give_up) {
    int status = 0;
    const pid_t done = waitpid(g_rendezvous, &status, WNOHANG);
    if (done == g_rendezvous || (done < 0 && errno == ECHILD)) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

/// Starts the rendezvous (node 0): the port is taken here, so that a second job on it fails now.
bool start_rendezvous(const Options& o) {
  std::string error;
  const int listener = listen_on_port(o.rendezvous_port, &error);
  if (listener < 0) {
    std::fprintf(stderr,
                 "tandem-run: cannot serve the rendezvous on port %d: %s (is another job "
                 "using --rdzv %s?)\n",
                 o.rendezvous_port, error.c_str(), o.rendezvous.c_str());
    return false;
  }
  sigset_t all, previous;
  sigfillset(&all);
  sigprocmask(SIG_BLOCK, &all, &previous);
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid == 0) {
    // Ends with this tandem-run; signals are for tandem-run (a Ctrl-C reaches both).
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(1);
    struct sigaction action {};
    action.sa_handler = SIG_IGN;
    for (const int s : {SIGTERM, SIGINT, SIGHUP, SIGPIPE}) sigaction(s, &action, nullptr);
    action.sa_handler = SIG_DFL;
    sigaction(SIGCHLD, &action, nullptr);
    close(signal_fd());
    sigprocmask(SIG_SETMASK, &previous, nullptr);
    serve_rendezvous(listener, o);
    _exit(0);
  }
  sigprocmask(SIG_SETMASK, &previous, nullptr);
  close(listener);
  if (pid < 0) {
    std::perror("tandem-run: fork");
    return false;
  }
  g_rendezvous = pid;
  return true;
}

/// Connects to the rendezvous, trying again until --join-timeout; an invalid Lines when it
/// never answers or tandem-run is asked to stop.
Lines reach_rendezvous(const Options& o, bool* stop) {
  const Clock::time_point give_up = after(o.join_timeout_seconds);
  bool said = false;
  std::string error;
  while (Clock::now() < give_up) {
    const int fd = connect_to(o.rendezvous_host, o.rendezvous_port, 2.0, &error);
    if (fd >= 0) return Lines(fd);
    if (!said) {
      std::fprintf(stderr, "tandem-run: waiting for the rendezvous at %s (%s)\n",
                   o.rendezvous.c_str(), error.c_str());
      said = true;
    }
    if (stop_signal_pending()) {
      *stop = true;
      return Lines();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
  }
  std::fprintf(stderr, "tandem-run: no rendezvous at %s within %.0f s (--join-timeout): %s\n",
               o.rendezvous.c_str(), o.join_timeout_seconds, error.c_str());
  return Lines();
}

/// The rendezvous's next line, waiting; nullopt when it is gone or tandem-run is asked to stop
/// (`stop` says which).
std::optional<std::string> next_line(Lines& link, bool* stop) {
  for (;;) {
    if (std::optional<std::string> line = link.next()) return line;
    if (!link.open()) return std::nullopt;
    pollfd fds[2] = {{link.fd(), POLLIN, 0}, {signal_fd(), POLLIN, 0}};
    if (poll(fds, 2, 1000) < 0 && errno != EINTR) return std::nullopt;
    if (fds[1].revents && stop_signal_pending()) {
      *stop = true;
      return std::nullopt;
    }
    if (fds[0].revents && !link.fill()) {
      std::optional<std::string> last = link.next();  // what came before the close
      link.close();
      if (last) return last;
      return std::nullopt;
    }
  }
}

/// The rendezvous during a round.
class RendezvousLink final : public Link {
 public:
  explicit RendezvousLink(Lines& lines) : lines_(lines) {}
  int fd() const override { return lines_.fd(); }
  bool ready() const override { return !reported_ && (lines_.buffered() || !lines_.open()); }
  std::string on_readable() override {
    const bool open = lines_.open() && lines_.fill();
    std::string reason;
    while (const std::optional<std::string> line = lines_.next())
      if (line->starts_with("STOP ") && reason.empty()) reason = line->substr(5);
    if (!open) {
      lines_.close();
      if (reason.empty()) reason = "the rendezvous is gone (machine 0 stopped)";
    }
    reported_ = reported_ || !lines_.open();
    return reason;
  }
  void worker_failed(const std::string& what, int status) override {
    lines_.send("FAILED " + std::to_string(status) + " " + what);
  }

 private:
  Lines& lines_;
  bool reported_ = false;  // the close was reported
};

const char* ended_word(const Outcome& outcome) {
  switch (outcome.kind) {
    case Outcome::kFinished:
      return "finished";
    case Outcome::kPreempted:
      return "preempted";
    case Outcome::kFailed:
      return "failed";
    case Outcome::kStopped:
      return "stopped";
  }
  return "failed";
}

}  // namespace

int run_nodes(const Options& o) {
  if (o.node_rank == 0 && !start_rendezvous(o)) return 1;
  bool stop = false;
  bool previous_saved = true;
  auto stopped = [&](const char* when) {
    std::printf("tandem-run: stopped: asked to stop%s%s\n", when,
                previous_saved ? "; every worker here had saved and stopped" : "");
    std::fflush(stdout);
    return previous_saved ? tandem::kPreemptedExitStatus : 1;
  };
  Lines link;
  for (;;) {
    if (!link.open()) {
      link = reach_rendezvous(o, &stop);
      if (stop) return stopped(" while waiting for the rendezvous");
      if (!link.open()) return 1;
    }
    if (stop_signal_pending()) return stopped(" before the next round");
    const std::string address = local_address(link.fd());
    std::string ports;
    for (const int port : free_ports(address, o.workers))
      ports += (ports.empty() ? "" : ",") + std::to_string(port);
    link.send("JOIN " + std::to_string(o.node_rank) + " " + std::to_string(o.workers) + " " +
              address + " " + ports);
    // START, or the job's end.
    std::optional<std::string> line;
    while ((line = next_line(link, &stop)) && line->starts_with("STOP ")) {
    }
    if (stop) return stopped(" while waiting for the other machines");
    if (!line) continue;  // the rendezvous went away: reach it again
    const std::vector<std::string> words = split(*line, ' ');
    if (words[0] == "EXIT" && words.size() >= 2) {
      wait_for_rendezvous();
      std::printf("tandem-run: %s\n", line->substr(line->find(' ', 5) + 1).c_str());
      std::fflush(stdout);
      return std::atoi(words[1].c_str());
    }
    if (words[0] == "REFUSE") {
      std::fprintf(stderr, "tandem-run: the rendezvous refused this machine: %s\n",
                   line->substr(7).c_str());
      return 1;
    }
    if (words[0] != "START" || words.size() != 5) {
      std::fprintf(stderr, "tandem-run: unexpected message from the rendezvous: \"%s\"\n",
                   line->c_str());
      return 1;
    }
    const int attempt = std::atoi(words[1].c_str());
    const std::string& token = words[2];
    const int first = std::atoi(words[3].c_str());
    const std::vector<std::string> cluster = split(words[4], ',');
    std::vector<Worker> workers(static_cast<size_t>(o.workers));
    const Clock::time_point started = Clock::now();
    std::string pids;
    for (size_t i = 0; i < workers.size(); ++i) {
      workers[i].slot = first + static_cast<int>(i);
      start_worker(o, workers[i], tf_config(cluster, static_cast<size_t>(workers[i].slot)), attempt,
                   token);
      pids += " worker " + std::to_string(workers[i].slot) + " pid " +
              std::to_string(workers[i].pid) + (i + 1 < workers.size() ? "," : "");
    }
    std::fprintf(stderr,
                 "tandem-run: attempt %d: machine %d (%s) started %zu of %zu workers (chief at "
                 "%s):%s\n",
                 attempt + 1, o.node_rank, address.c_str(), workers.size(), cluster.size(),
                 cluster[0].c_str(), pids.c_str());
    RendezvousLink watch(link);
    bool stop_requested = false;
    const Outcome outcome =
        supervise(o, workers, started, stop_requested, &watch,
                  "machine " + std::to_string(o.node_rank) + " (" + address + ")");
    link.send(std::string("ENDED ") + ended_word(outcome));
    if (stop_requested) {
      previous_saved = outcome.all_saved;
      return stopped("");
    }
    previous_saved = outcome.kind == Outcome::kPreempted;
  }
}

}  // namespace tandem::run
