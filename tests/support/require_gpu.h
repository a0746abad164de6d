// [cuda] tests on machines without a GPU: skip_without_gpu and TANDEM_REQUIRE_GPU end a test
// case as passed, with a WARN naming why. Header-only.
#pragma once

#include <catch2/catch.hpp>

#include "tandem/core/device.h"

namespace tandem::testing {

/// True, after a WARN naming the reason, when this machine has no usable GPU.
inline bool skip_without_gpu() {
  if (cuda_device_count() > 0) return false;
  WARN("skipped: no GPU (" << cuda_availability().reason << ")");
  return true;
}

}  // namespace tandem::testing

/// Ends the test case (as passed, with the reason) when there is no GPU.
#define TANDEM_REQUIRE_GPU()                           \
  do {                                                 \
    if (::tandem::testing::skip_without_gpu()) return; \
  } while (0)
