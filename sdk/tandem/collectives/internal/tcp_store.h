// TcpStore: the small key-value store over TCP where the workers of a job started from TF_CONFIG
// meet (the role of PyTorch's TCPStore). The chief serves it at the address its TF_CONFIG entry
// names; every worker, the chief included, is a client and keeps its connection for the life of
// the job, so the chief's store also knows which workers have gone.
//
// A job has an identity: a client's first message says which worker it is, which cluster it
// belongs to (a hash of the TF_CONFIG cluster) and, when TANDEM_JOB_TOKEN is set, the token;
// the store refuses another job's workers, a second process claiming a worker's index and a
// wrong token, naming what differs. It answers with the job's nonce, a random number the chief
// drew at start, which every later request carries. Every read and connect has a deadline, keys
// are set once, sizes are bounded, connections that have not introduced themselves are bounded
// per address and in all (the oldest make room) and closed after a deadline, a client retries
// with backoff until the timeout, and a client that breaks the protocol is dropped.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace tandem::collectives {

class TcpStoreServer;

struct TcpStoreOptions {
  std::string host;  ///< the chief's host, as in its TF_CONFIG entry ("[::1]" or "::1" for IPv6)
  int port = 0;
  bool serve = false;  ///< this process is the chief: it serves the store first
  int rank = 0;        ///< this worker's index in the job
  int world_size = 1;  ///< workers in the job
  /// The job's cluster, as the workers describe it ("127.0.0.1:5000, 127.0.0.1:5001"): a
  /// worker whose cluster differs from the chief's is refused, both named.
  std::string cluster;
  /// TANDEM_JOB_TOKEN's value, empty when unset; the chief's and every worker's must match.
  std::string token;
  /// How long a connect, a request or a wait for keys may take (the collective timeout).
  std::chrono::milliseconds timeout{300'000};
  /// "worker 2 (10.0.0.4:12345)", for errors.
  std::function<std::string(int)> describe_worker;
  /// Turns a key into words for errors about keys that never arrived (default: the key).
  std::function<std::string(const std::string&)> describe_key;
  // The chief's door (see Note [the store's door] in tcp_store_server.cpp); tests shorten them.
  /// How long a connection has to introduce itself before the chief closes it (at most the
  /// timeout).
  std::chrono::milliseconds hello_timeout{10'000};
  /// Connections not yet introduced that the chief keeps from one address (an IPv6 /64);
  /// beyond it, that address's oldest is closed.
  size_t max_pending_per_address = 64;
  /// Connections not yet introduced that the chief keeps in all (0: a quarter of its
  /// RLIMIT_NOFILE, within 64..4096); beyond it, the oldest of the busiest address is closed.
  size_t max_pending = 0;
};

class TcpStore {
 public:
  static constexpr size_t kMaxKeyBytes = 1024;
  static constexpr size_t kMaxValueBytes = size_t{1} << 20;
  static constexpr size_t kMaxStoredBytes = size_t{16} << 20;
  static constexpr size_t kMaxKeys = 4096;

  /// Serves the store first when options.serve (on the chief's TF_CONFIG address), then
  /// connects and introduces this worker, retrying the connection until the timeout; raises
  /// naming the address and the cause (nobody there, something else there, refused and why).
  explicit TcpStore(TcpStoreOptions options);
  ~TcpStore();
  TcpStore(const TcpStore&) = delete;
  TcpStore& operator=(const TcpStore&) = delete;

  /// The job's nonce: drawn by the chief, the same in every worker of the job.
  uint64_t job_nonce() const { return nonce_; }
  /// Sets `key` once; a second set of a key (by anyone) raises.
  void set(const std::string& key, const std::vector<char>& value);
  /// The value of `key`, waiting for it up to the timeout.
  std::vector<char> get(const std::string& key);
  /// The value of `key` if it is set now.
  std::optional<std::vector<char>> try_get(const std::string& key);
  /// Returns once every key is set; raises after `timeout` naming the keys still missing.
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout);
  /// Workers whose connection to the chief's store closed after they joined (they ended or
  /// were killed), with the seconds since; raises when the chief's store cannot be reached.
  std::vector<std::pair<int, double>> departed();
  std::chrono::milliseconds timeout() const { return options_.timeout; }
  /// "host:port" of the chief's store.
  const std::string& where() const { return where_; }

 private:
  struct Reply {
    uint8_t status = 0;
    std::string payload;
  };
  void connect_and_introduce();
  /// Says hello on socket_: true with nonce_ set; false when the connection closed without an
  /// answer; raises when refused, not answered by the deadline, or answered by something else.
  bool introduce(std::chrono::steady_clock::time_point deadline);
  Reply request(uint8_t op, const std::string& key, const std::string& value);

  TcpStoreOptions options_;
  std::unique_ptr<TcpStoreServer> server_;
  std::mutex mutex_;  // one request at a time on the connection
  int socket_ = -1;
  uint64_t nonce_ = 0;
  std::string where_;
};

/// "host:port" -> host (IPv6 brackets removed) and port.
std::pair<std::string, int> split_host_port(const std::string& address);

}  // namespace tandem::collectives
