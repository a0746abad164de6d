// run_ranks: the ranks of an in-process group as threads of a test, with each rank's exception
// handed back to the test thread. Header-only.
#pragma once

#include <exception>
#include <string>
#include <thread>
#include <vector>

#include "tandem/collectives/in_process.h"

namespace tandem::testing {

/// Runs fn(rank, communicator) on one thread per rank; returns each rank's exception (or null).
/// Catch2 v2 assertions are not thread safe: rank functions record, the test thread checks.
template <typename Fn>
std::vector<std::exception_ptr> run_ranks(collectives::InProcessRendezvous& group, Fn fn) {
  std::vector<std::exception_ptr> errors(static_cast<size_t>(group.size()));
  std::vector<std::thread> threads;
  for (int r = 0; r < group.size(); ++r) {
    threads.emplace_back([&, r] {
      try {
        fn(r, group.communicator(r));
      } catch (...) {
        errors[static_cast<size_t>(r)] = std::current_exception();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  return errors;
}

/// Rethrows the first rank's exception, if any.
inline void require_no_errors(const std::vector<std::exception_ptr>& errors) {
  for (const std::exception_ptr& e : errors)
    if (e) std::rethrow_exception(e);
}

/// The message of an exception derived from std::exception.
inline std::string message_of(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& x) {
    return x.what();
  }
}

}  // namespace tandem::testing
