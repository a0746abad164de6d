// Comparison helpers shared by the tests. Header-only.
#pragma once

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <vector>

namespace tandem::testing {

/// max |a - b| / max |a| over two float32 vectors of the same length.
inline double relative_difference(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  double diff = 0, scale = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, std::abs(static_cast<double>(a[i]) - b[i]));
    scale = std::max(scale, std::abs(static_cast<double>(a[i])));
  }
  return diff / std::max(scale, 1e-30);
}

}  // namespace tandem::testing
