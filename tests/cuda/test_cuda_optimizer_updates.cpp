// [cuda] tests of the fused optimizer updates (ops/optimizer_updates.h): the CUDA kernel against
// the CPU loop for SGD, momentum, Nesterov, Adam and AdamW over several steps, float32 and
// float64, directly and through the optimizers on GPU variables. Without a GPU each test WARNs
// why it was skipped and passes.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <string>
#include <vector>

#include "tandem/tandem.h"
#include "tandem/tensor/device_runtime.h"

namespace {

using namespace tandem;

bool skip_without_gpu() {
  if (cuda_device_count() > 0) return false;
  WARN("skipped: no GPU (" << cuda_availability().reason << ")");
  return true;
}

#define TANDEM_REQUIRE_GPU()        \
  do {                              \
    if (skip_without_gpu()) return; \
  } while (0)

const Device kGpu = Device::cuda(0);
constexpr double kTolerance = 1e-6;

/// Largest |a - b| / max(1, |b|) over the elements (b on the CPU, a anywhere).
double max_relative_difference(const Tensor& a, const Tensor& b) {
  const std::vector<double> x = a.to(Device::cpu()).to_vector<double>();
  const std::vector<double> y = b.to_vector<double>();
  REQUIRE(x.size() == y.size());
  double worst = 0.0;
  for (size_t i = 0; i < x.size(); ++i)
    worst = std::max(worst, std::abs(x[i] - y[i]) / std::max(1.0, std::abs(y[i])));
  return worst;
}

/// One tensor on the CPU and its copy on the GPU.
struct Pair {
  Tensor cpu, gpu;
};
Pair pair(const Tensor& host) { return {host.clone(), host.to(kGpu)}; }

const std::vector<Shape> kShapes{Shape{1}, Shape{7}, Shape{257, 513}};

}  // namespace

TEST_CASE("CUDA fused optimizer updates match the CPU loop", "[cuda][optim][fused]") {
  TANDEM_REQUIRE_GPU();
  for (DType dtype : {DType::kFloat32, DType::kFloat64}) {
    for (const Shape& shape : kShapes) {
      Generator generator(/*seed=*/5);
      const Tensor w0 = Tensor::uniform(shape, generator, -1.0, 1.0, dtype);
      Pair sgd = pair(w0), momentum_w = pair(w0), nesterov_w = pair(w0), adam_w = pair(w0),
           adamw_w = pair(w0);
      Pair velocity = pair(Tensor::zeros(shape, dtype));
      Pair nesterov_v = pair(Tensor::zeros(shape, dtype));
      Pair m = pair(Tensor::zeros(shape, dtype)), v = pair(Tensor::zeros(shape, dtype));
      Pair mw = pair(Tensor::zeros(shape, dtype)), vw = pair(Tensor::zeros(shape, dtype));
      for (int step = 1; step <= 4; ++step) {
        INFO(dtype << " " << shape << ", step " << step);
        const Pair g = pair(Tensor::uniform(shape, generator, -1.0, 1.0, dtype));
        const ops::AdamStep adam{
            .alpha = 1e-2 * std::sqrt(1.0 - std::pow(0.999, step)) / (1.0 - std::pow(0.9, step)),
            .one_minus_beta_1 = 0.1,
            .one_minus_beta_2 = 1e-3,
            .epsilon = 1e-7};
        ops::AdamStep adamw = adam;
        adamw.weight_decay = 0.05;
        adamw.learning_rate = 1e-2;
        for (Tensor* w : {&sgd.cpu, &sgd.gpu}) {
          const Tensor& grad = w->device().is_cpu() ? g.cpu : g.gpu;
          ops::sgd_update_(*w, grad, 0.1);
        }
        ops::sgd_momentum_update_(momentum_w.cpu, g.cpu, velocity.cpu, 0.1, 0.9, false);
        ops::sgd_momentum_update_(momentum_w.gpu, g.gpu, velocity.gpu, 0.1, 0.9, false);
        ops::sgd_momentum_update_(nesterov_w.cpu, g.cpu, nesterov_v.cpu, 0.1, 0.9, true);
        ops::sgd_momentum_update_(nesterov_w.gpu, g.gpu, nesterov_v.gpu, 0.1, 0.9, true);
        ops::adam_update_(adam_w.cpu, g.cpu, m.cpu, v.cpu, adam);
        ops::adam_update_(adam_w.gpu, g.gpu, m.gpu, v.gpu, adam);
        ops::adam_update_(adamw_w.cpu, g.cpu, mw.cpu, vw.cpu, adamw);
        ops::adam_update_(adamw_w.gpu, g.gpu, mw.gpu, vw.gpu, adamw);
        for (const Pair* p : {&sgd, &momentum_w, &velocity, &nesterov_w, &nesterov_v, &adam_w, &m,
                              &v, &adamw_w, &mw, &vw}) {
          CHECK(max_relative_difference(p->gpu, p->cpu) <= kTolerance);
        }
      }
      // The updates moved the weights.
      CHECK(max_relative_difference(adam_w.cpu, w0) > 0.0);
      CHECK(max_relative_difference(nesterov_w.cpu, w0) > 0.0);
    }
  }
}

TEST_CASE("Adam on GPU variables matches Adam on CPU variables", "[cuda][optim][fused]") {
  TANDEM_REQUIRE_GPU();
  Generator generator(/*seed=*/9);
  const Tensor w0 = Tensor::uniform(Shape{300, 200}, generator, -1.0, 1.0);
  std::vector<Variable> cpu_vars{Variable("w", w0.clone())};
  std::vector<Variable> gpu_vars{Variable("w", w0.to(kGpu))};
  optim::AdamW cpu_opt({.learning_rate = 0.01, .global_clipnorm = 1.0});
  optim::AdamW gpu_opt({.learning_rate = 0.01, .global_clipnorm = 1.0});
  for (int step = 0; step < 5; ++step) {
    const Tensor g = Tensor::uniform(Shape{300, 200}, generator, -1.0, 1.0);
    cpu_opt.apply_gradients({g}, cpu_vars);
    gpu_opt.apply_gradients({g.to(kGpu)}, gpu_vars);
  }
  CHECK(gpu_vars[0].value().device() == kGpu);
  CHECK(max_relative_difference(gpu_vars[0].value(), cpu_vars[0].value()) <= kTolerance);
  CHECK(max_relative_difference(gpu_opt.slot(gpu_vars[0], "v").value(),
                                cpu_opt.slot(cpu_vars[0], "v").value()) <= kTolerance);
  CHECK(max_relative_difference(cpu_vars[0].value(), w0) > 0.0);
}
