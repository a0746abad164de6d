// The listening sockets of the chief's store: on the chief's TF_CONFIG address only, or on every
// interface when that address is not one of this machine's (NAT, a Kubernetes service).
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "tandem/collectives/internal/tcp_store_server.h"
#include "tandem/core/error.h"
#include "tandem/core/logging.h"

namespace tandem::collectives {

namespace {

int open_listener(int family, const sockaddr* address, socklen_t length, bool v6_only,
                  int backlog) {
  const int fd = ::socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  const int one = 1, v6 = v6_only ? 1 : 0;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (family == AF_INET6) ::setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &v6, sizeof(v6));
  if (::bind(fd, address, length) != 0 || ::listen(fd, backlog) != 0) {
    const int error = errno;
    ::close(fd);
    errno = error;
    return -1;
  }
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL, 0) | O_NONBLOCK);
  return fd;
}

}  // namespace

std::vector<int> open_store_listeners(const TcpStoreOptions& options, const std::string& where,
                                      int backlog) {
  std::vector<int> listeners;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string port = std::to_string(options.port);
  const int resolved = ::getaddrinfo(options.host.c_str(), port.c_str(), &hints, &found);
  TANDEM_CHECK(resolved == 0, "TF_CONFIG rendezvous: the chief's host \"", options.host,
               "\" does not resolve: ", ::gai_strerror(resolved));
  int in_use = 0, not_here = 0;
  std::string last_error;
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    const int fd =
        open_listener(a->ai_family, a->ai_addr, a->ai_addrlen, /*v6_only=*/true, backlog);
    if (fd >= 0) {
      listeners.push_back(fd);
      continue;
    }
    in_use += errno == EADDRINUSE;
    not_here += errno == EADDRNOTAVAIL;
    last_error = std::strerror(errno);
  }
  ::freeaddrinfo(found);
  if (listeners.empty() && in_use == 0 && not_here > 0) {
    // A name that maps to this machine through a NAT or a service address (Kubernetes): no
    // interface has it, so every interface listens.
    TANDEM_LOG_WARNING("TF_CONFIG rendezvous: the chief's address ", where,
                       " is not an address of this machine; listening on port ", options.port,
                       " of every interface");
    sockaddr_in6 any6{};
    any6.sin6_family = AF_INET6;
    any6.sin6_addr = in6addr_any;
    any6.sin6_port = htons(static_cast<uint16_t>(options.port));
    int fd = open_listener(AF_INET6, reinterpret_cast<sockaddr*>(&any6), sizeof(any6),
                           /*v6_only=*/false, backlog);
    if (fd < 0) {
      sockaddr_in any4{};
      any4.sin_family = AF_INET;
      any4.sin_addr.s_addr = htonl(INADDR_ANY);
      any4.sin_port = htons(static_cast<uint16_t>(options.port));
      fd = open_listener(AF_INET, reinterpret_cast<sockaddr*>(&any4), sizeof(any4),
                         /*v6_only=*/false, backlog);
    }
    if (fd >= 0) listeners.push_back(fd);
    in_use += fd < 0 && errno == EADDRINUSE;
    if (fd < 0) last_error = std::strerror(errno);
  }
  TANDEM_CHECK(!listeners.empty(), "TF_CONFIG rendezvous: the chief cannot listen on ", where, ": ",
               last_error,
               in_use > 0 ? "; another program (or another job's chief) is using that port" : "");
  return listeners;
}

}  // namespace tandem::collectives
