// Finite-difference gradient checks: GradientTape gradients of an op against central
// differences in float64. A non-scalar output is reduced against a fixed random weight,
// sum(f(inputs) * w), so that every output element contributes to the checked gradient.
#pragma once

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <functional>
#include <sstream>
#include <vector>

#include "tandem/tandem.h"

namespace tandem::testing {

using OpFunction = std::function<Tensor(const std::vector<Tensor>&)>;

struct GradcheckOptions {
  double eps = 1e-6;   ///< central-difference step
  double rtol = 1e-6;  ///< relative tolerance
  double atol = 1e-8;  ///< absolute tolerance, for gradients near zero
};

/// Checks the gradient of sum(f(inputs) * w) with respect to every floating-point input
/// (float64 inputs; integer inputs such as labels are passed through unchecked). Each input
/// must be a tensor f can be evaluated on repeatedly with the same result (f must be
/// deterministic: build generators inside f).
inline void check_gradients(const OpFunction& f, const std::vector<Tensor>& inputs,
                            const GradcheckOptions& options = {}) {
  for (const Tensor& x : inputs)
    if (is_floating(x.dtype())) REQUIRE(x.dtype() == DType::kFloat64);

  const Tensor probe = f(inputs);
  REQUIRE(probe.dtype() == DType::kFloat64);
  Generator weight_generator(/*seed=*/0x5eed);
  const Tensor weight = Tensor::normal(probe.shape(), weight_generator, 0.0, 1.0, DType::kFloat64);
  const std::vector<double> w = weight.to_vector<double>();
  auto objective = [&](const std::vector<Tensor>& xs) {
    const std::vector<double> y = f(xs).to_vector<double>();
    double total = 0.0;
    for (size_t i = 0; i < y.size(); ++i) total += y[i] * w[i];
    return total;
  };

  std::vector<Tensor> analytic;
  {
    GradientTape tape;
    for (const Tensor& x : inputs)
      if (is_floating(x.dtype())) tape.watch(x);
    const Tensor loss = ops::sum(ops::mul(f(inputs), weight));
    analytic = tape.gradient(loss, inputs);
  }

  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!is_floating(inputs[i].dtype())) continue;
    INFO("input " << i << " of shape " << inputs[i].shape());
    REQUIRE(analytic[i].defined());
    REQUIRE(analytic[i].shape() == inputs[i].shape());
    const std::vector<double> got = analytic[i].to_vector<double>();
    std::vector<Tensor> xs = inputs;
    xs[i] = inputs[i].clone();
    double* x = xs[i].data<double>();
    std::ostringstream mismatches;
    mismatches.precision(12);
    int failures = 0;
    for (int64_t j = 0; j < inputs[i].numel(); ++j) {
      const double saved = x[j];
      x[j] = saved + options.eps;
      const double up = objective(xs);
      x[j] = saved - options.eps;
      const double down = objective(xs);
      x[j] = saved;
      const double numeric = (up - down) / (2.0 * options.eps);
      const double tolerance =
          options.atol + options.rtol * std::max(std::abs(numeric), std::abs(got[j]));
      if (!(std::abs(numeric - got[j]) <= tolerance) && failures++ < 5)
        mismatches << " [" << j << "] tape " << got[j] << " vs numeric " << numeric << ";";
    }
    INFO(failures << " mismatches:" << mismatches.str());
    REQUIRE(failures == 0);
  }
}

}  // namespace tandem::testing
