// TcpStoreServer: one thread serves every connection of the chief's store through poll().
#include "tandem/collectives/internal/tcp_store_server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <map>
#include <random>
#include <thread>
#include <vector>

#include "tandem/collectives/internal/tcp_store_protocol.h"
#include "tandem/core/error.h"
#include "tandem/core/logging.h"

namespace tandem::collectives {

using namespace store_wire;

namespace {

using Clock = std::chrono::steady_clock;

/// Reply bytes a client may leave unread before its requests are no longer read.
constexpr size_t kMaxPendingReply = size_t{2} << 20;
/// Reads of one connection per poll round.
constexpr int kReadsPerRound = 16;
/// Seconds a refused connection is kept, its reply sent, for its client to close it.
constexpr int kLingerSeconds = 2;
/// Connections accepted from one listener per poll round: fewer than a host's pending places,
/// so that a connection is read at least once before newer ones from its host could displace it.
constexpr int kAcceptsPerRound = 32;
/// Connections the kernel queues for accept() on each listener (at most net.core.somaxconn).
constexpr int kListenBacklog = 512;
/// Bytes of not yet complete introductions held in all; beyond, the largest is closed.
constexpr size_t kMaxPendingBytes = size_t{64} << 20;

// Note [the store's door]
// ~~~~~~~~~~~~~~~~~~~~~~~
// Anyone who can reach the chief's port can open connections, and until one introduces itself
// (its hello: the token, the cluster, the worker's index) nothing tells a worker from a port
// scanner, a half-open connection or a client that sends a byte a minute. Refusing connections
// beyond a fixed count would let a dozen of those keep the job's workers out, so none is
// refused for lack of room; instead the connections not yet introduced ("pending") are bounded
// and the oldest make room:
// - at most max_pending_per_address from one address (an IPv6 /64 counts as one): a new one
//   closes that address's oldest pending connection, so a flood from one place displaces itself;
// - at most max_pending in all (a quarter of RLIMIT_NOFILE, the rest being the program's): a
//   new one closes the oldest pending connection of the address that has the most; and when
//   accept() finds no descriptor left, a pending connection's is taken the same way;
// - at most kMaxPendingBytes of unfinished introductions in all: the largest goes;
// - a pending connection is closed hello_timeout after it connected, however it trickles.
// A worker introduces itself as soon as it connects, and is read before kAcceptsPerRound more
// are accepted, so the oldest pending are the idle ones; a worker displaced all the same sees
// its connection close without an answer and connects again, backing off, until its timeout
// (tcp_store.cpp). Introduced workers, at most one per index, are never displaced.

std::string shorten(const std::string& text) {
  return text.size() <= 300 ? text : text.substr(0, 300) + "...";
}

bool equal_in_constant_time(const std::string& a, const std::string& b) {
  unsigned char difference = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i)
    difference |= static_cast<unsigned char>(a[i] ^ b[i]);
  return difference == 0;
}

struct Peer {
  std::string address;  // "host:port", for messages
  std::string place;    // what the pending limits count by: the host, or its IPv6 /64
};

Peer peer_of(int fd) {
  sockaddr_storage address{};
  socklen_t length = sizeof(address);
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0) return {"?", "?"};
  char host[NI_MAXHOST] = {}, port[NI_MAXSERV] = {};
  if (::getnameinfo(reinterpret_cast<sockaddr*>(&address), length, host, sizeof(host), port,
                    sizeof(port), NI_NUMERICHOST | NI_NUMERICSERV) != 0)
    return {"?", "?"};
  Peer peer{.address = std::string(host) + ":" + port, .place = host};
  if (address.ss_family == AF_INET6) {
    // One IPv6 host commonly holds a whole /64: it counts as one address.
    in6_addr prefix = reinterpret_cast<const sockaddr_in6*>(&address)->sin6_addr;
    if (!IN6_IS_ADDR_V4MAPPED(&prefix)) {
      std::memset(prefix.s6_addr + 8, 0, 8);
      char text[INET6_ADDRSTRLEN] = {};
      if (::inet_ntop(AF_INET6, &prefix, text, sizeof(text)))
        peer.place = text + std::string("/64");
    }
  }
  return peer;
}

/// Pending connections kept in all when the options leave it to the descriptor limit.
size_t pending_from_descriptor_limit() {
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) return 4096;
  return std::clamp<size_t>(static_cast<size_t>(limit.rlim_cur) / 4, 64, 4096);
}

}  // namespace

struct TcpStoreServer::State {
  struct Connection {
    int fd = -1;
    std::string peer;     // "host:port"
    std::string place;    // the address its pending limit counts by
    std::string in, out;  // bytes received and not yet parsed; reply bytes not yet sent
    bool introduced = false;
    int rank = -1;
    bool closing = false;  // refused: its reply goes out, then it is closed
    bool shut = false;     // closing, and its reply sent (its write side shut)
    Clock::time_point opened;
    Clock::time_point last_progress;
  };

  TcpStoreOptions options;
  uint64_t nonce = 0;
  std::vector<int> listeners;
  int wake[2] = {-1, -1};
  std::atomic<bool> stop{false};
  std::thread thread;
  std::vector<Connection> connections;  // in the order they were accepted
  // Connections not introduced yet (refused ones included): see Note [the store's door].
  size_t max_pending = 0, max_pending_per_place = 0;
  size_t pending = 0, pending_bytes = 0;
  std::map<std::string, size_t> pending_by_place;
  Clock::time_point accepts_paused_until{};  // no descriptor left, nothing to take one from
  bool said_out_of_descriptors = false;
  std::map<std::string, std::pair<std::string, int>> values;  // key -> value, who set it
  size_t stored_bytes = 0;
  std::vector<int> joined;                 // per rank: 0 never, 1 connected, 2 left
  std::vector<Clock::time_point> left_at;  // per rank, when joined == 2
  std::vector<std::string> joined_from;    // per rank: the connection's peer address
  int refusals_logged = 0;                 // refused joins the chief has logged

  explicit State(const TcpStoreOptions& o) : options(o) {
    std::random_device device;
    nonce = (static_cast<uint64_t>(device()) << 32) ^ device();
    if (nonce == 0) nonce = 1;
    joined.assign(static_cast<size_t>(options.world_size), 0);
    left_at.resize(static_cast<size_t>(options.world_size));
    joined_from.resize(static_cast<size_t>(options.world_size));
    max_pending = options.max_pending > 0 ? options.max_pending : pending_from_descriptor_limit();
    max_pending_per_place = std::max<size_t>(1, options.max_pending_per_address);
  }

  ~State() {
    stop = true;
    if (wake[1] >= 0) {
      const char byte = 1;
      [[maybe_unused]] const ssize_t n = ::write(wake[1], &byte, 1);
    }
    if (thread.joinable()) thread.join();
    for (Connection& c : connections) ::close(c.fd);
    for (int fd : listeners) ::close(fd);
    for (int fd : wake)
      if (fd >= 0) ::close(fd);
  }

  void listen_on(const std::string& where) {
    TANDEM_CHECK(::pipe2(wake, O_CLOEXEC) == 0,
                 "TF_CONFIG rendezvous: pipe: ", std::strerror(errno));
    listeners = open_store_listeners(options, where, kListenBacklog);
    thread = std::thread([this] { loop(); });
  }

  void reply(Connection& c, uint8_t status, const std::string& payload) {
    c.out += encode_reply(status, payload);
  }
  void refuse(Connection& c, const std::string& why, bool close_after) {
    reply(c, kRefused, why);
    c.closing = c.closing || close_after;
  }

  /// Refuses a process that asked to join the job, and says so on the chief at once: the
  /// process learns why from the reply, and the chief, which would otherwise only time out
  /// waiting for the worker it expected, names who came and why it was turned away. (Logged
  /// for the first few refusals only: a flood of them is not worth a line each.)
  void refuse_joining(Connection& c, int32_t rank, const std::string& why) {
    constexpr int kLoggedRefusals = 8;
    if (refusals_logged < kLoggedRefusals) {
      ++refusals_logged;
      TANDEM_LOG_WARNING(
          "TF_CONFIG rendezvous: the chief refused the process at ", c.peer,
          " that asked to join as worker ", rank, ": ", why,
          refusals_logged == kLoggedRefusals ? " (later refusals are not logged)" : "");
    }
    refuse(c, why, true);
  }

  void loop() {
    std::vector<pollfd> fds;
    while (!stop.load()) {
      fds.clear();
      fds.push_back({wake[0], POLLIN, 0});
      const short accepting = Clock::now() < accepts_paused_until ? 0 : POLLIN;
      for (int fd : listeners) fds.push_back({fd, accepting, 0});
      for (const Connection& c : connections) fds.push_back({c.fd, events_of(c), 0});
      const int ready = ::poll(fds.data(), fds.size(), 100);
      if (ready < 0 && errno != EINTR) break;
      if (stop.load()) break;
      const size_t first_connection = 1 + listeners.size();
      // Existing connections first (their indices match fds), then new ones.
      for (size_t i = 0; i < connections.size(); ++i) {
        const short revents = fds[first_connection + i].revents;
        if (revents != 0) serve(connections[i], revents);
      }
      for (size_t l = 0; l < listeners.size(); ++l)
        if (fds[1 + l].revents & POLLIN) accept_from(listeners[l]);
      expire_and_drop();
    }
  }

  /// Accepts up to kAcceptsPerRound connections, each making room for itself among the pending
  /// ones (Note [the store's door]).
  void accept_from(int listener) {
    for (int accepted = 0; accepted < kAcceptsPerRound; ++accepted) {
      const int fd = ::accept4(listener, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0 && (errno == EMFILE || errno == ENFILE)) {
        if (close_oldest_pending(busiest_place())) continue;
        // Nothing of the store's to give back: the program holds every descriptor. Wait.
        accepts_paused_until = Clock::now() + std::chrono::milliseconds(100);
        if (!said_out_of_descriptors) {
          said_out_of_descriptors = true;
          TANDEM_LOG_WARNING(
              "TF_CONFIG rendezvous: the chief has no file descriptor left "
              "(RLIMIT_NOFILE) to accept connections to its store with");
        }
        return;
      }
      if (fd < 0) return;
      Connection c;
      c.fd = fd;
      const Peer peer = peer_of(fd);
      c.peer = peer.address;
      c.place = peer.place;
      c.opened = c.last_progress = Clock::now();
      const int one = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      while (pending_by_place[c.place] >= max_pending_per_place)
        if (!close_oldest_pending(c.place)) break;
      while (pending >= max_pending)
        if (!close_oldest_pending(busiest_place())) break;
      ++pending;
      ++pending_by_place[c.place];
      connections.push_back(std::move(c));
    }
  }

  /// The address with the most pending connections ("" when there are none); among addresses
  /// that hold as many, the one whose pending connection is oldest (so that many addresses of
  /// equal counts do not make the same one give up its newest connection again and again).
  std::string busiest_place() const {
    size_t most = 0;
    for (const auto& [place, count] : pending_by_place) most = std::max(most, count);
    for (const Connection& c : connections) {
      if (c.fd < 0 || c.introduced) continue;
      const auto it = pending_by_place.find(c.place);
      if (it != pending_by_place.end() && it->second == most) return c.place;
    }
    return std::string();
  }

  /// Closes the oldest pending connection from `place`; false when it has none.
  bool close_oldest_pending(const std::string& place) {
    for (Connection& c : connections) {
      if (c.fd >= 0 && !c.introduced && c.place == place) {
        drop(c);
        return true;
      }
    }
    return false;
  }

  /// Closes the pending connections holding the most bytes of unfinished introductions until
  /// they hold at most kMaxPendingBytes in all.
  void close_largest_pending() {
    while (pending_bytes > kMaxPendingBytes) {
      Connection* largest = nullptr;
      for (Connection& c : connections)
        if (c.fd >= 0 && !c.introduced && (!largest || c.in.size() > largest->in.size()))
          largest = &c;
      if (largest == nullptr) return;
      drop(*largest);
    }
  }

  /// A connection has introduced itself: it leaves the pending ones.
  void admit(Connection& c) {
    c.introduced = true;
    forget_pending(c);
  }
  void forget_pending(const Connection& c) {
    --pending;
    pending_bytes -= c.in.size();
    auto it = pending_by_place.find(c.place);
    if (--it->second == 0) pending_by_place.erase(it);
  }

  /// What to wait for on a connection: its requests, unless it is being closed (refused) or
  /// has not read kMaxPendingReply bytes of replies yet (a client that sends and never reads
  /// must not make the chief hold its replies without end); its replies while some wait.
  static short events_of(const Connection& c) {
    short events = 0;
    if (c.closing ? c.out.empty() : c.out.size() < kMaxPendingReply) events |= POLLIN;
    if (!c.out.empty()) events |= POLLOUT;
    return events;
  }

  void serve(Connection& c, short revents) {
    if (revents & POLLOUT) flush(c);
    if (c.fd < 0 || !(revents & (POLLIN | POLLHUP | POLLERR))) return;
    char chunk[64 * 1024];
    if (c.closing) {
      // Refused, its reply sent: what it still sends is read and dropped (a socket closed with
      // unread bytes resets the connection, and the client could lose its refusal) until it
      // closes, or kLingerSeconds have passed (expire_and_drop).
      for (int reads = 0; reads < kReadsPerRound; ++reads) {
        const ssize_t n = ::recv(c.fd, chunk, sizeof(chunk), MSG_DONTWAIT);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
        if (n <= 0) return drop(c);
      }
      return;
    }
    // At most kReadsPerRound reads per poll round, so that one client that keeps sending does
    // not hold the only thread (the others, and the expiry, wait for the next round).
    for (int reads = 0; reads < kReadsPerRound; ++reads) {
      if (c.closing || c.out.size() >= kMaxPendingReply) break;
      const ssize_t n = ::recv(c.fd, chunk, sizeof(chunk), MSG_DONTWAIT);
      if (n > 0) {
        c.in.append(chunk, static_cast<size_t>(n));
        c.last_progress = Clock::now();
        if (!c.introduced) {
          pending_bytes += static_cast<size_t>(n);
          close_largest_pending();
        }
        if (!parse(c)) return;
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
      drop(c);  // closed by the peer, or broken
      return;
    }
    flush(c);
  }

  void flush(Connection& c) {
    while (!c.out.empty()) {
      const ssize_t n = ::send(c.fd, c.out.data(), c.out.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n > 0) {
        c.out.erase(0, static_cast<size_t>(n));
        c.last_progress = Clock::now();
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
      drop(c);
      return;
    }
    // A refused client has its answer: no more bytes go to it; it closes its end next.
    if (c.closing && !c.shut) {
      ::shutdown(c.fd, SHUT_WR);
      c.shut = true;
      c.last_progress = Clock::now();
    }
  }

  /// Handles every complete message in c.in; false when the connection was dropped.
  bool parse(Connection& c) {
    for (;;) {
      if (c.fd < 0 || c.closing) return c.fd >= 0;
      if (c.in.size() < 4) return true;
      if (take<uint32_t>(c.in, 0) != kMagic) {
        drop(c);  // not a client of ours: no reply
        return false;
      }
      if (c.in.size() < kHeaderBytes + 4) return true;
      const uint8_t op = take<uint8_t>(c.in, 4);
      if (op < kHello || op > kDeparted) {
        drop(c);
        return false;
      }
      const size_t a = take<uint32_t>(c.in, kHeaderBytes);
      if (a > part_limit(op, 0)) {
        refuse(c,
               detail::str_cat("a request of ", a, " bytes is larger than the store takes (",
                               part_limit(op, 0), ")"),
               true);
        return true;
      }
      if (c.in.size() < kHeaderBytes + 4 + a + 4) return true;
      const size_t b = take<uint32_t>(c.in, kHeaderBytes + 4 + a);
      if (b > part_limit(op, 1)) {
        refuse(c,
               detail::str_cat("a value of ", b, " bytes is larger than the store takes (",
                               part_limit(op, 1), ")"),
               true);
        return true;
      }
      const size_t total = kHeaderBytes + 4 + a + 4 + b;
      if (c.in.size() < total) return true;
      const uint64_t nonce_sent = take<uint64_t>(c.in, 5);
      const int32_t rank = take<int32_t>(c.in, 13);
      const std::string first = c.in.substr(kHeaderBytes + 4, a);
      const std::string second = c.in.substr(kHeaderBytes + 8 + a, b);
      c.in.erase(0, total);
      if (!c.introduced) pending_bytes -= total;
      handle(c, op, nonce_sent, rank, first, second);
    }
  }

  std::string worker(int rank) const {
    return options.describe_worker ? options.describe_worker(rank)
                                   : detail::str_cat("worker ", rank);
  }

  void handle(Connection& c, uint8_t op, uint64_t nonce_sent, int32_t rank,
              const std::string& first, const std::string& second) {
    if (op == kHello) {
      if (c.introduced) return drop(c);
      // The token first: a client without it learns nothing of this job (not its cluster).
      if (!equal_in_constant_time(first, options.token)) {
        return refuse_joining(
            c, rank,
            options.token.empty()
                ? std::string("this worker has TANDEM_JOB_TOKEN set and the chief has "
                              "none: the chief's job is not this worker's")
                : std::string("TANDEM_JOB_TOKEN ") +
                      (first.empty() ? "is not set in this worker" : "differs from the chief's") +
                      ": the chief's job requires its token");
      }
      const std::string mine = shorten(options.cluster), theirs = shorten(second);
      if (second != options.cluster) {
        return refuse_joining(c, rank,
                              detail::str_cat("the chief at ", options.host, ":", options.port,
                                              " serves another job: its TF_CONFIG cluster is [",
                                              mine, "], this worker's is [", theirs, "]"));
      }
      if (rank < 0 || rank >= options.world_size) {
        return refuse_joining(c, rank,
                              detail::str_cat("worker index ", rank, " is outside this job's 0..",
                                              options.world_size - 1));
      }
      const auto r = static_cast<size_t>(rank);
      if (joined[r] == 1) {
        return refuse_joining(
            c, rank,
            detail::str_cat("another process already joined this job as ", worker(rank),
                            " (connected from ", joined_from[r],
                            "): is a second job using the same TF_CONFIG addresses?"));
      }
      if (joined[r] == 2) {
        return refuse_joining(
            c, rank,
            detail::str_cat(worker(rank),
                            " already joined this job and left it; a running job does "
                            "not take a worker back: start the whole job again"));
      }
      admit(c);
      c.rank = rank;
      joined[r] = 1;
      joined_from[r] = c.peer;
      std::string payload;
      put(payload, nonce);
      return reply(c, kOk, payload);
    }
    if (!c.introduced) return drop(c);
    if (nonce_sent != nonce) {
      return refuse(c, "a request with another job's nonce: this connection is not of this job",
                    true);
    }
    if (op == kSet) {
      auto it = values.find(first);
      if (it != values.end()) {
        return refuse(c,
                      detail::str_cat("key \"", shorten(first), "\" was already set by ",
                                      worker(it->second.second), "; keys are set once"),
                      false);
      }
      if (values.size() >= TcpStore::kMaxKeys ||
          stored_bytes + first.size() + second.size() > TcpStore::kMaxStoredBytes) {
        return refuse(c,
                      detail::str_cat("the store is full (", values.size(), " keys, ", stored_bytes,
                                      " bytes)"),
                      false);
      }
      stored_bytes += first.size() + second.size();
      values.emplace(first, std::make_pair(second, c.rank));
      return reply(c, kOk, "");
    }
    if (op == kGet) {
      auto it = values.find(first);
      if (it == values.end()) return reply(c, kMissing, "");
      return reply(c, kOk, it->second.first);
    }
    // kDeparted: {rank: i32, seconds since: f64} for every worker whose connection closed.
    std::string payload;
    const auto now = Clock::now();
    for (size_t r = 0; r < joined.size(); ++r) {
      if (joined[r] != 2) continue;
      put(payload, static_cast<int32_t>(r));
      put(payload, std::chrono::duration<double>(now - left_at[r]).count());
    }
    reply(c, kOk, payload);
  }

  void drop(Connection& c) {
    if (c.fd < 0) return;
    ::close(c.fd);
    c.fd = -1;
    if (!c.introduced) forget_pending(c);
    if (c.introduced && c.rank >= 0) {
      joined[static_cast<size_t>(c.rank)] = 2;
      left_at[static_cast<size_t>(c.rank)] = Clock::now();
    }
  }

  /// Drops connections that stalled: not introduced within hello_timeout of connecting (a
  /// worker introduces itself at once; these hold descriptors and pending places), or in the
  /// middle of a request, or not reading their replies, for longer than the timeout.
  /// Introduced workers may stay idle.
  void expire_and_drop() {
    const auto now = Clock::now();
    const auto hello = std::min(options.timeout, options.hello_timeout);
    for (Connection& c : connections) {
      if (c.fd < 0) continue;
      if (c.shut && now - c.last_progress > std::chrono::seconds(kLingerSeconds)) {
        drop(c);
        continue;
      }
      if (!c.introduced && !c.closing && now - c.opened > hello) {
        drop(c);
        continue;
      }
      const bool waiting_on_them = !c.in.empty() || !c.out.empty();
      if (waiting_on_them && now - c.last_progress > options.timeout) drop(c);
    }
    std::erase_if(connections, [](const Connection& c) { return c.fd < 0; });
  }
};

TcpStoreServer::TcpStoreServer(const TcpStoreOptions& options, const std::string& where)
    : state_(std::make_unique<State>(options)) {
  state_->listen_on(where);
}

TcpStoreServer::~TcpStoreServer() = default;

}  // namespace tandem::collectives
