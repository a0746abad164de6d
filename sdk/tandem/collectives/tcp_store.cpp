// TcpStore over POSIX sockets. A request is {op: 1 byte, key length: u32, key, value length:
// u32, value}; set replies {1}; get replies {found: 1 byte, length: u32, value}. The server
// answers each connection on a thread of its own; clients poll for missing keys.
#include "tandem/collectives/internal/tcp_store.h"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <map>

#include "tandem/core/error.h"

namespace tandem::collectives {

namespace {

constexpr char kSet = 1, kGet = 2;
using Clock = std::chrono::steady_clock;

bool write_all(int fd, const void* data, size_t bytes) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::send(fd, p, bytes, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    p += n;
    bytes -= static_cast<size_t>(n);
  }
  return true;
}

bool read_all(int fd, void* data, size_t bytes) {
  char* p = static_cast<char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::recv(fd, p, bytes, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    p += n;
    bytes -= static_cast<size_t>(n);
  }
  return true;
}

bool read_string(int fd, std::string& out) {
  uint32_t n = 0;
  if (!read_all(fd, &n, sizeof(n)) || n > (64u << 20)) return false;
  out.resize(n);
  return n == 0 || read_all(fd, out.data(), n);
}

bool write_bytes(int fd, const char* data, size_t n) {
  const uint32_t length = static_cast<uint32_t>(n);
  return write_all(fd, &length, sizeof(length)) && (n == 0 || write_all(fd, data, n));
}

}  // namespace

// ---- the server (the chief) --------------------------------------------------------------------

struct TcpStore::Server {
  int listener = -1;
  std::atomic<bool> stop{false};
  std::mutex mutex;
  std::map<std::string, std::string> values;
  std::vector<int> clients;
  std::thread acceptor;
  std::vector<std::thread> handlers;

  void serve_client(int fd) {
    for (;;) {
      char op = 0;
      std::string key, value;
      if (!read_all(fd, &op, 1) || !read_string(fd, key) || !read_string(fd, value)) return;
      if (op == kSet) {
        {
          std::lock_guard<std::mutex> lock(mutex);
          values[key] = value;
        }
        const char ok = 1;
        if (!write_all(fd, &ok, 1)) return;
      } else if (op == kGet) {
        std::string found;
        char present = 0;
        {
          std::lock_guard<std::mutex> lock(mutex);
          auto it = values.find(key);
          if (it != values.end()) {
            present = 1;
            found = it->second;
          }
        }
        if (!write_all(fd, &present, 1) || !write_bytes(fd, found.data(), found.size())) return;
      } else {
        return;  // not a client of ours
      }
    }
  }

  void accept_loop() {
    while (!stop.load()) {
      pollfd p{listener, POLLIN, 0};
      if (::poll(&p, 1, 100) <= 0) continue;
      const int fd = ::accept(listener, nullptr, nullptr);
      if (fd < 0) continue;
      const int one = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      std::lock_guard<std::mutex> lock(mutex);
      clients.push_back(fd);
      handlers.emplace_back([this, fd] { serve_client(fd); });
    }
  }

  ~Server() {
    stop = true;
    if (acceptor.joinable()) acceptor.join();
    {
      std::lock_guard<std::mutex> lock(mutex);
      for (int fd : clients) ::shutdown(fd, SHUT_RDWR);
    }
    for (std::thread& t : handlers) t.join();
    for (int fd : clients) ::close(fd);
    if (listener >= 0) ::close(listener);
  }
};

// ---- the client
// ----------------------------------------------------------------------------------

TcpStore::TcpStore(const std::string& host, int port, bool serve, std::chrono::milliseconds timeout,
                   std::function<std::string(const std::string&)> name_key)
    : timeout_(timeout), name_key_(std::move(name_key)) {
  where_ = host + ":" + std::to_string(port);
  if (serve) {
    server_ = std::make_unique<Server>();
    server_->listener = ::socket(AF_INET6, SOCK_STREAM, 0);
    bool v6 = server_->listener >= 0;
    if (!v6) server_->listener = ::socket(AF_INET, SOCK_STREAM, 0);
    TANDEM_CHECK(server_->listener >= 0,
                 "TF_CONFIG rendezvous: cannot open a socket: ", std::strerror(errno));
    const int one = 1, zero = 0;
    ::setsockopt(server_->listener, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    int bound = -1;
    if (v6) {
      ::setsockopt(server_->listener, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero));
      sockaddr_in6 address{};
      address.sin6_family = AF_INET6;
      address.sin6_addr = in6addr_any;
      address.sin6_port = htons(static_cast<uint16_t>(port));
      bound = ::bind(server_->listener, reinterpret_cast<sockaddr*>(&address), sizeof(address));
    } else {
      sockaddr_in address{};
      address.sin_family = AF_INET;
      address.sin_addr.s_addr = htonl(INADDR_ANY);
      address.sin_port = htons(static_cast<uint16_t>(port));
      bound = ::bind(server_->listener, reinterpret_cast<sockaddr*>(&address), sizeof(address));
    }
    TANDEM_CHECK(bound == 0 && ::listen(server_->listener, 128) == 0,
                 "TF_CONFIG rendezvous: the chief cannot listen on port ", port, " (", where_,
                 "): ", std::strerror(errno), "; is another job using it?");
    server_->acceptor = std::thread([s = server_.get()] { s->accept_loop(); });
  }
  // Connect, retrying: the chief may start after this worker.
  const auto deadline = Clock::now() + timeout;
  std::string last_error = "no attempt";
  for (;;) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* found = nullptr;
    const int resolved = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found);
    if (resolved != 0) {
      last_error = ::gai_strerror(resolved);
    } else {
      for (addrinfo* a = found; a != nullptr && socket_ < 0; a = a->ai_next) {
        const int fd = ::socket(a->ai_family, a->ai_socktype, a->ai_protocol);
        if (fd < 0) continue;
        if (::connect(fd, a->ai_addr, a->ai_addrlen) == 0) {
          socket_ = fd;
        } else {
          last_error = std::strerror(errno);
          ::close(fd);
        }
      }
      ::freeaddrinfo(found);
    }
    if (socket_ >= 0) break;
    if (Clock::now() >= deadline) {
      TANDEM_THROW("TF_CONFIG rendezvous: could not reach the chief's store at ", where_,
                   " within ", static_cast<double>(timeout.count()) / 1000.0,
                   " s (TANDEM_COLLECTIVE_TIMEOUT): ", last_error,
                   "; is the chief (worker 0) started, and is the address right?");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  const int one = 1;
  ::setsockopt(socket_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

TcpStore::~TcpStore() {
  if (socket_ >= 0) ::close(socket_);
}

bool TcpStore::request(char op, const std::string& key, const std::vector<char>& value,
                       std::vector<char>* reply) {
  std::lock_guard<std::mutex> lock(mutex_);
  bool ok = write_all(socket_, &op, 1) && write_bytes(socket_, key.data(), key.size()) &&
            write_bytes(socket_, value.data(), value.size());
  char status = 0;
  ok = ok && read_all(socket_, &status, 1);
  TANDEM_CHECK(ok, "TF_CONFIG rendezvous: the connection to the chief's store at ", where_,
               " broke (did the chief exit?)");
  if (op == kGet) {
    std::string data;
    TANDEM_CHECK(read_string(socket_, data),
                 "TF_CONFIG rendezvous: the connection to the chief's "
                 "store at ",
                 where_, " broke (did the chief exit?)");
    if (reply) reply->assign(data.begin(), data.end());
  }
  return status != 0;
}

void TcpStore::set(const std::string& key, const std::vector<char>& value) {
  request(kSet, key, value, nullptr);
}

std::vector<char> TcpStore::get(const std::string& key) {
  wait({key}, timeout_);
  std::vector<char> value;
  request(kGet, key, {}, &value);
  return value;
}

void TcpStore::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  std::vector<std::string> missing = keys;
  auto names = [&] {
    std::string out;
    for (size_t i = 0; i < missing.size(); ++i)
      out += (i ? ", " : "") + (name_key_ ? name_key_(missing[i]) : missing[i]);
    return out;
  };
  for (;;) {
    std::vector<std::string> still;
    std::vector<char> ignored;
    try {
      for (const std::string& key : missing)
        if (!request(kGet, key, {}, &ignored)) still.push_back(key);
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

}  // namespace tandem::collectives
