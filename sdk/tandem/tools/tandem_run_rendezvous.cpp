// tandem-run's rendezvous for a job on several machines (tandem_run_nodes.h): one process,
// started by node 0's tandem-run, that rounds the machines up, numbers their workers, and
// decides after each round whether the job finished, restarts or gives up.
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "tandem_run_net.h"
#include "tandem_run_nodes.h"
#include "tandem_run_workers.h"

namespace tandem::run {

namespace {

struct Machine {
  Lines link;
  std::string address;  // as the rendezvous sees it (until JOIN says)
  int rank = -1;
  int workers = 0;
  std::vector<std::string> ports;
  bool joined = false;    // waits for the next round
  bool in_round = false;  // has workers in the round running now
  std::string ended;      // "" until ENDED (or "lost")
};

std::string plural(size_t n, const char* word) {
  return std::to_string(n) + " " + word + (n == 1 ? "" : "s");
}

class Rendezvous {
 public:
  Rendezvous(int listener, const Options& o) : listener_(listener), o_(o) {}

  void serve() {
    round_opened_ = Clock::now();
    for (;;) {
      std::vector<pollfd> fds{{listener_, POLLIN, 0}};
      for (const Machine& m : machines_) fds.push_back({m.link.fd(), POLLIN, 0});
      poll(fds.data(), fds.size(), 200);
      if (fds[0].revents) accept_machines();
      for (size_t i = 1; i < fds.size(); ++i)
        if (fds[i].revents) read(machines_[i - 1]);
      std::erase_if(machines_, [](const Machine& m) { return !m.link.open(); });
      if (running_) {
        if (round_over()) decide();
      } else {
        maybe_start();
      }
      if (done_) return;
    }
  }

 private:
  void accept_machines() {
    for (;;) {
      const int fd = accept4(listener_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (fd < 0) return;
      keep_alive(fd);
      Machine m;
      m.link = Lines(fd);
      m.address = peer_address(fd);
      machines_.push_back(std::move(m));
    }
  }

  std::string name(const Machine& m) const {
    return "machine " + std::to_string(m.rank) + " (" + m.address + ")";
  }

  void read(Machine& m) {
    const bool open = m.link.fill();
    while (const std::optional<std::string> line = m.link.next()) handle(m, *line);
    if (!open && m.link.open()) gone(m);
  }

  void handle(Machine& m, const std::string& line) {
    const std::vector<std::string> words = split(line, ' ');
    const std::string& what = words[0];
    if (what == "JOIN" && words.size() == 5) {
      const int rank = std::atoi(words[1].c_str());
      for (const Machine& other : machines_) {
        if (&other == &m || other.rank != rank || !other.link.open() ||
            !(other.joined || other.in_round))
          continue;
        m.link.send("REFUSE --node-rank " + std::to_string(rank) + " is already in the job (" +
                    name(other) + ")");
        m.link.close();
        return;
      }
      m.rank = rank;
      m.workers = std::atoi(words[2].c_str());
      m.address = words[3];
      m.ports = split(words[4], ',');
      m.joined = true;
    } else if (what == "FAILED" && words.size() >= 3 && m.in_round) {
      const size_t text = line.find(' ', line.find(' ') + 1) + 1;
      fail(m, line.substr(text), std::atoi(words[1].c_str()));
    } else if (what == "ENDED" && words.size() == 2 && m.in_round) {
      m.ended = words[1];
      ended_.push_back(m.ended);
    }
  }

  /// A machine's connection closed.
  void gone(Machine& m) {
    m.link.close();
    if (m.in_round && m.ended.empty() && running_) {
      // A lost machine explains the failures its loss caused elsewhere: it is the reason.
      if (!failure_.empty() && !failure_is_loss_) failure_ = name(m) + " lost";
      fail(m, name(m) + " lost", 1);
      failure_is_loss_ = true;
      m.ended = "lost";
      ended_.push_back(m.ended);
    }
  }

  /// The round's first failure stops every other machine's workers.
  void fail(const Machine& from, const std::string& what, int status) {
    if (!failure_.empty()) return;
    failure_ = what;
    failure_status_ = status == 0 ? 1 : status;
    for (Machine& m : machines_)
      if (&m != &from && m.in_round && m.ended.empty()) m.link.send("STOP " + what);
  }

  size_t joined() const {
    return static_cast<size_t>(std::count_if(machines_.begin(), machines_.end(),
                                             [](const Machine& m) { return m.joined; }));
  }

  void maybe_start() {
    const size_t count = joined();
    // The last call for more machines runs from the moment A have joined.
    if (count < static_cast<size_t>(o_.min_nodes)) {
      quorum_at_.reset();
    } else if (!quorum_at_) {
      quorum_at_ = Clock::now();
    }
    const bool enough =
        count >= static_cast<size_t>(o_.max_nodes) ||
        (quorum_at_ &&
         Clock::now() >= *quorum_at_ + std::chrono::duration_cast<Clock::duration>(
                                           std::chrono::duration<double>(kLastCallSeconds)));
    if (!enough) {
      const double waited = std::chrono::duration<double>(Clock::now() - round_opened_).count();
      if (waited > o_.join_timeout_seconds) {
        finish(1, "failed: " + plural(count, "machine") + " of at least " +
                      std::to_string(o_.min_nodes) + " joined within " +
                      std::to_string(static_cast<int>(o_.join_timeout_seconds)) +
                      " s (--join-timeout)");
      }
      return;
    }
    std::vector<Machine*> round;
    for (Machine& m : machines_)
      if (m.joined) round.push_back(&m);
    std::sort(round.begin(), round.end(),
              [](const Machine* a, const Machine* b) { return a->rank < b->rank; });
    if (round.size() > static_cast<size_t>(o_.max_nodes)) round.resize(o_.max_nodes);
    // A machine that reached the rendezvous through the loopback interface (HOST a name that
    // /etc/hosts maps to 127.0.1.1, say) would give the others an address they cannot reach.
    for (const Machine* m : round) {
      if (!m->address.starts_with("127.") || round.size() == 1) continue;
      for (const Machine* other : round) {
        if (other->address.starts_with("127.")) continue;
        finish(1, "failed: " + name(*m) + " reaches the rendezvous at " + o_.rendezvous +
                      " through the loopback interface, so " + name(*other) +
                      " could not reach its workers; give --rdzv an address of machine 0 that "
                      "every machine uses (not a name /etc/hosts maps to 127.0.1.1)");
        return;
      }
    }
    std::string cluster;
    for (const Machine* m : round)
      for (const std::string& port : m->ports)
        cluster += (cluster.empty() ? "" : ",") + m->address + ":" + port;
    const std::string token = random_token();
    int first = 0;
    workers_ = 0;
    last_round_.clear();
    for (Machine* m : round) {
      seen_.push_back(m->rank);
      last_round_.push_back(m->rank);
      m->link.send("START " + std::to_string(attempt_) + " " + token + " " + std::to_string(first) +
                   " " + cluster);
      first += m->workers;
      m->joined = false;
      m->in_round = true;
      m->ended.clear();
    }
    workers_ = first;
    machines_in_round_ = round.size();
    running_ = true;
    ended_.clear();
    failure_.clear();
    failure_is_loss_ = false;
  }

  bool round_over() const {
    for (const Machine& m : machines_)
      if (m.in_round && m.ended.empty()) return false;
    return true;
  }

  void decide() {
    running_ = false;
    // From what the machines reported (a machine that reported and then left is gone from
    // machines_ by now, its report is not).
    bool preempted = false, stopped = false, failed = false;
    for (const std::string& kind : ended_) {
      preempted = preempted || kind == "preempted";
      stopped = stopped || kind == "stopped";
      failed = failed || kind == "failed";
    }
    ended_.clear();
    for (Machine& m : machines_) m.in_round = false;
    if (failed && failure_.empty()) {
      failure_ = "a worker failed";
      failure_status_ = 1;
    }
    ++attempt_;
    if (failure_.empty() && !preempted && !stopped) {
      finish(0, "finished: the job ended on " + plural(workers_, "worker") + " on " +
                    plural(machines_in_round_, "machine"));
      return;
    }
    if (failure_.empty()) {
      ++preemptions_;
      std::fprintf(stderr,
                   "tandem-run: rendezvous: the workers saved and stopped (preempted); the next "
                   "round starts when the machines are back (not counted as a failure)\n");
    } else {
      last_failure_ = failure_;
      if (restarts_ >= o_.max_restarts) {
        finish(failure_status_, "failed: " + failure_ + " and no restarts are left " +
                                    "(--max-restarts " + std::to_string(o_.max_restarts) + ")");
        return;
      }
      ++restarts_;
      std::fprintf(stderr,
                   "tandem-run: rendezvous: %s; restart %d of %d when the machines are back\n",
                   failure_.c_str(), restarts_, o_.max_restarts);
    }
    round_opened_ = Clock::now();
    quorum_at_.reset();
  }

  void finish(int status, const std::string& how) {
    // Machines lost: in an earlier round, not in the last.
    std::vector<int> lost_ranks;
    for (const int r : seen_)
      if (std::find(last_round_.begin(), last_round_.end(), r) == last_round_.end() &&
          std::find(lost_ranks.begin(), lost_ranks.end(), r) == lost_ranks.end())
        lost_ranks.push_back(r);
    std::sort(lost_ranks.begin(), lost_ranks.end());
    std::string lost;
    for (const int r : lost_ranks) lost += (lost.empty() ? "" : ", ") + std::to_string(r);
    const std::string line =
        how + "; " + std::to_string(restarts_) + " of " + std::to_string(o_.max_restarts) +
        " restarts used (last failure: " + last_failure_ + "), " +
        plural(preemptions_, "preemption") + ", " + plural(lost_ranks.size(), "machine") + " lost" +
        (lost.empty() ? "" : " (" + lost + ")");
    // Node 0 last: its tandem-run ends this process when it exits.
    std::stable_sort(machines_.begin(), machines_.end(),
                     [](const Machine& a, const Machine& b) { return a.rank > b.rank; });
    for (Machine& m : machines_) m.link.send("EXIT " + std::to_string(status) + " " + line);
    done_ = true;
  }

  int listener_;
  const Options& o_;
  std::vector<Machine> machines_;
  bool running_ = false, done_ = false;
  Clock::time_point round_opened_;
  std::optional<Clock::time_point> quorum_at_;
  std::string failure_, last_failure_ = "none";
  int failure_status_ = 1;
  bool failure_is_loss_ = false;
  int attempt_ = 0, restarts_ = 0, preemptions_ = 0;
  size_t workers_ = 0, machines_in_round_ = 0;
  std::vector<int> seen_, last_round_;  // node ranks in any round, in the last one
  std::vector<std::string> ended_;      // the round's ENDED kinds (and "lost"), as they came
};

}  // namespace

void serve_rendezvous(int listener, const Options& o) { Rendezvous(listener, o).serve(); }

}  // namespace tandem::run
