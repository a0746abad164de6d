// Keras parity of the layers: Dense forward for every activation and its gradients, Conv2D
// forward (valid/same, strides 1 and 2) and gradients, MaxPool2D forward, against
// tests/fixtures/keras_parity.txt (made by Keras 3; see tests/fixtures/README.md).
#include <catch2/catch.hpp>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "support/keras_fixtures.h"
#include "tandem/autograd/tape.h"
#include "tandem/nn/layers.h"
#include "tandem/ops/ops.h"

namespace td = tandem;
namespace nn = tandem::nn;
using tandem::testing::KerasFixtures;
using tandem::testing::max_abs_error;

namespace {
constexpr double kTolerance = 1e-5;

/// A Dense layer holding the fixture's kernel and bias.
nn::Dense fixture_dense(nn::Activation activation) {
  const KerasFixtures& f = KerasFixtures::get();
  nn::Dense dense(3, activation);
  dense.build({5});
  dense.kernel().assign(f.tensor("dense.kernel"));
  dense.bias().assign(f.tensor("dense.bias"));
  return dense;
}

nn::Conv2D fixture_conv(int64_t stride, nn::Padding padding) {
  const KerasFixtures& f = KerasFixtures::get();
  nn::Conv2D conv(4, 3, stride, padding);
  conv.build({6, 7, 3});
  conv.kernel().assign(f.tensor("conv.kernel"));
  conv.bias().assign(f.tensor("conv.bias"));
  return conv;
}
}  // namespace

TEST_CASE("Keras parity: Dense forward for every activation", "[cpu][nn][keras]") {
  const KerasFixtures& f = KerasFixtures::get();
  const td::Tensor x = f.tensor("dense.x");
  const std::pair<const char*, nn::Activation> cases[] = {
      {"dense.y_linear", nn::Activation::kNone},     {"dense.y_relu", nn::Activation::kRelu},
      {"dense.y_sigmoid", nn::Activation::kSigmoid}, {"dense.y_tanh", nn::Activation::kTanh},
      {"dense.y_gelu", nn::Activation::kGelu},       {"dense.y_softmax", nn::Activation::kSoftmax}};
  for (const auto& [record, activation] : cases) {
    CAPTURE(record);
    const double error = max_abs_error(fixture_dense(activation)(x), f.tensor(record));
    CHECK(error <= kTolerance);
  }
  // Keras' approximate GELU (the tanh form), through the op the activation uses.
  const td::Tensor linear = fixture_dense(nn::Activation::kNone)(x);
  CHECK(max_abs_error(td::ops::gelu(linear, /*approximate=*/true), f.tensor("dense.y_gelu_tanh")) <=
        kTolerance);
}

TEST_CASE("Keras parity: Dense gradients", "[cpu][nn][keras]") {
  const KerasFixtures& f = KerasFixtures::get();
  nn::Dense dense = fixture_dense(nn::Activation::kNone);
  const td::Tensor x = f.tensor("dense.x");
  td::GradientTape tape;
  tape.watch(x);
  const td::Tensor loss = td::ops::sum(td::ops::mul(dense(x), f.tensor("dense.upstream")));
  const auto grads = tape.gradient(
      loss,
      std::vector<td::Tensor>{x, dense.kernel().value_untracked(), dense.bias().value_untracked()});
  CHECK(max_abs_error(grads[0], f.tensor("dense.grad_x")) <= kTolerance);
  CHECK(max_abs_error(grads[1], f.tensor("dense.grad_kernel")) <= kTolerance);
  CHECK(max_abs_error(grads[2], f.tensor("dense.grad_bias")) <= kTolerance);
}

TEST_CASE("Keras parity: Conv2D forward", "[cpu][nn][keras]") {
  const KerasFixtures& f = KerasFixtures::get();
  const td::Tensor x = f.tensor("conv.x");
  const std::tuple<const char*, int64_t, nn::Padding> cases[] = {
      {"conv.y_valid_s1", 1, nn::Padding::kValid},
      {"conv.y_same_s1", 1, nn::Padding::kSame},
      {"conv.y_valid_s2", 2, nn::Padding::kValid},
      {"conv.y_same_s2", 2, nn::Padding::kSame}};
  for (const auto& [record, stride, padding] : cases) {
    CAPTURE(record);
    CHECK(max_abs_error(fixture_conv(stride, padding)(x), f.tensor(record)) <= kTolerance);
  }
}

TEST_CASE("Keras parity: MaxPool2D forward", "[cpu][nn][keras]") {
  const KerasFixtures& f = KerasFixtures::get();
  const td::Tensor x = f.tensor("pool.x");
  CHECK(max_abs_error(nn::MaxPool2D(2)(x), f.tensor("pool.y_2x2_valid")) == 0.0);
  CHECK(max_abs_error(nn::MaxPool2D(2, 2, nn::Padding::kSame)(x), f.tensor("pool.y_2x2_same")) ==
        0.0);
  CHECK(max_abs_error(nn::MaxPool2D(3, 1)(x), f.tensor("pool.y_3x3_s1_valid")) == 0.0);
}

TEST_CASE("Keras parity: Conv2D gradients", "[cpu][nn][keras]") {
  const KerasFixtures& f = KerasFixtures::get();
  const td::Tensor x = f.tensor("conv.x");
  const std::tuple<const char*, int64_t, nn::Padding> cases[] = {
      {"same_s1", 1, nn::Padding::kSame}, {"valid_s2", 2, nn::Padding::kValid}};
  for (const auto& [suffix, stride, padding] : cases) {
    const std::string s = suffix;
    CAPTURE(s);
    nn::Conv2D conv = fixture_conv(stride, padding);
    td::GradientTape tape;
    tape.watch(x);
    const td::Tensor loss = td::ops::sum(td::ops::mul(conv(x), f.tensor("conv.upstream_" + s)));
    const auto grads = tape.gradient(
        loss,
        std::vector<td::Tensor>{x, conv.kernel().value_untracked(), conv.bias().value_untracked()});
    CHECK(max_abs_error(grads[0], f.tensor("conv.grad_x_" + s)) <= kTolerance);
    CHECK(max_abs_error(grads[1], f.tensor("conv.grad_kernel_" + s)) <= kTolerance);
    CHECK(max_abs_error(grads[2], f.tensor("conv.grad_bias_" + s)) <= kTolerance);
  }
}
