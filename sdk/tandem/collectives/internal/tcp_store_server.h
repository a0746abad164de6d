// TcpStoreServer: the chief's side of TcpStore (internal): one thread polls the listening
// sockets and every connection, checks each worker at the door (its job's cluster, its index,
// the token), bounds and times out the connections that have not introduced themselves yet,
// answers requests, drops clients that stall or break the protocol, and remembers which
// workers left.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "tandem/collectives/internal/tcp_store.h"

namespace tandem::collectives {

/// Listening sockets on the chief's TF_CONFIG host and port (every address the host resolves to
/// on this machine; every interface when it names none of them), non-blocking; raises naming
/// `where` when the port is taken or the host does not resolve (tcp_store_listeners.cpp).
std::vector<int> open_store_listeners(const TcpStoreOptions& options, const std::string& where,
                                      int backlog);

class TcpStoreServer {
 public:
  /// Listens on the chief's TF_CONFIG host and port (every address the host resolves to on
  /// this machine; every interface when it names none of them) and starts serving; raises
  /// naming `where` when the port is taken or the host does not resolve.
  TcpStoreServer(const TcpStoreOptions& options, const std::string& where);
  ~TcpStoreServer();
  TcpStoreServer(const TcpStoreServer&) = delete;
  TcpStoreServer& operator=(const TcpStoreServer&) = delete;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace tandem::collectives
