// [cuda] tests of the fused optimizer updates (ops/optimizer_updates.h): the CUDA kernel against
// the CPU loop for SGD, momentum, Nesterov, Adam, AdamW and Lion over several steps, float32 and
// float64, directly and through the optimizers on GPU variables; the batched forms over
// variables of many sizes, and one multi-tensor launch per optimizer step. Without a GPU each
// test WARNs why it was skipped and passes.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <string>
#include <vector>

#include "support/require_gpu.h"
#include "tandem/ops/internal/update_launches.h"
#include "tandem/tandem.h"
#include "tandem/tensor/device_runtime.h"

namespace {

using namespace tandem;

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

TEST_CASE("Lion on GPU variables matches Lion on CPU variables", "[cuda][optim][fused]") {
  TANDEM_REQUIRE_GPU();
  Generator generator(/*seed=*/10);
  const Tensor w0 = Tensor::uniform(Shape{300, 200}, generator, -1.0, 1.0);
  std::vector<Variable> cpu_vars{Variable("w", w0.clone())};
  std::vector<Variable> gpu_vars{Variable("w", w0.to(kGpu))};
  const optim::Lion::Options options{.learning_rate = 0.003, .weight_decay = 0.1};
  optim::Lion cpu_opt(options), gpu_opt(options);
  for (int step = 0; step < 5; ++step) {
    const Tensor g = Tensor::uniform(Shape{300, 200}, generator, -1.0, 1.0);
    cpu_opt.apply_gradients({g}, cpu_vars);
    gpu_opt.apply_gradients({g.to(kGpu)}, gpu_vars);
  }
  CHECK(gpu_vars[0].value().device() == kGpu);
  CHECK(max_relative_difference(gpu_vars[0].value(), cpu_vars[0].value()) <= kTolerance);
  CHECK(max_relative_difference(gpu_opt.slot(gpu_vars[0], "m").value(),
                                cpu_opt.slot(cpu_vars[0], "m").value()) <= kTolerance);
  CHECK(max_relative_difference(cpu_vars[0].value(), w0) > 0.0);
}

namespace {

/// Variables of many sizes in one batch: empty, one element, odd, and around the 65536-element
/// chunk a block of the multi-tensor kernel updates (one chunk exactly, one element more, and
/// several chunks with a partial last one).
const std::vector<Shape> kBatchShapes{Shape{0},     Shape{1},     Shape{7},
                                      Shape{65536}, Shape{65537}, Shape{3, 70001}};

/// Uniform tensors of kBatchShapes, each on the CPU and on the GPU.
std::vector<Pair> random_batch(Generator& generator, DType dtype, double low, double high) {
  std::vector<Pair> out;
  for (const Shape& shape : kBatchShapes)
    out.push_back(pair(Tensor::uniform(shape, generator, low, high, dtype)));
  return out;
}

std::vector<Pair> zeros_batch(DType dtype) {
  std::vector<Pair> out;
  for (const Shape& shape : kBatchShapes) out.push_back(pair(Tensor::zeros(shape, dtype)));
  return out;
}

/// The CPU or the GPU half of each pair (handles sharing their storage).
std::vector<Tensor> side(const std::vector<Pair>& pairs, bool gpu) {
  std::vector<Tensor> out;
  for (const Pair& p : pairs) out.push_back(gpu ? p.gpu : p.cpu);
  return out;
}

}  // namespace

TEST_CASE("CUDA multi-tensor updates match the CPU over a batch of sizes", "[cuda][optim][fused]") {
  TANDEM_REQUIRE_GPU();
  enum class Kind { kSgd, kMomentum, kNesterov, kAdam, kAdamW };
  for (DType dtype : {DType::kFloat32, DType::kFloat64}) {
    for (Kind kind : {Kind::kSgd, Kind::kMomentum, Kind::kNesterov, Kind::kAdam, Kind::kAdamW}) {
      INFO(dtype << ", optimizer " << static_cast<int>(kind));
      Generator generator(/*seed=*/13);
      const std::vector<Pair> w = random_batch(generator, dtype, -1.0, 1.0);
      const std::vector<Pair> m = zeros_batch(dtype), v = zeros_batch(dtype);
      std::vector<Tensor> initial;
      for (const Pair& p : w) initial.push_back(p.cpu.clone());
      for (int step = 1; step <= 4; ++step) {
        const std::vector<Pair> g = random_batch(generator, dtype, -1.0, 1.0);
        const ops::AdamStep adam{
            .alpha = 1e-2 * std::sqrt(1.0 - std::pow(0.999, step)) / (1.0 - std::pow(0.9, step)),
            .one_minus_beta_1 = 0.1,
            .one_minus_beta_2 = 1e-3,
            .epsilon = 1e-7,
            .weight_decay = kind == Kind::kAdamW ? 0.05 : 0.0,
            .learning_rate = 1e-2};
        for (bool gpu : {false, true}) {
          std::vector<Tensor> ws = side(w, gpu), ms = side(m, gpu), vs = side(v, gpu);
          const std::vector<Tensor> gs = side(g, gpu);
          switch (kind) {
            case Kind::kSgd:
              ops::sgd_update_(ws, gs, 0.1);
              break;
            case Kind::kMomentum:
            case Kind::kNesterov:
              ops::sgd_momentum_update_(ws, gs, ms, 0.1, 0.9, kind == Kind::kNesterov);
              break;
            case Kind::kAdam:
            case Kind::kAdamW:
              ops::adam_update_(ws, gs, ms, vs, adam);
              break;
          }
        }
        for (size_t i = 0; i < kBatchShapes.size(); ++i) {
          INFO("step " << step << ", variable " << kBatchShapes[i]);
          CHECK(max_relative_difference(w[i].gpu, w[i].cpu) <= kTolerance);
          CHECK(max_relative_difference(m[i].gpu, m[i].cpu) <= kTolerance);
          CHECK(max_relative_difference(v[i].gpu, v[i].cpu) <= kTolerance);
        }
      }
      for (size_t i = 1; i < kBatchShapes.size(); ++i)
        CHECK(max_relative_difference(w[i].cpu, initial[i]) > 0.0);
    }
  }
}

TEST_CASE("One optimizer step on GPU variables is one update launch", "[cuda][optim][fused]") {
  TANDEM_REQUIRE_GPU();
  Generator generator(/*seed=*/17);
  // An MLP's kernels and biases, and one variable without elements.
  const std::vector<Shape> shapes{Shape{784, 256}, Shape{256}, Shape{256, 128}, Shape{128},
                                  Shape{128, 10},  Shape{10},  Shape{0}};
  auto make = [&] {
    std::vector<Variable> vars;
    for (size_t i = 0; i < shapes.size(); ++i) {
      vars.push_back(Variable(std::string("w").append(std::to_string(i)),
                              Tensor::uniform(shapes[i], generator, -1.0, 1.0).to(kGpu)));
    }
    return vars;
  };
  auto gradients = [&] {
    std::vector<Tensor> grads;
    for (const Shape& shape : shapes)
      grads.push_back(Tensor::uniform(shape, generator, -1.0, 1.0).to(kGpu));
    return grads;
  };
  auto launches_of = [&](optim::Optimizer& optimizer, std::vector<Variable>& vars) {
    const std::vector<Tensor> grads = gradients();
    const uint64_t before = ops::internal::optimizer_update_launches();
    optimizer.apply_gradients(grads, vars);
    return ops::internal::optimizer_update_launches() - before;
  };

  std::vector<Variable> sgd_vars = make(), momentum_vars = make(), adam_vars = make(),
                        adamw_vars = make(), accumulated_vars = make();
  optim::SGD sgd({.learning_rate = 0.1});
  optim::SGD momentum({.learning_rate = 0.1, .momentum = 0.9, .nesterov = true});
  optim::Adam adam({.learning_rate = 1e-3});
  optim::AdamW adamw({.learning_rate = 1e-3, .global_clipnorm = 1.0});
  optim::Adam accumulated({.learning_rate = 1e-3, .gradient_accumulation_steps = 2});
  for (int step = 0; step < 2; ++step) {
    INFO("step " << step + 1);
    CHECK(launches_of(sgd, sgd_vars) == 1);
    CHECK(launches_of(momentum, momentum_vars) == 1);
    CHECK(launches_of(adam, adam_vars) == 1);
    CHECK(launches_of(adamw, adamw_vars) == 1);
    // Accumulation: the first micro-step only adds, the second updates in one launch.
    CHECK(launches_of(accumulated, accumulated_vars) == 0);
    CHECK(launches_of(accumulated, accumulated_vars) == 1);
  }
  CHECK(adam.iterations() == 2);
  CHECK(accumulated.iterations() == 2);
}
