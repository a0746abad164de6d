// Reader for tests/fixtures/keras_parity.txt (format in tests/fixtures/README.md) and the
// comparison helpers the Keras parity tests share. Header-only; test targets define
// TANDEM_SOURCE_DIR.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "tandem/core/error.h"
#include "tandem/tensor/tensor.h"

namespace tandem::testing {

/// One record: `<name> <dtype> <rank> <dims...> <values...>`.
struct FixtureRecord {
  std::string name;
  std::string dtype;  // "f32" or "i64"
  std::vector<int64_t> dims;
  std::vector<float> f32;    // values when dtype == "f32" (read with strtof: exact float32)
  std::vector<int64_t> i64;  // values when dtype == "i64"

  /// The record as a CPU tensor (float32 or int64).
  Tensor tensor() const {
    const Shape shape(dims);
    if (dtype == "f32") return Tensor::from_vector(f32, shape);
    return Tensor::from_vector(i64, shape);
  }
};

/// All records of one fixture file, by name.
class KerasFixtures {
 public:
  explicit KerasFixtures(const std::string& path) {
    std::ifstream in(path);
    TANDEM_CHECK(in.good(), "cannot open Keras fixture file ", path);
    std::string line;
    int line_number = 0;
    while (std::getline(in, line)) {
      ++line_number;
      if (line.empty() || line[0] == '#') continue;
      std::istringstream fields(line);
      FixtureRecord r;
      int64_t rank = -1;
      fields >> r.name >> r.dtype >> rank;
      TANDEM_CHECK(fields && rank >= 0 && (r.dtype == "f32" || r.dtype == "i64"), path, ":",
                   line_number, ": malformed record header");
      int64_t numel = 1;
      for (int64_t i = 0; i < rank; ++i) {
        int64_t d = -1;
        fields >> d;
        TANDEM_CHECK(fields && d >= 0, path, ":", line_number, ": bad dimension");
        r.dims.push_back(d);
        numel *= d;
      }
      std::string token;
      while (fields >> token) {
        if (r.dtype == "f32") {
          r.f32.push_back(std::strtof(token.c_str(), nullptr));
        } else {
          r.i64.push_back(std::strtoll(token.c_str(), nullptr, 10));
        }
      }
      const size_t count = r.dtype == "f32" ? r.f32.size() : r.i64.size();
      TANDEM_CHECK(static_cast<int64_t>(count) == numel, path, ":", line_number, ": record ",
                   r.name, " has ", count, " values for ", numel, " elements");
      records_[r.name] = std::move(r);
    }
  }

  /// The fixtures of this source tree, read once.
  static const KerasFixtures& get() {
    static const KerasFixtures fixtures(std::string(TANDEM_SOURCE_DIR) +
                                        "/tests/fixtures/keras_parity.txt");
    return fixtures;
  }

  bool has(const std::string& name) const { return records_.count(name) != 0; }
  const FixtureRecord& record(const std::string& name) const {
    const auto it = records_.find(name);
    TANDEM_CHECK(it != records_.end(), "no Keras fixture record named ", name);
    return it->second;
  }
  Tensor tensor(const std::string& name) const { return record(name).tensor(); }
  size_t size() const { return records_.size(); }

 private:
  std::map<std::string, FixtureRecord> records_;
};

/// max |a - b| over all elements; raises when the shapes differ.
inline double max_abs_error(const Tensor& a, const Tensor& b) {
  TANDEM_CHECK(a.shape() == b.shape(), "max_abs_error: shapes ", a.shape(), " and ", b.shape(),
               " differ");
  const std::vector<double> x = a.to_vector<double>();
  const std::vector<double> y = b.to_vector<double>();
  double worst = 0.0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double d = std::abs(x[i] - y[i]);
    if (std::isnan(d)) return d;
    worst = std::max(worst, d);
  }
  return worst;
}

}  // namespace tandem::testing
