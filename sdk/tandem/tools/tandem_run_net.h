// tandem-run's messages between machines (tandem_run_nodes.h): TCP connections carrying one
// text line per message.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace tandem::run {

/// A listening IPv4 socket on `port` of every interface, or -1 with `error` set.
int listen_on_port(int port, std::string* error);
/// A connection to host:port within `timeout_seconds`, or -1 with `error` set.
int connect_to(const std::string& host, int port, double timeout_seconds, std::string* error);
/// TCP keepalive probes, so that a machine gone without closing its connection (powered off,
/// cut off) is noticed within about 30 s.
void keep_alive(int fd);
/// The IPv4 address this end (or the other end) of a connection has.
std::string local_address(int fd);
std::string peer_address(int fd);
/// `text` cut at each `separator` (empty pieces kept).
std::vector<std::string> split(const std::string& text, char separator);

/// Lines over a connection: sends whole lines, reads what has come without waiting.
class Lines {
 public:
  explicit Lines(int fd = -1) : fd_(fd) {}
  Lines(Lines&& other) noexcept;
  Lines& operator=(Lines&& other) noexcept;
  Lines(const Lines&) = delete;
  Lines& operator=(const Lines&) = delete;
  ~Lines() { close(); }

  int fd() const { return fd_; }
  /// A complete line was read and not yet taken.
  bool buffered() const { return buffer_.find('\n') != std::string::npos; }
  bool open() const { return fd_ >= 0; }
  /// Sends `line` and a newline; false when the connection is gone.
  bool send(const std::string& line);
  /// Reads what has come (the socket is non-blocking); false when the other end closed.
  bool fill();
  /// The next complete line read, if any.
  std::optional<std::string> next();
  void close();

 private:
  int fd_ = -1;
  std::string buffer_;
};

}  // namespace tandem::run
