// Helpers shared by the ops tests: seeded random inputs, naive reference loops over host
// vectors, and element-by-element closeness checks that report the first mismatch.
#pragma once

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "tandem/tandem.h"

namespace tandem::testing {

/// Uniform in [low, high) from a fresh generator seeded with `seed`.
inline Tensor random_tensor(const Shape& shape, uint64_t seed, DType dtype = DType::kFloat64,
                            double low = -1.0, double high = 1.0) {
  Generator generator(seed);
  return Tensor::uniform(shape, generator, low, high, dtype);
}

inline std::vector<double> values(const Tensor& t) { return t.to_vector<double>(); }

/// Index of the first element with |actual - expected| > atol + rtol * |expected| (NaNs only
/// match NaNs), or -1 when all are close.
inline int64_t first_mismatch(const std::vector<double>& actual,
                              const std::vector<double>& expected, double rtol, double atol) {
  if (actual.size() != expected.size()) return 0;
  for (size_t i = 0; i < actual.size(); ++i) {
    const double a = actual[i], e = expected[i];
    if (std::isnan(a) || std::isnan(e)) {
      if (std::isnan(a) != std::isnan(e)) return static_cast<int64_t>(i);
      continue;
    }
    if (std::abs(a - e) > atol + rtol * std::abs(e)) return static_cast<int64_t>(i);
  }
  return -1;
}

/// Requires `actual` to hold `expected` (row-major) within tolerance; reports the first bad
/// element.
inline void require_close(const Tensor& actual, const std::vector<double>& expected,
                          double rtol = 1e-12, double atol = 1e-12) {
  REQUIRE(actual.numel() == static_cast<int64_t>(expected.size()));
  const std::vector<double> got = values(actual);
  const int64_t bad = first_mismatch(got, expected, rtol, atol);
  INFO("shape " << actual.shape() << ", first mismatch at " << bad << ": got "
                << (bad >= 0 ? got[bad] : 0.0) << ", expected "
                << (bad >= 0 ? expected[bad] : 0.0));
  REQUIRE(bad < 0);
}

inline void require_close(const Tensor& actual, const Tensor& expected, double rtol = 1e-12,
                          double atol = 1e-12) {
  REQUIRE(actual.shape() == expected.shape());
  require_close(actual, values(expected), rtol, atol);
}

/// Row-major index of `index` (a multi-index into out's shape) in a tensor of `shape` that
/// broadcasts to it.
inline int64_t broadcast_offset(const std::vector<int64_t>& index, const Shape& shape) {
  int64_t offset = 0;
  const size_t lead = index.size() - shape.dims().size();
  for (size_t k = 0; k < shape.dims().size(); ++k) {
    const int64_t d = shape.dims()[k];
    offset = offset * d + (d == 1 ? 0 : index[lead + k]);
  }
  return offset;
}

/// The multi-index of flat position `flat` in `shape`.
inline std::vector<int64_t> unravel(int64_t flat, const Shape& shape) {
  std::vector<int64_t> index(shape.dims().size());
  for (size_t k = index.size(); k-- > 0;) {
    index[k] = flat % shape.dims()[k];
    flat /= shape.dims()[k];
  }
  return index;
}

/// out = f(a, b) with numpy broadcasting, element by element on the host.
inline std::vector<double> reference_binary(const Tensor& a, const Tensor& b, const Shape& out,
                                            const std::function<double(double, double)>& f) {
  const std::vector<double> av = values(a), bv = values(b);
  std::vector<double> result(static_cast<size_t>(out.numel()));
  std::vector<int64_t> index(out.dims().size(), 0);
  for (int64_t i = 0; i < out.numel(); ++i) {
    result[i] = f(av[broadcast_offset(index, a.shape())], bv[broadcast_offset(index, b.shape())]);
    for (size_t k = index.size(); k-- > 0 && ++index[k] == out.dims()[k];) index[k] = 0;
  }
  return result;
}

/// y = f(x) element by element on the host.
inline std::vector<double> reference_unary(const Tensor& x,
                                           const std::function<double(double)>& f) {
  std::vector<double> result = values(x);
  for (double& v : result) v = f(v);
  return result;
}

}  // namespace tandem::testing
