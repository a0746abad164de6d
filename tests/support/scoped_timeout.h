// ScopedTimeout: the collective timeout of one test, restored when the test ends. Header-only.
#pragma once

#include <chrono>

#include "tandem/collectives/communicator.h"

namespace tandem::testing {

/// Sets the collective timeout while alive and restores the previous one afterwards (also when
/// the test fails or throws). Not copyable: one restore per set.
class ScopedTimeout {
 public:
  explicit ScopedTimeout(std::chrono::milliseconds timeout)
      : previous_(collectives::set_collective_timeout(timeout)) {}
  ~ScopedTimeout() { collectives::set_collective_timeout(previous_); }
  ScopedTimeout(const ScopedTimeout&) = delete;
  ScopedTimeout& operator=(const ScopedTimeout&) = delete;

 private:
  std::chrono::milliseconds previous_;
};

}  // namespace tandem::testing
