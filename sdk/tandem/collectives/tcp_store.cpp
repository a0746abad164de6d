// TcpStore's client over POSIX sockets (the wire format: internal/tcp_store_protocol.h; the
// chief's server: tcp_store_server.cpp). Every connect, send and receive waits with a deadline.
#include "tandem/collectives/internal/tcp_store.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <random>
#include <thread>

#include "tandem/collectives/internal/tcp_store_protocol.h"
#include "tandem/collectives/internal/tcp_store_server.h"
#include "tandem/core/error.h"

namespace tandem::collectives {

using namespace store_wire;

namespace {

using Clock = std::chrono::steady_clock;

void set_nonblocking(int fd) { ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL, 0) | O_NONBLOCK); }

int remaining_ms(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  return static_cast<int>(std::max<int64_t>(0, std::min<int64_t>(left.count(), 1000)));
}

enum class Io { kDone, kTimeout, kClosed };

/// Waits for `events` on fd until the deadline.
Io wait_for(int fd, short events, Clock::time_point deadline) {
  for (;;) {
    pollfd p{fd, events, 0};
    const int ready = ::poll(&p, 1, remaining_ms(deadline));
    if (ready > 0) return (p.revents & (POLLERR | POLLNVAL)) ? Io::kClosed : Io::kDone;
    if (ready < 0 && errno != EINTR) return Io::kClosed;
    if (Clock::now() >= deadline) return Io::kTimeout;
  }
}

Io send_all(int fd, const std::string& data, Clock::time_point deadline) {
  size_t at = 0;
  while (at < data.size()) {
    const ssize_t n = ::send(fd, data.data() + at, data.size() - at, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      at += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      const Io io = wait_for(fd, POLLOUT, deadline);
      if (io != Io::kDone) return io;
      continue;
    }
    return Io::kClosed;
  }
  return Io::kDone;
}

Io recv_all(int fd, char* data, size_t bytes, Clock::time_point deadline) {
  while (bytes > 0) {
    const ssize_t n = ::recv(fd, data, bytes, MSG_DONTWAIT);
    if (n > 0) {
      data += n;
      bytes -= static_cast<size_t>(n);
      continue;
    }
    if (n == 0) return Io::kClosed;
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      const Io io = wait_for(fd, POLLIN, deadline);
      if (io != Io::kDone) return io;
      continue;
    }
    return Io::kClosed;
  }
  return Io::kDone;
}

}  // namespace

std::pair<std::string, int> split_host_port(const std::string& address) {
  const size_t colon = address.rfind(':');
  std::string host = address.substr(0, colon);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']')
    host = host.substr(1, host.size() - 2);
  return {host, colon == std::string::npos ? 0 : std::atoi(address.c_str() + colon + 1)};
}

// ---- the client
// ----------------------------------------------------------------------------------

TcpStore::TcpStore(TcpStoreOptions options) : options_(std::move(options)) {
  const bool v6 = options_.host.find(':') != std::string::npos;
  where_ = (v6 ? "[" + options_.host + "]" : options_.host) + ":" + std::to_string(options_.port);
  TANDEM_CHECK(options_.token.size() <= kMaxTokenBytes, "TANDEM_JOB_TOKEN has ",
               options_.token.size(), " bytes; at most ", kMaxTokenBytes);
  if (options_.serve) {
    server_ = std::make_unique<TcpStoreServer>(options_, where_);
  }
  connect_and_introduce();
}

TcpStore::~TcpStore() {
  if (socket_ >= 0) ::close(socket_);
}

namespace {

/// One connection to the chief's store, or -1 with the reason in `error`.
int connect_once(const std::string& host, int port, Clock::time_point deadline,
                 std::string& error) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const int resolved = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found);
  if (resolved != 0) {
    error = ::gai_strerror(resolved);
    return -1;
  }
  int connected = -1;
  for (addrinfo* a = found; a != nullptr && connected < 0; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    set_nonblocking(fd);
    int failure = 0;
    if (::connect(fd, a->ai_addr, a->ai_addrlen) != 0) {
      failure = errno;
      if (failure == EINPROGRESS) {
        const Io io =
            wait_for(fd, POLLOUT, std::min(deadline, Clock::now() + std::chrono::seconds(1)));
        socklen_t length = sizeof(failure);
        failure = io == Io::kTimeout ? ETIMEDOUT : 0;
        if (io != Io::kTimeout) ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &failure, &length);
      }
    }
    if (failure == 0) {
      connected = fd;
    } else {
      error = std::strerror(failure);
      ::close(fd);
    }
  }
  ::freeaddrinfo(found);
  return connected;
}

}  // namespace

void TcpStore::connect_and_introduce() {
  const auto deadline = Clock::now() + options_.timeout;
  const double seconds = static_cast<double>(options_.timeout.count()) / 1000.0;
  std::string last_error = "no attempt";
  bool closed_unanswered = false;
  // Connect and introduce this worker, again until the timeout when nobody listens yet (the
  // chief may start after this worker) or the connection closes without an answer (a chief
  // busy with connections that never introduce themselves may close this one to make room:
  // Note [the store's door] in tcp_store_server.cpp). The pauses double, from 20 ms to 0.5 s,
  // with jitter, so that workers turned away together do not all come back together.
  std::minstd_rand random(std::random_device{}());
  auto pause = std::chrono::milliseconds(20);
  for (;;) {
    closed_unanswered = false;
    socket_ = connect_once(options_.host, options_.port, deadline, last_error);
    if (socket_ >= 0) {
      if (introduce(deadline)) return;
      ::close(socket_);
      socket_ = -1;
      closed_unanswered = true;
    }
    const auto now = Clock::now();
    if (now >= deadline && closed_unanswered) {
      TANDEM_THROW("TF_CONFIG rendezvous: the chief's store at ", where_,
                   " closed the connection without an answer until the timeout (", seconds,
                   " s, TANDEM_COLLECTIVE_TIMEOUT): is another program listening on the "
                   "chief's port, or did the chief exit?");
    }
    if (now >= deadline) {
      TANDEM_THROW("TF_CONFIG rendezvous: could not reach the chief's store at ", where_,
                   " within ", seconds, " s (TANDEM_COLLECTIVE_TIMEOUT): ", last_error,
                   "; is the chief (worker 0) started, and is the address right?");
    }
    const auto jittered = pause * (50 + random() % 51) / 100;
    std::this_thread::sleep_for(std::min<Clock::duration>(jittered, deadline - now));
    pause = std::min(pause * 2, std::chrono::milliseconds(500));
  }
}

bool TcpStore::introduce(Clock::time_point deadline) {
  const double seconds = static_cast<double>(options_.timeout.count()) / 1000.0;
  const int one = 1;
  ::setsockopt(socket_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  // The reply is the job's nonce, or why the chief refuses this worker.
  const std::string hello = encode(kHello, 0, options_.rank, options_.token, options_.cluster);
  Io io = send_all(socket_, hello, deadline);
  char head[5];
  if (io == Io::kDone) io = recv_all(socket_, head, sizeof(head), deadline);
  if (io == Io::kTimeout) {
    TANDEM_THROW("TF_CONFIG rendezvous: something at ", where_,
                 " accepted the connection but did not answer within ", seconds,
                 " s (TANDEM_COLLECTIVE_TIMEOUT): is another program listening on the chief's "
                 "port?");
  }
  if (io != Io::kDone) return false;  // closed without an answer: connect again
  const uint8_t status = static_cast<uint8_t>(head[0]);
  uint32_t length = 0;
  std::memcpy(&length, head + 1, sizeof(length));
  const bool plausible = (status == kOk && length == sizeof(uint64_t)) ||
                         (status == kRefused && length <= kMaxValueBytes);
  TANDEM_CHECK(plausible, "TF_CONFIG rendezvous: something at ", where_,
               " answered that is not a Tandem chief: is another program listening on the "
               "chief's port?");
  std::string payload(length, '\0');
  io = length > 0 ? recv_all(socket_, payload.data(), length, deadline) : Io::kDone;
  TANDEM_CHECK(io == Io::kDone, "TF_CONFIG rendezvous: the answer of the chief's store at ", where_,
               " broke off");
  if (status == kRefused)
    TANDEM_THROW("TF_CONFIG rendezvous: the chief's store at ", where_, " refused worker ",
                 options_.rank, ": ", payload);
  std::memcpy(&nonce_, payload.data(), sizeof(nonce_));
  return true;
}

TcpStore::Reply TcpStore::request(uint8_t op, const std::string& key, const std::string& value) {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto deadline = Clock::now() + options_.timeout;
  TANDEM_CHECK(socket_ >= 0, "TF_CONFIG rendezvous: the connection to the chief's store at ",
               where_, " is closed");
  Io io = send_all(socket_, encode(op, nonce_, options_.rank, key, value), deadline);
  char head[5];
  if (io == Io::kDone) io = recv_all(socket_, head, sizeof(head), deadline);
  Reply reply;
  uint32_t length = 0;
  if (io == Io::kDone) {
    reply.status = static_cast<uint8_t>(head[0]);
    std::memcpy(&length, head + 1, sizeof(length));
    if (reply.status > kRefused || length > kMaxValueBytes) io = Io::kClosed;
  }
  if (io == Io::kDone && length > 0) {
    reply.payload.resize(length);
    io = recv_all(socket_, reply.payload.data(), length, deadline);
  }
  if (io != Io::kDone) {
    ::close(socket_);
    socket_ = -1;
    TANDEM_THROW("TF_CONFIG rendezvous: the chief's store at ", where_,
                 io == Io::kTimeout ? " did not answer within " : " is gone (",
                 io == Io::kTimeout ? std::to_string(options_.timeout.count() / 1000.0) + " s"
                                    : std::string("the connection broke"),
                 io == Io::kTimeout ? " (TANDEM_COLLECTIVE_TIMEOUT)" : "; did the chief exit?)");
  }
  if (reply.status == kRefused)
    TANDEM_THROW("TF_CONFIG rendezvous: the chief's store at ", where_, " refused a request of ",
                 "worker ", options_.rank, ": ", reply.payload);
  return reply;
}

void TcpStore::set(const std::string& key, const std::vector<char>& value) {
  TANDEM_CHECK(key.size() <= kMaxKeyBytes && value.size() <= kMaxValueBytes,
               "TF_CONFIG rendezvous: a key of ", key.size(), " bytes with a value of ",
               value.size(), " bytes is larger than the store takes (", kMaxKeyBytes, " and ",
               kMaxValueBytes, ")");
  request(kSet, key, std::string(value.begin(), value.end()));
}

std::optional<std::vector<char>> TcpStore::try_get(const std::string& key) {
  const Reply reply = request(kGet, key, "");
  if (reply.status == kMissing) return std::nullopt;
  return std::vector<char>(reply.payload.begin(), reply.payload.end());
}

std::vector<char> TcpStore::get(const std::string& key) {
  wait({key}, options_.timeout);
  return *try_get(key);
}

void TcpStore::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  std::vector<std::string> missing = keys;
  auto names = [&] {
    std::string out;
    for (size_t i = 0; i < missing.size(); ++i)
      out += (i ? ", " : "") +
             (options_.describe_key ? options_.describe_key(missing[i]) : missing[i]);
    return out;
  };
  for (;;) {
    std::vector<std::string> still;
    try {
      for (const std::string& key : missing)
        if (request(kGet, key, "").status == kMissing) still.push_back(key);
    } catch (const Error& e) {
      // The chief gave up first (its own wait timed out) and closed the store.
      TANDEM_THROW("TF_CONFIG rendezvous: waiting for ", names(), ": ", e.what());
    }
    if (still.empty()) return;
    missing = std::move(still);
    if (Clock::now() >= deadline) {
      TANDEM_THROW("TF_CONFIG rendezvous: ", names(), " did not arrive within ",
                   static_cast<double>(timeout.count()) / 1000.0,
                   " s (TANDEM_COLLECTIVE_TIMEOUT); was it started with this TF_CONFIG?");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

std::vector<std::pair<int, double>> TcpStore::departed() {
  const Reply reply = request(kDeparted, "", "");
  std::vector<std::pair<int, double>> out;
  constexpr size_t kEntry = sizeof(int32_t) + sizeof(double);
  for (size_t at = 0; at + kEntry <= reply.payload.size(); at += kEntry)
    out.emplace_back(take<int32_t>(reply.payload, at),
                     take<double>(reply.payload, at + sizeof(int32_t)));
  return out;
}

}  // namespace tandem::collectives
