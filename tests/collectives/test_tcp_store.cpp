// TcpStore, where TF_CONFIG workers meet: a job's identity at the door (its cluster, worker
// indices held once, the token, the nonce), deadlines on every read and connect, bounded sizes,
// connections not introduced bounded and timed out without keeping workers out, bad clients
// dropped with their descriptors closed, the chief's address only, and which workers left. Raw
// sockets play the hostile, idle or broken clients.
#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "support/stderr_capture.h"
#include "tandem/collectives/internal/tcp_store.h"
#include "tandem/core/error.h"

using tandem::testing::stderr_of;

namespace {

using tandem::collectives::TcpStore;
using tandem::collectives::TcpStoreOptions;
using Clock = std::chrono::steady_clock;

/// A port nothing listens on now.
int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address));
  socklen_t length = sizeof(address);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length);
  const int port = ntohs(address.sin_port);
  ::close(fd);
  return port;
}

std::string cluster_of(int port, int workers) {
  std::string out;
  for (int w = 0; w < workers; ++w)
    out += (w ? ", " : "") + std::string("127.0.0.1:") + std::to_string(port + w);
  return out;
}

TcpStoreOptions options(int port, int rank, int workers = 2) {
  TcpStoreOptions o;
  o.host = "127.0.0.1";
  o.port = port;
  o.serve = rank == 0;
  o.rank = rank;
  o.world_size = workers;
  o.cluster = cluster_of(port, workers);
  o.timeout = std::chrono::milliseconds(3000);
  return o;
}

int count_entries(const char* directory) {
  int n = 0;
  DIR* dir = ::opendir(directory);
  while (const dirent* entry = ::readdir(dir))
    if (entry->d_name[0] != '.') ++n;
  ::closedir(dir);
  return n;
}

int open_descriptors() { return count_entries("/proc/self/fd"); }
int threads() { return count_entries("/proc/self/task"); }

/// Polls `done` for up to two seconds.
template <typename Done>
bool eventually(Done&& done) {
  const auto deadline = Clock::now() + std::chrono::seconds(2);
  while (Clock::now() < deadline) {
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return done();
}

/// A client speaking the store's framing by hand (store protocol: tcp_store.cpp).
class RawClient {
 public:
  explicit RawClient(int port, const char* host = "127.0.0.1") {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    ::inet_pton(AF_INET, host, &address.sin_addr);
    address.sin_port = htons(static_cast<uint16_t>(port));
    connected_ = ::connect(fd_, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0;
    connect_error_ = connected_ ? 0 : errno;
  }
  ~RawClient() { close(); }
  void close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  bool connected() const { return connected_; }
  int connect_error() const { return connect_error_; }

  static std::string message(uint8_t op, uint64_t nonce, int32_t rank, uint32_t a_length,
                             const std::string& a, uint32_t b_length, const std::string& b) {
    std::string out;
    const uint32_t magic = 0x53444e54;
    out.append(reinterpret_cast<const char*>(&magic), 4);
    out.append(reinterpret_cast<const char*>(&op), 1);
    out.append(reinterpret_cast<const char*>(&nonce), 8);
    out.append(reinterpret_cast<const char*>(&rank), 4);
    out.append(reinterpret_cast<const char*>(&a_length), 4);
    out += a;
    out.append(reinterpret_cast<const char*>(&b_length), 4);
    out += b;
    return out;
  }
  void send(const std::string& bytes) { ::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL); }

  /// The reply {status, payload}, or status -1 when the store closed the connection (or said
  /// nothing within two seconds: -2).
  std::pair<int, std::string> reply(int timeout_ms = 2000) {
    char head[5];
    if (!read(head, 5, timeout_ms)) return {closed_ ? -1 : -2, ""};
    uint32_t length = 0;
    std::memcpy(&length, head + 1, 4);
    std::string payload(length, '\0');
    if (length > 0 && !read(payload.data(), length, timeout_ms)) return {-1, ""};
    return {static_cast<uint8_t>(head[0]), payload};
  }
  /// True once the store has closed this connection (waiting up to `timeout_ms` for it).
  bool closed_by_store(int timeout_ms = 2000) {
    if (!connected_) return true;  // never open (a connect refused or timed out)
    char byte;
    pollfd p{fd_, POLLIN, 0};
    if (::poll(&p, 1, timeout_ms) <= 0) return false;
    const ssize_t n = ::recv(fd_, &byte, 1, MSG_DONTWAIT);
    return n == 0 || (n < 0 && errno == ECONNRESET);
  }

 private:
  bool read(char* data, size_t bytes, int timeout_ms) {
    while (bytes > 0) {
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, timeout_ms) <= 0) return false;
      const ssize_t n = ::recv(fd_, data, bytes, 0);
      if (n <= 0) {
        closed_ = true;
        return false;
      }
      data += n;
      bytes -= static_cast<size_t>(n);
    }
    return true;
  }
  int fd_ = -1;
  bool connected_ = false;
  int connect_error_ = 0;
  bool closed_ = false;
};

/// The first `bytes` bytes of a worker's introduction: a client that stalls in its hello.
std::string partial_hello(int port, int workers, size_t bytes) {
  const std::string cluster = cluster_of(port, workers);
  return RawClient::message(1, 0, 1, 6, "s3cret", static_cast<uint32_t>(cluster.size()), cluster)
      .substr(0, bytes);
}

/// Raises this process's soft limit on open descriptors to `needed` if the hard limit allows;
/// false when it does not.
bool allow_descriptors(rlim_t needed) {
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0) return false;
  if (limit.rlim_cur != RLIM_INFINITY && limit.rlim_cur >= needed) return true;
  if (limit.rlim_cur == RLIM_INFINITY) return true;
  if (limit.rlim_max != RLIM_INFINITY && limit.rlim_max < needed) return false;
  limit.rlim_cur = needed;
  return ::setrlimit(RLIMIT_NOFILE, &limit) == 0;
}

}  // namespace

TEST_CASE("tcp store: a job's workers meet, share its nonce, and set each key once",
          "[cpu][collectives][store]") {
  const int port = free_port();
  TcpStore chief(options(port, 0));
  TcpStore worker(options(port, 1));
  CHECK(chief.job_nonce() != 0);
  CHECK(worker.job_nonce() == chief.job_nonce());
  worker.set("answer", {'4', '2'});
  CHECK(chief.get("answer") == std::vector<char>{'4', '2'});
  CHECK_FALSE(chief.try_get("missing"));
  CHECK_THROWS_WITH(
      chief.set("answer", {'0'}),
      Catch::Contains("key \"answer\" was already set by worker 1; keys are set once"));
  CHECK(worker.get("answer") == std::vector<char>{'4', '2'});
  // Another chief's job draws another nonce.
  const int other_port = free_port();
  TcpStore other(options(other_port, 0));
  CHECK(other.job_nonce() != chief.job_nonce());
}

TEST_CASE("tcp store: another job's worker, a second worker 1 and a wrong token are refused",
          "[cpu][collectives][store]") {
  const int port = free_port();
  TcpStoreOptions chief_options = options(port, 0);
  chief_options.token = "s3cret";
  TcpStore chief(chief_options);
  SECTION("a worker whose TF_CONFIG lists another cluster") {
    TcpStoreOptions o = options(port, 1);
    o.token = "s3cret";
    o.cluster = "127.0.0.1:" + std::to_string(port) + ", 127.0.0.1:9";
    const std::string chief_log = stderr_of([&] {
      CHECK_THROWS_WITH(TcpStore(o),
                        Catch::Contains("serves another job: its TF_CONFIG cluster is [" +
                                        cluster_of(port, 2) + "], this worker's is [127.0.0.1:" +
                                        std::to_string(port) + ", 127.0.0.1:9]"));
    });
    // The chief says so at once too, naming who came (it would otherwise only time out waiting
    // for its worker 1).
    CHECK_THAT(chief_log, Catch::Contains("the chief refused the process at 127.0.0.1:") &&
                              Catch::Contains("that asked to join as worker 1: the chief at") &&
                              Catch::Contains("serves another job"));
  }
  SECTION("the token: missing, different; never shown, and checked before the cluster") {
    TcpStoreOptions o = options(port, 1);
    CHECK_THROWS_WITH(TcpStore(o), Catch::Contains("TANDEM_JOB_TOKEN is not set in this worker") &&
                                       !Catch::Contains("s3cret"));
    // Without the token, a client learns nothing of the job (not its cluster).
    o.cluster = "10.9.9.9:1, 10.9.9.9:2";
    CHECK_THROWS_WITH(TcpStore(o), Catch::Contains("TANDEM_JOB_TOKEN is not set in this worker") &&
                                       !Catch::Contains(cluster_of(port, 2)));
    o.cluster = cluster_of(port, 2);
    o.token = "guess";
    CHECK_THROWS_WITH(TcpStore(o), Catch::Contains("TANDEM_JOB_TOKEN differs from the chief's") &&
                                       !Catch::Contains("s3cret") && !Catch::Contains("guess"));
  }
  SECTION("a worker index held by a connected worker, one that left, one outside the job") {
    TcpStoreOptions o = options(port, 1);
    o.token = "s3cret";
    {
      TcpStore first(o);
      CHECK_THROWS_WITH(TcpStore(o), Catch::Contains("another process already joined this job "
                                                     "as worker 1 (connected from 127.0.0.1:"));
    }
    CHECK(eventually([&] { return !chief.departed().empty(); }));
    CHECK_THROWS_WITH(TcpStore(o), Catch::Contains("worker 1 already joined this job and left "
                                                   "it; a running job does not take a worker "
                                                   "back"));
    o.rank = 5;
    CHECK_THROWS_WITH(TcpStore(o), Catch::Contains("worker index 5 is outside this job's 0..1"));
  }
}

TEST_CASE("tcp store: a port that accepts and never answers raises after the timeout",
          "[cpu][collectives][store]") {
  // Another program on the chief's port: it accepts (the kernel does, from its backlog) and
  // never answers, or answers something else.
  const int port = free_port();
  const int squatter = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = htons(static_cast<uint16_t>(port));
  REQUIRE(::bind(squatter, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0);
  REQUIRE(::listen(squatter, 8) == 0);
  TcpStoreOptions o = options(port, 1);
  o.timeout = std::chrono::milliseconds(500);
  const auto start = Clock::now();
  CHECK_THROWS_WITH(TcpStore(o), Catch::Contains("something at 127.0.0.1:" + std::to_string(port) +
                                                 " accepted the connection but did not answer "
                                                 "within 0.5 s"));
  CHECK(Clock::now() - start < std::chrono::seconds(3));
  // One that answers with bytes of its own.
  std::thread talker([&] {
    const int fd = ::accept(squatter, nullptr, nullptr);
    const char text[] = "HTTP/1.1 400 Bad Request\r\n\r\n";
    ::send(fd, text, sizeof(text) - 1, MSG_NOSIGNAL);
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    ::close(fd);
  });
  // Drain the connection left in the backlog by the first attempt, first.
  CHECK_THROWS_WITH(TcpStore(o),
                    Catch::Contains("is not a Tandem chief") || Catch::Contains("did not answer"));
  talker.join();
  ::close(squatter);
}

TEST_CASE("tcp store: huge sizes, many connections and garbage are refused without cost",
          "[cpu][collectives][store]") {
  const int port = free_port();
  TcpStore chief(options(port, 0));
  TcpStore worker(options(port, 1));
  const int descriptors = open_descriptors(), thread_count = threads();
  SECTION("a declared 64 MiB key is refused before a byte of it is read") {
    RawClient client(port);
    client.send(RawClient::message(1, 0, 1, 64u << 20, "", 0, ""));
    const auto [status, why] = client.reply();
    CHECK(status == 2);
    CHECK_THAT(why, Catch::Contains("larger than the store takes"));
    CHECK(client.closed_by_store());
  }
  SECTION("bytes that are not the store's protocol: dropped") {
    RawClient client(port);
    client.send("GET / HTTP/1.1\r\n\r\n");
    CHECK(client.closed_by_store());
  }
  SECTION("a request with another job's nonce: refused") {
    RawClient client(port);
    // Introduced as worker 1 would fail (it is connected): use a fresh job of 3 workers.
    client.close();
    const int port3 = free_port();
    TcpStore chief3(options(port3, 0, 3));
    RawClient raw(port3);
    raw.send(RawClient::message(1, 0, 2, 0, "", static_cast<uint32_t>(cluster_of(port3, 3).size()),
                                cluster_of(port3, 3)));
    const auto [hello, nonce] = raw.reply();
    REQUIRE(hello == 0);
    raw.send(RawClient::message(3, chief3.job_nonce() + 1, 2, 1, "k", 0, ""));
    const auto [status, why] = raw.reply();
    CHECK(status == 2);
    CHECK_THAT(why, Catch::Contains("another job's nonce"));
  }
  SECTION("200 connections from one address: no thread each, the oldest 136 closed, all closed") {
    std::vector<std::unique_ptr<RawClient>> clients;
    for (int i = 0; i < 200; ++i) clients.push_back(std::make_unique<RawClient>(port));
    CHECK(threads() == thread_count);
    // The store keeps 64 connections not introduced from one address: each newer one closed
    // the oldest; the newest 64 wait to be introduced (for 3 s, the timeout).
    int closed_first = 0, open_last = 0;
    for (int i = 0; i < 136; ++i)
      closed_first += clients[static_cast<size_t>(i)]->closed_by_store();
    for (int i = 136; i < 200; ++i)
      open_last += !clients[static_cast<size_t>(i)]->closed_by_store(/*timeout_ms=*/0);
    CHECK(closed_first == 136);
    CHECK(open_last == 64);
    clients.clear();
    worker.set("still-serving", {'y'});
    CHECK(chief.get("still-serving") == std::vector<char>{'y'});
  }
  // Every descriptor the store opened for these clients is closed again, and every thread it
  // started has ended (a joined thread can stay listed in /proc/self/task a moment longer).
  CHECK(eventually([&] { return open_descriptors() == descriptors; }));
  CHECK(eventually([&] { return threads() == thread_count; }));
}

TEST_CASE("tcp store: connections that never finish their hello are closed at their deadline",
          "[cpu][collectives][store]") {
  // Silent ones, ones that stop in the middle of their hello and one that trickles a byte at
  // a time: none keeps a worker out, and each is closed once its time to introduce itself
  // (here 300 ms) has passed since it connected, whatever it sent.
  const int port = free_port();
  TcpStoreOptions o = options(port, 0);
  o.token = "s3cret";
  o.timeout = std::chrono::milliseconds(10'000);
  o.hello_timeout = std::chrono::milliseconds(300);
  TcpStore chief(o);
  const auto opened = Clock::now();
  std::vector<std::unique_ptr<RawClient>> stalled;
  for (int i = 0; i < 16; ++i) {
    stalled.push_back(std::make_unique<RawClient>(port));
    if (i % 2 == 1) stalled.back()->send(partial_hello(port, 2, 10 + static_cast<size_t>(i)));
  }
  RawClient trickler(port);
  std::atomic<bool> trickling{true};
  std::thread trickle([&] {
    // All of a hello but its last byte, one byte each 50 ms (about 3 s).
    const std::string hello = partial_hello(port, 2, 1000);
    for (size_t i = 0; i + 1 < hello.size() && trickling; ++i) {
      trickler.send(hello.substr(i, 1));
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  });
  TcpStoreOptions w = options(port, 1);
  w.token = "s3cret";
  w.timeout = std::chrono::milliseconds(10'000);
  std::unique_ptr<TcpStore> worker;
  std::string worker_failure;
  try {
    worker = std::make_unique<TcpStore>(w);
  } catch (const std::exception& e) {
    worker_failure = e.what();
  }
  int closed = 0;
  for (auto& c : stalled) closed += c->closed_by_store(/*timeout_ms=*/3000);
  const bool trickler_closed = trickler.closed_by_store(/*timeout_ms=*/3000);
  const auto elapsed = Clock::now() - opened;
  trickling = false;
  trickle.join();
  CHECK(worker_failure == "");
  REQUIRE(worker);
  CHECK(worker->job_nonce() == chief.job_nonce());
  CHECK(closed == 16);
  CHECK(trickler_closed);
  CHECK(elapsed >= std::chrono::milliseconds(250));
  CHECK(elapsed < std::chrono::milliseconds(3000));
  // The worker, introduced, stays past the deadline.
  std::this_thread::sleep_for(std::chrono::milliseconds(400));
  worker->set("after-the-deadline", {'y'});
  CHECK(chief.get("after-the-deadline") == std::vector<char>{'y'});
}

TEST_CASE("tcp store: a job's workers meet while 1000 idle or slow connections are open",
          "[cpu][collectives][store]") {
  // 1000 connections opened first (every tenth stopping in its hello), 300 more while the
  // workers connect: the job's 4 workers, with their token, all meet within their timeout.
  if (!allow_descriptors(4096)) {
    WARN("skipped: RLIMIT_NOFILE's hard limit is below the 4096 descriptors this test opens");
    return;
  }
  const int port = free_port();
  TcpStoreOptions o = options(port, 0, 4);
  o.token = "s3cret";
  o.timeout = std::chrono::milliseconds(10'000);
  size_t kept = 64;  // connections not introduced the store keeps, from one address
  SECTION("the limit per address makes room") {}
  SECTION("the limit in all makes room") {
    o.max_pending_per_address = 100'000;
    o.max_pending = kept = 100;
  }
  TcpStore chief(o);
  auto open_connections = [&](std::vector<std::unique_ptr<RawClient>>& into, int count) {
    for (int i = 0; i < count; ++i) {
      into.push_back(std::make_unique<RawClient>(port));
      if (i % 10 == 0) into.back()->send(partial_hello(port, 4, 30));
    }
  };
  std::vector<std::unique_ptr<RawClient>> idle, more;
  open_connections(idle, 1000);
  std::thread flood([&] { open_connections(more, 300); });
  std::vector<std::string> failures(4);
  std::vector<uint64_t> nonces(4, 0);
  std::vector<std::thread> workers;
  for (int rank = 1; rank < 4; ++rank) {
    workers.emplace_back([&, rank] {
      try {
        TcpStoreOptions w = options(port, rank, 4);
        w.token = "s3cret";
        w.timeout = std::chrono::milliseconds(10'000);
        TcpStore store(w);
        nonces[static_cast<size_t>(rank)] = store.job_nonce();
        store.set("worker-" + std::to_string(rank), {static_cast<char>('0' + rank)});
        store.wait({"go"}, w.timeout);
      } catch (const std::exception& e) {
        failures[static_cast<size_t>(rank)] = e.what();
      }
    });
  }
  bool met = false;
  try {
    chief.wait({"worker-1", "worker-2", "worker-3"}, std::chrono::milliseconds(10'000));
    met = true;
    chief.set("go", {'1'});
  } catch (const std::exception& e) {
    failures[0] = e.what();
  }
  for (auto& t : workers) t.join();
  flood.join();
  CHECK(met);
  for (const std::string& failure : failures) CHECK(failure == "");
  for (int rank = 1; rank < 4; ++rank)
    CHECK(nonces[static_cast<size_t>(rank)] == chief.job_nonce());
  // The store kept no more than its limit of them: the others were closed, oldest first.
  int still_open = 0;
  CHECK(eventually([&] {
    still_open = 0;
    for (auto& c : idle) still_open += !c->closed_by_store(/*timeout_ms=*/0);
    for (auto& c : more) still_open += !c->closed_by_store(/*timeout_ms=*/0);
    return still_open <= static_cast<int>(kept);
  }));
  CHECK(still_open <= static_cast<int>(kept));
}

TEST_CASE("tcp store: a worker whose connection closes without an answer connects again",
          "[cpu][collectives][store]") {
  // Its first connection is closed unanswered (as a chief making room among connections not
  // introduced closes the oldest), then nobody listens for a moment, then the chief starts: the
  // worker keeps trying, backing off, and joins within its timeout.
  const int port = free_port();
  const int squatter = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = htons(static_cast<uint16_t>(port));
  REQUIRE(::bind(squatter, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0);
  REQUIRE(::listen(squatter, 8) == 0);
  std::unique_ptr<TcpStore> chief;
  std::string chief_failure;
  std::thread door([&] {
    const int fd = ::accept(squatter, nullptr, nullptr);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    ::close(fd);
    ::close(squatter);
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    try {
      chief = std::make_unique<TcpStore>(options(port, 0));
    } catch (const std::exception& e) {
      chief_failure = e.what();
    }
  });
  TcpStoreOptions o = options(port, 1);
  o.timeout = std::chrono::milliseconds(5000);
  std::unique_ptr<TcpStore> worker;
  std::string worker_failure;
  try {
    worker = std::make_unique<TcpStore>(o);
  } catch (const std::exception& e) {
    worker_failure = e.what();
  }
  door.join();
  CHECK(chief_failure == "");
  CHECK(worker_failure == "");
  REQUIRE(chief);
  REQUIRE(worker);
  CHECK(worker->job_nonce() == chief->job_nonce());
}

TEST_CASE("tcp store: it listens on the chief's address only, and knows who left",
          "[cpu][collectives][store]") {
  const int port = free_port();
  TcpStore chief(options(port, 0));
  RawClient elsewhere(port, "127.0.0.2");
  CHECK_FALSE(elsewhere.connected());
  CHECK(elsewhere.connect_error() == ECONNREFUSED);
  {
    TcpStore worker(options(port, 1));
    CHECK(chief.departed().empty());
  }
  std::vector<std::pair<int, double>> gone;
  CHECK(eventually([&] { return !(gone = chief.departed()).empty(); }));
  REQUIRE(gone.size() == 1);
  CHECK(gone[0].first == 1);
  CHECK(gone[0].second < 2.0);
}
