// Gradient checks: central finite differences of a scalar function over a float64 tensor's
// elements, and the largest element-wise difference between two gradients.
#pragma once

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <functional>
#include <vector>

#include "tandem/tensor/tensor.h"

namespace tandem::testing {

/// Central finite differences of f over every element of `x` (float64, perturbed in place).
inline std::vector<double> numeric_gradient(Tensor x, const std::function<double()>& f,
                                            double eps = 1e-6) {
  double* p = x.data<double>();
  std::vector<double> g(static_cast<size_t>(x.numel()));
  for (int64_t i = 0; i < x.numel(); ++i) {
    const double saved = p[i];
    p[i] = saved + eps;
    const double up = f();
    p[i] = saved - eps;
    const double down = f();
    p[i] = saved;
    g[static_cast<size_t>(i)] = (up - down) / (2 * eps);
  }
  return g;
}

/// max_i |a[i] - b[i]| (the sizes must match).
inline double max_diff(const std::vector<double>& a, const std::vector<double>& b) {
  REQUIRE(a.size() == b.size());
  double worst = 0.0;
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::abs(a[i] - b[i]));
  return worst;
}

}  // namespace tandem::testing
