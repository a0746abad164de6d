// BatchNormalization on one replica: Keras's formula and defaults (training: the batch's mean
// and biased variance over every axis but the last; moving statistics with momentum 0.99;
// inference: the moving statistics), its weights' names and order, 16-bit inputs normalized in
// float32, and gradients against central finite differences (float64).
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <functional>
#include <vector>

#include "support/finite_differences.h"
#include "tandem/tandem.h"

namespace td = tandem;
namespace nn = tandem::nn;
using tandem::testing::max_diff;
using tandem::testing::numeric_gradient;

namespace {

td::Tensor random_tensor(const td::Shape& shape, uint64_t seed,
                         td::DType dtype = td::DType::kFloat32) {
  td::Generator g(seed);
  return td::ops::cast(td::Tensor::normal(shape, g), dtype);
}

}  // namespace

TEST_CASE("BatchNormalization: Keras's formula, moving statistics and weights",
          "[cpu][nn][batch_norm]") {
  nn::BatchNormalization bn;
  bn.build({2, 3});  // e.g. [batch, 2, 3]: statistics over batch and the 2 positions
  const std::vector<td::Variable> w = bn.weights();
  REQUIRE(w.size() == 4);
  CHECK(w[0].name() == "batch_normalization/gamma");
  CHECK(w[1].name() == "batch_normalization/beta");
  CHECK(w[2].name() == "batch_normalization/moving_mean");
  CHECK(w[3].name() == "batch_normalization/moving_variance");
  CHECK(bn.trainable_variables().size() == 2);
  CHECK(w[2].synchronization() == td::VariableSynchronization::kOnRead);
  CHECK(w[3].aggregation() == td::VariableAggregation::kMean);
  w[0].assign(td::Tensor::from_vector(std::vector<float>{1.5f, -0.5f, 2.0f}));
  w[1].assign(td::Tensor::from_vector(std::vector<float>{0.1f, 0.2f, -0.3f}));

  const td::Tensor x = random_tensor({4, 2, 3}, 7);
  const std::vector<float> xv = x.to_vector<float>();
  // The reference in double: per feature over the 8 rows.
  std::vector<double> mean(3, 0), var(3, 0);
  for (size_t i = 0; i < xv.size(); ++i) mean[i % 3] += xv[i] / 8.0;
  for (size_t i = 0; i < xv.size(); ++i) var[i % 3] += std::pow(xv[i] - mean[i % 3], 2) / 8.0;
  const std::vector<double> gamma{1.5, -0.5, 2.0}, beta{0.1, 0.2, -0.3};
  const std::vector<float> y = bn(x, /*training=*/true).to_vector<float>();
  for (size_t i = 0; i < xv.size(); ++i) {
    const size_t f = i % 3;
    const double want = gamma[f] * (xv[i] - mean[f]) / std::sqrt(var[f] + 1e-3) + beta[f];
    CHECK(y[i] == Approx(want).epsilon(1e-5).margin(1e-6));
  }
  const std::vector<float> mm = w[2].value().to_vector<float>();
  const std::vector<float> mv = w[3].value().to_vector<float>();
  for (size_t f = 0; f < 3; ++f) {
    CHECK(mm[f] == Approx(0.01 * mean[f]).epsilon(1e-5).margin(1e-7));
    CHECK(mv[f] == Approx(0.99 + 0.01 * var[f]).epsilon(1e-5));
  }
  // Inference: the moving statistics, which it leaves alone.
  const std::vector<float> yi = bn(x, /*training=*/false).to_vector<float>();
  for (size_t i = 0; i < xv.size(); ++i) {
    const size_t f = i % 3;
    const double want = gamma[f] * (xv[i] - mm[f]) / std::sqrt(mv[f] + 1e-3) + beta[f];
    CHECK(yi[i] == Approx(want).epsilon(1e-5).margin(1e-6));
  }
  CHECK(w[2].value().to_vector<float>() == mm);
}

TEST_CASE("BatchNormalization: bfloat16 inputs are normalized in float32",
          "[cpu][nn][batch_norm]") {
  nn::BatchNormalization bn;
  bn.set_dtype_policy("mixed_bfloat16");
  bn.build({5});
  CHECK(bn.weights()[0].dtype() == td::DType::kFloat32);
  const td::Tensor x = random_tensor({16, 5}, 3);
  const td::Tensor y = bn(x, true);
  CHECK(y.dtype() == td::DType::kBFloat16);
  nn::BatchNormalization reference;
  reference.build({5});
  const td::Tensor want =
      reference(td::ops::cast(td::ops::cast(x, td::DType::kBFloat16), td::DType::kFloat32), true);
  CHECK(td::ops::cast(y, td::DType::kFloat32).to_vector<float>() ==
        td::ops::cast(td::ops::cast(want, td::DType::kBFloat16), td::DType::kFloat32)
            .to_vector<float>());
}

TEST_CASE("BatchNormalization gradients match finite differences", "[cpu][nn][batch_norm]") {
  nn::BatchNormalization bn;
  bn.set_dtype(td::DType::kFloat64);
  bn.build({3});
  bn.weights()[0].assign(random_tensor({3}, 21, td::DType::kFloat64));
  bn.weights()[1].assign(random_tensor({3}, 22, td::DType::kFloat64));
  const td::Tensor x = random_tensor({6, 3}, 23, td::DType::kFloat64);
  const td::Tensor upstream = random_tensor({6, 3}, 24, td::DType::kFloat64);
  for (bool training : {true, false}) {
    CAPTURE(training);
    auto loss = [&] { return td::ops::sum(td::ops::mul(bn(x, training), upstream)); };
    td::GradientTape tape;
    tape.watch(x);
    const td::Tensor l = loss();
    const td::Variable gamma = bn.weights()[0], beta = bn.weights()[1];
    const auto grads = tape.gradient(l, {x, gamma.value_untracked(), beta.value_untracked()});
    auto value = [&] {
      const td::autograd::NoRecordGuard no_record;
      return loss().item<double>();
    };
    CHECK(max_diff(grads[0].to_vector<double>(), numeric_gradient(x, value)) < 1e-6);
    CHECK(max_diff(grads[1].to_vector<double>(), numeric_gradient(gamma.value_untracked(), value)) <
          1e-6);
    CHECK(max_diff(grads[2].to_vector<double>(), numeric_gradient(beta.value_untracked(), value)) <
          1e-6);
  }
}

TEST_CASE("BatchNormalization's fused ReLU: the bits of BatchNormalization then Activation",
          "[cpu][nn][batch_norm]") {
  const td::Tensor x = random_tensor({6, 5, 5, 7}, 31);
  // Separate layers called one after the other (no Sequential: nothing fuses), a Sequential of
  // the same two layers (fused by the Sequential), and the activation option.
  auto run = [&](int variant) {
    nn::BatchNormalization bn(
        {.activation = variant == 2 ? nn::Activation::kRelu : nn::Activation::kNone});
    nn::ActivationLayer relu(nn::Activation::kRelu);
    nn::Sequential model({bn, relu});
    nn::Module top = variant == 2 ? nn::Module(bn) : nn::Module(model);
    top.build({5, 5, 7});
    std::vector<td::Variable> trainable = bn.trainable_variables();
    const td::Variable input("x", x);
    std::vector<std::vector<float>> out;
    for (int step = 0; step < 2; ++step) {  // the second step normalizes by new gammas and betas
      td::GradientTape tape;
      const td::Tensor y = variant == 0 ? relu(bn(input.value(), true), true)
                                        : top(input.value(), /*training=*/true);
      const td::Tensor loss = td::ops::sum(td::ops::mul(y, td::ops::add(x, 0.5f)));
      std::vector<td::Variable> wrt = trainable;
      wrt.push_back(input);
      const std::vector<td::Tensor> grads = tape.gradient(loss, wrt);
      out.push_back(y.to_vector<float>());
      for (const td::Tensor& g : grads) out.push_back(g.to_vector<float>());
      for (size_t i = 0; i < trainable.size(); ++i)
        trainable[i].assign(td::ops::sub(trainable[i].value(), td::ops::mul(grads[i], 0.1f)));
    }
    out.push_back(bn.layer().moving_mean().value().to_vector<float>());
    out.push_back(bn.layer().moving_variance().value().to_vector<float>());
    out.push_back(bn(x, /*training=*/false).to_vector<float>());
    return out;
  };
  const auto separate = run(0), sequential = run(1), option = run(2);
  const std::vector<float>& y = separate[0];
  REQUIRE(std::count(y.begin(), y.end(), 0.0f) > 20);  // the ReLU cut outputs
  REQUIRE(sequential == separate);
  // The option's layer is its own model: its inference output has its ReLU too.
  for (size_t i = 0; i + 1 < separate.size(); ++i) REQUIRE(option[i] == separate[i]);
  for (float v : option.back()) REQUIRE(v >= 0.0f);
  REQUIRE_THROWS_WITH(nn::BatchNormalization({.activation = nn::Activation::kSigmoid}),
                      Catch::Contains("kNone or kRelu") && Catch::Contains("sigmoid"));
}

TEST_CASE("LayerNormalization: Keras's formula per example, gradients match finite differences",
          "[cpu][nn][layer_norm]") {
  nn::LayerNormalization ln;
  ln.build({2, 4});
  REQUIRE(ln.weights().size() == 2);
  CHECK(ln.weights()[0].name() == "layer_normalization/gamma");
  CHECK(ln.weights()[1].name() == "layer_normalization/beta");
  ln.weights()[0].assign(td::Tensor::from_vector(std::vector<float>{1.0f, 2.0f, -1.0f, 0.5f}));
  ln.weights()[1].assign(td::Tensor::from_vector(std::vector<float>{0.0f, 0.1f, 0.2f, 0.3f}));
  const td::Tensor x = random_tensor({3, 2, 4}, 9);
  const std::vector<float> xv = x.to_vector<float>(), y = ln(x, true).to_vector<float>();
  const std::vector<double> gamma{1.0, 2.0, -1.0, 0.5}, beta{0.0, 0.1, 0.2, 0.3};
  for (size_t row = 0; row < 6; ++row) {
    double mean = 0, var = 0;
    for (size_t f = 0; f < 4; ++f) mean += xv[row * 4 + f] / 4.0;
    for (size_t f = 0; f < 4; ++f) var += std::pow(xv[row * 4 + f] - mean, 2) / 4.0;
    for (size_t f = 0; f < 4; ++f) {
      const double want = gamma[f] * (xv[row * 4 + f] - mean) / std::sqrt(var + 1e-3) + beta[f];
      CHECK(y[row * 4 + f] == Approx(want).epsilon(1e-5).margin(1e-6));
    }
  }
  CHECK(ln(x, false).to_vector<float>() == y);  // no state: the same in inference

  nn::LayerNormalization ln64;
  ln64.set_dtype(td::DType::kFloat64);
  ln64.build({5});
  ln64.weights()[0].assign(random_tensor({5}, 31, td::DType::kFloat64));
  const td::Tensor x64 = random_tensor({3, 5}, 32, td::DType::kFloat64);
  const td::Tensor upstream = random_tensor({3, 5}, 33, td::DType::kFloat64);
  auto loss = [&] { return td::ops::sum(td::ops::mul(ln64(x64, true), upstream)); };
  td::GradientTape tape;
  tape.watch(x64);
  const auto grads = tape.gradient(loss(), {x64, ln64.weights()[0].value_untracked()});
  auto value = [&] {
    const td::autograd::NoRecordGuard no_record;
    return loss().item<double>();
  };
  CHECK(max_diff(grads[0].to_vector<double>(), numeric_gradient(x64, value)) < 1e-6);
  CHECK(max_diff(grads[1].to_vector<double>(),
                 numeric_gradient(ln64.weights()[0].value_untracked(), value)) < 1e-6);
}

TEST_CASE("GlobalAveragePooling2D and the Activation layer", "[cpu][nn][layer_norm]") {
  nn::GlobalAveragePooling2D gap;
  gap.build({2, 3, 2});
  CHECK(gap.output_shape() == td::Shape{2});
  const td::Tensor x = random_tensor({2, 2, 3, 2}, 41);
  const std::vector<float> xv = x.to_vector<float>(), y = gap(x).to_vector<float>();
  REQUIRE(y.size() == 4);
  for (size_t n = 0; n < 2; ++n)
    for (size_t c = 0; c < 2; ++c) {
      double want = 0;
      for (size_t p = 0; p < 6; ++p) want += xv[n * 12 + p * 2 + c] / 6.0;
      CHECK(y[n * 2 + c] == Approx(want).epsilon(1e-6));
    }
  CHECK_THROWS_WITH(nn::GlobalAveragePooling2D().build({4, 4}),
                    Catch::Contains("needs inputs [batch, height, width, channels]"));
  nn::ActivationLayer relu(nn::Activation::kRelu);
  CHECK(relu.type_name() == "Activation");
  CHECK(relu(x).to_vector<float>() == td::ops::relu(x).to_vector<float>());
}
