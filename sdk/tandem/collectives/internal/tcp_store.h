// TcpStore: a small key-value store over TCP where the workers of a job started from TF_CONFIG
// meet (the role of PyTorch's TCPStore). The chief serves it at its TF_CONFIG address; every
// worker, the chief included, is a client. Workers may start in any order: a client retries its
// connection until the timeout, and waiting for keys names the workers that never set theirs.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace tandem::collectives {

class TcpStore {
 public:
  /// Connects to the store at host:port (serving it there first when `serve`, on every
  /// interface), retrying until `timeout`; raises naming the address and the last error.
  /// `name_key` turns a key into words for errors ("worker 2 (10.0.0.4:12345)").
  TcpStore(const std::string& host, int port, bool serve, std::chrono::milliseconds timeout,
           std::function<std::string(const std::string&)> name_key);
  ~TcpStore();
  TcpStore(const TcpStore&) = delete;
  TcpStore& operator=(const TcpStore&) = delete;

  void set(const std::string& key, const std::vector<char>& value);
  /// The value of `key`, waiting for it up to the timeout.
  std::vector<char> get(const std::string& key);
  /// Returns once every key is set; raises after `timeout` naming the keys still missing.
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout);
  std::chrono::milliseconds timeout() const { return timeout_; }

 private:
  struct Server;
  /// One request and its reply over the client connection.
  bool request(char op, const std::string& key, const std::vector<char>& value,
               std::vector<char>* reply);

  std::chrono::milliseconds timeout_;
  std::function<std::string(const std::string&)> name_key_;
  std::unique_ptr<Server> server_;
  std::mutex mutex_;  // one request at a time on the connection
  int socket_ = -1;
  std::string where_;  // "host:port", for errors
};

}  // namespace tandem::collectives
