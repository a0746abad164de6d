// Optimizers: Keras parity for 5 steps of SGD, SGD momentum, Nesterov, Adam and AdamW (and
// their slots), closed-form updates over several steps, slot naming and order, the update
// counter, undefined and mismatched gradients, and global-norm clipping.
#include <catch2/catch.hpp>
#include <cmath>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "support/keras_fixtures.h"
#include "tandem/autograd/variable.h"
#include "tandem/ops/ops.h"
#include "tandem/optim/adam.h"
#include "tandem/optim/clip.h"
#include "tandem/optim/lion.h"
#include "tandem/optim/sgd.h"

namespace td = tandem;
namespace optim = tandem::optim;
using tandem::testing::KerasFixtures;
using tandem::testing::max_abs_error;

namespace {

constexpr double kParityTolerance = 1e-6;

/// Runs 5 fixture steps with `optimizer` on fresh copies of opt.w0 / opt.w1 and compares every
/// step with the records "<kind>.w{0,1}_step{1..5}"; returns the variables.
std::vector<td::Variable> run_fixture_steps(optim::Optimizer& optimizer, const std::string& kind) {
  const KerasFixtures& f = KerasFixtures::get();
  std::vector<td::Variable> vars{td::Variable("w0", f.tensor("opt.w0")),
                                 td::Variable("w1", f.tensor("opt.w1"))};
  for (int step = 0; step < 5; ++step) {
    const std::vector<td::Tensor> grads{f.tensor("opt.g" + std::to_string(step) + "_0"),
                                        f.tensor("opt.g" + std::to_string(step) + "_1")};
    optimizer.apply_gradients(grads, vars);
    for (int i = 0; i < 2; ++i) {
      const std::string record =
          kind + ".w" + std::to_string(i) + "_step" + std::to_string(step + 1);
      CAPTURE(record);
      CHECK(max_abs_error(vars[i].value(), f.tensor(record)) <= kParityTolerance);
    }
  }
  CHECK(optimizer.iterations() == 5);
  return vars;
}

/// Double-precision reference of one optimizer over several steps (the textbook forms).
struct Reference {
  std::vector<double> w, m, v;
};

std::vector<double> values(const td::Variable& v) { return v.value().to_vector<double>(); }

double max_diff(const std::vector<double>& a, const std::vector<double>& b) {
  REQUIRE(a.size() == b.size());
  double worst = 0.0;
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::abs(a[i] - b[i]));
  return worst;
}

td::Tensor gradient_at(int step, int64_t n) {
  std::vector<float> g(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) g[i] = static_cast<float>(std::sin(0.7 * step + 1.3 * i) * 0.5);
  return td::Tensor::from_vector(g);
}

}  // namespace

// ---- Keras parity ------------------------------------------------------------------------------

TEST_CASE("Keras parity: SGD", "[cpu][optim][keras]") {
  optim::SGD sgd({.learning_rate = 0.1});
  run_fixture_steps(sgd, "sgd");
  CHECK(sgd.slot_variables().empty());
}

TEST_CASE("Keras parity: SGD with momentum, and its momentum slot", "[cpu][optim][keras]") {
  optim::SGD sgd({.learning_rate = 0.1, .momentum = 0.9});
  const auto vars = run_fixture_steps(sgd, "sgdm");
  CHECK(max_abs_error(sgd.slot(vars[0], "momentum").value(),
                      KerasFixtures::get().tensor("sgdm.momentum_w0")) <= kParityTolerance);
}

TEST_CASE("Keras parity: SGD with Nesterov momentum", "[cpu][optim][keras]") {
  optim::SGD sgd({.learning_rate = 0.1, .momentum = 0.9, .nesterov = true});
  run_fixture_steps(sgd, "sgdn");
}

TEST_CASE("Keras parity: Adam, and its m and v slots", "[cpu][optim][keras]") {
  optim::Adam adam({.learning_rate = 0.01});
  const auto vars = run_fixture_steps(adam, "adam");
  const KerasFixtures& f = KerasFixtures::get();
  CHECK(max_abs_error(adam.slot(vars[0], "m").value(), f.tensor("adam.m_w0")) <= kParityTolerance);
  CHECK(max_abs_error(adam.slot(vars[0], "v").value(), f.tensor("adam.v_w0")) <= kParityTolerance);
}

TEST_CASE("Keras parity: AdamW", "[cpu][optim][keras]") {
  optim::AdamW adamw({.learning_rate = 0.01, .weight_decay = 0.004});
  run_fixture_steps(adamw, "adamw");
}

TEST_CASE("Keras parity: Lion, with and without weight decay, and its m slot",
          "[cpu][optim][keras]") {
  optim::Lion lion({.learning_rate = 0.01});
  const auto vars = run_fixture_steps(lion, "lion");
  CHECK(max_abs_error(lion.slot(vars[0], "m").value(), KerasFixtures::get().tensor("lion.m_w0")) <=
        kParityTolerance);
  optim::Lion decayed({.learning_rate = 0.01, .weight_decay = 0.05});
  run_fixture_steps(decayed, "lion_wd");
  CHECK(lion.name() == "lion");
  CHECK_THAT(decayed.config_json(),
             Catch::Contains("\"weight_decay\": 0.05") && Catch::Contains("\"beta_2\": 0.99"));
}

TEST_CASE("Lion refuses bad hyper-parameters, naming them", "[cpu][optim]") {
  using Catch::Contains;
  CHECK_THROWS_WITH(optim::Lion({.beta_1 = 0.0}), Contains("beta_1") && Contains("got 0"));
  CHECK_THROWS_WITH(optim::Lion({.beta_2 = 1.5}), Contains("beta_2") && Contains("1.5"));
  CHECK_THROWS_WITH(optim::Lion({.weight_decay = -1.0}), Contains("weight_decay"));
}

// ---- closed forms ------------------------------------------------------------------------------

/// Runs the 5 fixture gradients through an accumulating optimizer and compares the weights
/// after every call with "<kind>.w{0,1}_step{1..5}" (unchanged between updates).
void run_accumulation_fixture(optim::Optimizer& optimizer, const std::string& kind) {
  const KerasFixtures& f = KerasFixtures::get();
  std::vector<td::Variable> vars{td::Variable("w0", f.tensor("opt.w0")),
                                 td::Variable("w1", f.tensor("opt.w1"))};
  const int n = optimizer.gradient_accumulation_steps();
  for (int step = 0; step < 5; ++step) {
    const std::vector<td::Tensor> grads{f.tensor("opt.g" + std::to_string(step) + "_0"),
                                        f.tensor("opt.g" + std::to_string(step) + "_1")};
    optimizer.apply_gradients(grads, vars);
    CHECK(optimizer.iterations() == (step + 1) / n);
    CHECK(optimizer.micro_step() == (step + 1) % n);
    for (int i = 0; i < 2; ++i) {
      const std::string record =
          kind + ".w" + std::to_string(i) + "_step" + std::to_string(step + 1);
      CAPTURE(record);
      CHECK(max_abs_error(vars[i].value(), f.tensor(record)) <= kParityTolerance);
    }
  }
}

TEST_CASE("Keras parity: gradient accumulation (SGD momentum N=2 clipped, Adam N=3)",
          "[cpu][optim][keras][accumulation]") {
  optim::SGD sgd({.learning_rate = 0.1,
                  .momentum = 0.9,
                  .global_clipnorm = 2.0,
                  .gradient_accumulation_steps = 2});
  run_accumulation_fixture(sgd, "sgdm_acc2");
  optim::Adam adam({.learning_rate = 0.01, .gradient_accumulation_steps = 3});
  run_accumulation_fixture(adam, "adam_acc3");
  // The clip norm is active on these gradients: without it the result differs.
  optim::SGD unclipped({.learning_rate = 0.1, .momentum = 0.9, .gradient_accumulation_steps = 2});
  const KerasFixtures& f = KerasFixtures::get();
  td::Variable w0("w0", f.tensor("opt.w0")), w1("w1", f.tensor("opt.w1"));
  for (int step = 0; step < 2; ++step)
    unclipped.apply_gradients({f.tensor("opt.g" + std::to_string(step) + "_0"),
                               f.tensor("opt.g" + std::to_string(step) + "_1")},
                              {w0, w1});
  CHECK(max_abs_error(w0.value(), f.tensor("sgdm_acc2.w0_step2")) > 1e-3);
}

TEST_CASE("Updates equal the closed-form formulas over several steps", "[cpu][optim]") {
  const int64_t n = 7;
  const std::vector<float> w0{0.5f, -0.25f, 1.0f, 0.0f, -1.5f, 0.75f, 2.0f};
  struct Case {
    std::string name;
    std::function<std::unique_ptr<optim::Optimizer>()> make;
    std::function<void(Reference&, const std::vector<double>&, int)> step;
  };
  const double lr = 0.05, mom = 0.8, b1 = 0.85, b2 = 0.99, eps = 1e-6, wd = 0.01;
  const std::vector<Case> cases{
      {"sgd",
       [&] { return std::make_unique<optim::SGD>(optim::SGD::Options{.learning_rate = lr}); },
       [&](Reference& r, const std::vector<double>& g, int) {
         for (int64_t i = 0; i < n; ++i) r.w[i] -= lr * g[i];
       }},
      {"momentum",
       [&] {
         return std::make_unique<optim::SGD>(
             optim::SGD::Options{.learning_rate = lr, .momentum = mom});
       },
       [&](Reference& r, const std::vector<double>& g, int) {
         for (int64_t i = 0; i < n; ++i) {
           r.m[i] = mom * r.m[i] - lr * g[i];
           r.w[i] += r.m[i];
         }
       }},
      {"nesterov",
       [&] {
         return std::make_unique<optim::SGD>(
             optim::SGD::Options{.learning_rate = lr, .momentum = mom, .nesterov = true});
       },
       [&](Reference& r, const std::vector<double>& g, int) {
         for (int64_t i = 0; i < n; ++i) {
           r.m[i] = mom * r.m[i] - lr * g[i];
           r.w[i] += mom * r.m[i] - lr * g[i];
         }
       }},
      {"adam",
       [&] {
         return std::make_unique<optim::Adam>(
             optim::Adam::Options{.learning_rate = lr, .beta_1 = b1, .beta_2 = b2, .epsilon = eps});
       },
       [&](Reference& r, const std::vector<double>& g, int t) {
         for (int64_t i = 0; i < n; ++i) {
           r.m[i] = b1 * r.m[i] + (1 - b1) * g[i];
           r.v[i] = b2 * r.v[i] + (1 - b2) * g[i] * g[i];
           const double m_hat = r.m[i] / (1 - std::pow(b1, t));
           const double v_hat = r.v[i] / (1 - std::pow(b2, t));
           // Keras' epsilon-hat: epsilon is added to sqrt of the uncorrected v.
           r.w[i] -= lr * m_hat / (std::sqrt(v_hat) + eps / std::sqrt(1 - std::pow(b2, t)));
         }
       }},
      {"adamw",
       [&] {
         return std::make_unique<optim::AdamW>(optim::AdamW::Options{
             .learning_rate = lr, .weight_decay = wd, .beta_1 = b1, .beta_2 = b2, .epsilon = eps});
       },
       [&](Reference& r, const std::vector<double>& g, int t) {
         for (int64_t i = 0; i < n; ++i) {
           r.w[i] *= 1 - lr * wd;
           r.m[i] = b1 * r.m[i] + (1 - b1) * g[i];
           r.v[i] = b2 * r.v[i] + (1 - b2) * g[i] * g[i];
           const double alpha = lr * std::sqrt(1 - std::pow(b2, t)) / (1 - std::pow(b1, t));
           r.w[i] -= r.m[i] * alpha / (std::sqrt(r.v[i]) + eps);
         }
       }},
  };
  for (const Case& c : cases) {
    CAPTURE(c.name);
    auto optimizer = c.make();
    td::Variable w("dense/kernel", td::Tensor::from_vector(w0));
    Reference ref{std::vector<double>(w0.begin(), w0.end()), std::vector<double>(n, 0.0),
                  std::vector<double>(n, 0.0)};
    for (int t = 1; t <= 8; ++t) {
      const td::Tensor g = gradient_at(t, n);
      optimizer->apply_gradients({g}, {w});
      c.step(ref, g.to_vector<double>(), t);
      CHECK(max_diff(values(w), ref.w) <= 1e-6);
    }
    if (c.name == "adam" || c.name == "adamw") {
      CHECK(max_diff(values(optimizer->slot(w, "m")), ref.m) <= 1e-6);
      CHECK(max_diff(values(optimizer->slot(w, "v")), ref.v) <= 1e-6);
    } else if (c.name != "sgd") {
      CHECK(max_diff(values(optimizer->slot(w, "momentum")), ref.m) <= 1e-6);
    }
  }
}

TEST_CASE("Keras defaults", "[cpu][optim]") {
  optim::SGD sgd;
  CHECK(sgd.current_learning_rate() == 0.01);
  CHECK(sgd.options().momentum == 0.0);
  CHECK_FALSE(sgd.options().nesterov);
  CHECK_FALSE(sgd.global_clipnorm().has_value());
  optim::Adam adam;
  CHECK(adam.current_learning_rate() == 0.001);
  CHECK(adam.name() == "adam");
  CHECK(adam.config_json() ==
        "{\"name\": \"adam\", \"learning_rate\": 0.001, \"global_clipnorm\": null, "
        "\"gradient_accumulation_steps\": null, "
        "\"weight_decay\": 0, \"beta_1\": 0.9, \"beta_2\": 0.999, \"epsilon\": 1e-07}");
  optim::AdamW adamw;
  CHECK(adamw.name() == "adamw");
  CHECK(adamw.current_learning_rate() == 0.001);
  CHECK_THAT(adamw.config_json(), Catch::Contains("\"weight_decay\": 0.004"));
}

// ---- slots, counter, argument checks -----------------------------------------------------------

TEST_CASE("Slots are named <slot>/<variable> in canonical (Keras interleaved) order",
          "[cpu][optim]") {
  td::Variable kernel("dense/kernel", td::Tensor::zeros({2, 3}));
  td::Variable bias("dense/bias", td::Tensor::zeros({3}));
  optim::Adam adam;
  CHECK(adam.slot_names() == std::vector<std::string>{"m", "v"});
  adam.build({kernel, bias});
  std::vector<std::string> names;
  for (const auto& [name, var] : adam.slot_variables()) {
    names.push_back(name);
    CHECK(var.name() == name);
    CHECK_FALSE(var.trainable());
  }
  CHECK(names == std::vector<std::string>{"m/dense/kernel", "v/dense/kernel", "m/dense/bias",
                                          "v/dense/bias"});
  CHECK(adam.slot(kernel, "v").shape() == td::Shape{2, 3});
  adam.build({kernel});  // idempotent
  CHECK(adam.slot_variables().size() == 4);
  CHECK_THROWS_WITH(adam.slot(kernel, "momentum"), Catch::Contains("m, v"));

  optim::SGD momentum({.momentum = 0.9});
  momentum.apply_gradients({td::Tensor::ones({3})}, {bias});  // slots created lazily
  REQUIRE(momentum.slot_variables().size() == 1);
  CHECK(momentum.slot_variables()[0].first == "momentum/dense/bias");
  CHECK(momentum.iterations_variable().name() == "iteration");
}

TEST_CASE("The update counter counts updates and drives schedules", "[cpu][optim]") {
  td::Variable w("w", td::Tensor::zeros({1}));
  optim::SGD sgd({.learning_rate = optim::schedules::PiecewiseConstant({1, 2}, {1.0, 0.5, 0.25})});
  CHECK(sgd.iterations() == 0);
  std::vector<float> seen;
  for (int i = 0; i < 4; ++i) {
    sgd.apply_gradients({td::Tensor::from_vector<float>({-1})}, {w});
    seen.push_back(w.value().item<float>());
  }
  // Steps 0 and 1 use 1.0, step 2 uses 0.5, step 3 uses 0.25 (Keras passes iterations).
  CHECK(seen == std::vector<float>{1.0f, 2.0f, 2.5f, 2.75f});
  CHECK(sgd.iterations() == 4);
  sgd.set_iterations(1);
  CHECK(sgd.current_learning_rate() == 1.0);
  CHECK_THROWS(sgd.set_iterations(-1));
}

TEST_CASE("Undefined gradients leave their variable unchanged", "[cpu][optim]") {
  td::Variable a("a", td::Tensor::ones({2}));
  td::Variable b("b", td::Tensor::ones({2}));
  optim::Adam adam({.learning_rate = 0.1});
  adam.apply_gradients({td::Tensor(), td::Tensor::ones({2})}, {a, b});
  CHECK(a.value().to_vector<float>() == std::vector<float>{1, 1});
  CHECK(b.value().to_vector<float>()[0] < 1.0f);
  CHECK(adam.iterations() == 1);
  CHECK(adam.slot_variables().size() == 2);  // only b got slots
  CHECK_THROWS_WITH(adam.apply_gradients({td::Tensor(), td::Tensor()}, {a, b}),
                    Catch::Contains("no gradient"));
}

TEST_CASE("Mismatched gradients raise naming the variable", "[cpu][optim]") {
  td::Variable kernel("dense/kernel", td::Tensor::zeros({2, 3}));
  optim::SGD sgd;
  CHECK_THROWS_WITH(
      sgd.apply_gradients({td::Tensor::zeros({3, 2})}, {kernel}),
      Catch::Contains("dense/kernel") && Catch::Contains("[3, 2]") && Catch::Contains("[2, 3]"));
  CHECK_THROWS_WITH(sgd.apply_gradients({td::Tensor::zeros({2, 3}, td::DType::kFloat64)}, {kernel}),
                    Catch::Contains("dense/kernel") && Catch::Contains("float64"));
  CHECK_THROWS_WITH(sgd.apply_gradients({}, {kernel}), Catch::Contains("0 gradients for 1"));
  CHECK(sgd.iterations() == 0);
}

// ---- clipping ----------------------------------------------------------------------------------

TEST_CASE("clip_by_global_norm scales by clip_norm / max(norm, clip_norm)", "[cpu][optim]") {
  const td::Tensor a = td::Tensor::from_vector<float>({3, 0});
  const td::Tensor b = td::Tensor::from_vector<float>({0, 4}, {1, 2});
  CHECK(optim::global_norm({a, td::Tensor(), b}).item<float>() == 5.0f);
  const auto clipped = optim::clip_by_global_norm({a, td::Tensor(), b}, 1.0);
  CHECK(clipped.global_norm.item<float>() == 5.0f);
  REQUIRE(clipped.gradients.size() == 3);
  CHECK_FALSE(clipped.gradients[1].defined());
  CHECK(clipped.gradients[0].to_vector<float>()[0] == Approx(0.6f));
  CHECK(clipped.gradients[2].to_vector<float>()[1] == Approx(0.8f));
  CHECK(clipped.gradients[2].shape() == td::Shape{1, 2});
  const auto unchanged = optim::clip_by_global_norm({a, b}, 10.0);
  CHECK(unchanged.gradients[0].to_vector<float>()[0] == Approx(3.0f));
  CHECK(unchanged.gradients[1].to_vector<float>()[1] == Approx(4.0f));
  const auto bad = optim::clip_by_global_norm(
      {td::Tensor::from_vector<float>({std::numeric_limits<float>::infinity(), 1.0f})}, 1.0);
  CHECK(std::isnan(bad.gradients[0].to_vector<float>()[1]));
  CHECK_THROWS(optim::clip_by_global_norm({a}, 0.0));
}

TEST_CASE("clip_by_global_norm of shards held by different replicas gives the whole one's bits",
          "[cpu][optim]") {
  // A gradient of 20 blocks and a bit, split on block boundaries between two replicas (as
  // optimizer-state sharding splits a large variable), and a small one on the first: the norm's
  // terms are per block in both forms, so each replica's clipped shards are the whole result's.
  constexpr int64_t kB = optim::kNormBlock;
  td::Generator g(11);
  const td::Tensor big = td::Tensor::normal({20 * kB + 100}, g);
  const td::Tensor small = td::Tensor::normal({3, 5}, g);
  const auto whole = optim::clip_by_global_norm({small, big}, 0.5);
  const auto bytes = [](const td::Tensor& t) {
    return std::string(static_cast<const char*>(t.raw_data()), t.nbytes());
  };
  const auto part = [](const td::Tensor& t, int64_t begin, int64_t end) {
    return t.view_as(td::Shape{end - begin}, static_cast<size_t>(begin) * sizeof(float));
  };
  const int64_t cut = 7 * kB, n = big.numel();
  const std::vector<optim::ShardExtent> extents0 = {{.begin = 0, .end = 15, .counted = true},
                                                    {.begin = 0, .end = cut, .counted = true},
                                                    {.begin = cut, .end = n, .counted = false}};
  std::vector<optim::ShardExtent> extents1 = extents0;
  for (optim::ShardExtent& e : extents1) e.counted = !e.counted;
  const std::vector<td::Tensor> held0 = {td::ops::reshape(small, td::Shape{15}), part(big, 0, cut),
                                         td::Tensor()};
  const std::vector<td::Tensor> held1 = {td::Tensor(), td::Tensor(), part(big, cut, n)};
  // The sum across the two replicas: each one's terms, zero where the other holds the shard.
  std::vector<td::Tensor> terms(2);
  const auto record = [&](int r) {
    return [&, r](const td::Tensor& t) {
      terms[static_cast<size_t>(r)] = t.clone();
      return t;
    };
  };
  optim::clip_by_global_norm(held0, extents0, 0.5, record(0), td::DType::kFloat32,
                             td::Device::cpu());
  optim::clip_by_global_norm(held1, extents1, 0.5, record(1), td::DType::kFloat32,
                             td::Device::cpu());
  REQUIRE(terms[0].numel() == 1 + 21);  // the small gradient's one term, the big one's 21
  const td::Tensor sum = terms[0] + terms[1];
  const auto summed = [&](const td::Tensor&) { return sum; };
  const auto on0 = optim::clip_by_global_norm(held0, extents0, 0.5, summed, td::DType::kFloat32,
                                              td::Device::cpu());
  const auto on1 = optim::clip_by_global_norm(held1, extents1, 0.5, summed, td::DType::kFloat32,
                                              td::Device::cpu());
  CHECK(bytes(on0.global_norm) == bytes(whole.global_norm));
  CHECK(bytes(on1.global_norm) == bytes(whole.global_norm));
  CHECK(bytes(on0.gradients[0]) == bytes(whole.gradients[0]));
  CHECK(bytes(on0.gradients[1]) == bytes(part(whole.gradients[1], 0, cut)));
  CHECK(bytes(on1.gradients[2]) == bytes(part(whole.gradients[1], cut, n)));
  CHECK_FALSE(on1.gradients[0].defined());
  // The whole form's terms are the blocks' too: the norm is the square root of their sum.
  std::vector<td::Tensor> block_terms = {
      td::ops::reshape(td::ops::sum(td::ops::square(small)), td::Shape{1})};
  for (int64_t b = 0; b < n; b += kB)
    block_terms.push_back(td::ops::reshape(
        td::ops::sum(td::ops::square(part(big, b, std::min(b + kB, n)))), td::Shape{1}));
  CHECK(bytes(td::ops::sqrt(td::ops::sum(td::ops::concat(block_terms, 0)))) ==
        bytes(optim::global_norm({small, big})));
  CHECK_THROWS_WITH(
      optim::clip_by_global_norm({part(big, 0, 10)}, {{.begin = 5, .end = 15, .counted = true}},
                                 0.5, summed, td::DType::kFloat32, td::Device::cpu()),
      Catch::Contains("not from a block boundary"));
}

TEST_CASE("global_clipnorm clips before the update", "[cpu][optim]") {
  td::Variable a("a", td::Tensor::zeros({2}));
  td::Variable b("b", td::Tensor::zeros({1}));
  optim::SGD sgd({.learning_rate = 1.0, .global_clipnorm = 2.0});
  sgd.apply_gradients({td::Tensor::from_vector<float>({6, 0}), td::Tensor::from_vector<float>({8})},
                      {a, b});
  CHECK(a.value().to_vector<float>()[0] == Approx(-1.2f));
  CHECK(b.value().item<float>() == Approx(-1.6f));
  CHECK_THROWS(optim::SGD({.global_clipnorm = -1.0}));
}

TEST_CASE("accumulation: the last micro-step's gradients are added once, by the sync",
          "[cpu][optim]") {
  // A sync that keeps what the optimizer hands it on micro-step N: the accumulators must not
  // hold that micro-step's gradients yet (a bucketed sync adds them while packing; adding them
  // in the optimizer too was a second addition of every gradient).
  struct KeepingSync final : td::optim::GradientSync {
    std::vector<float> accumulators_seen;
    int replica_id_in_sync_group() const override { return 0; }
    std::vector<td::Tensor> sum_across_replicas(const std::vector<td::Tensor>& g) override {
      return g;
    }
    std::vector<td::Tensor> sum_accumulated(const std::vector<td::Tensor>& gradients,
                                            const std::vector<td::Tensor>& accumulators) override {
      accumulators_seen = accumulators[0].to_vector<float>();
      return GradientSync::sum_accumulated(gradients, accumulators);
    }
  } sync;
  td::Variable w("w", td::Tensor::from_vector<float>({0, 0}), true);
  td::optim::SGD sgd({.learning_rate = 1.0, .gradient_accumulation_steps = 3});
  for (float g : {1.0f, 2.0f, 4.0f})
    sgd.apply_gradients(sync, {td::Tensor::from_vector<float>({g, 2 * g})}, {w});
  CHECK(sync.accumulators_seen == std::vector<float>{3, 6});  // micro-steps 1 and 2 only
  CHECK(sgd.iterations() == 1);
  // The update: the mean of the three micro-steps, (1 + 2 + 4) / 3.
  const std::vector<float> value = w.copy(0).to_vector<float>();
  CHECK(value[0] == Approx(-7.0f / 3));
  CHECK(value[1] == Approx(-14.0f / 3));
}
