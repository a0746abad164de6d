// Layers against naive reference loops (Dense, Conv2D, MaxPool2D, Flatten, Dropout), Keras
// naming, initialisers and seeding, summary(), and finite-difference gradient checks of Dense
// and Conv2D in float64.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <functional>
#include <limits>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "support/finite_differences.h"
#include "support/keras_fixtures.h"
#include "support/node_recorder.h"
#include "tandem/autograd/tape.h"
#include "tandem/nn/initializers.h"
#include "tandem/nn/layers.h"
#include "tandem/nn/sequential.h"
#include "tandem/ops/ops.h"

namespace td = tandem;
namespace nn = tandem::nn;
using tandem::testing::max_abs_error;

using tandem::testing::max_diff;
using tandem::testing::numeric_gradient;

namespace {

td::Tensor random_tensor(const td::Shape& shape, uint64_t seed,
                         td::DType dtype = td::DType::kFloat32) {
  td::Generator g(seed);
  return td::Tensor::uniform(shape, g, -1.0, 1.0, dtype);
}

double activate(double z, nn::Activation a) {
  switch (a) {
    case nn::Activation::kNone:
      return z;
    case nn::Activation::kRelu:
      return std::max(z, 0.0);
    case nn::Activation::kSigmoid:
      return 1.0 / (1.0 + std::exp(-z));
    case nn::Activation::kTanh:
      return std::tanh(z);
    case nn::Activation::kGelu:
      return 0.5 * z * (1.0 + std::erf(z / std::sqrt(2.0)));
    case nn::Activation::kSoftmax:
      return z;  // handled per row
  }
  return z;
}

/// Applies `a` to rows of length `width` (softmax needs the whole row).
void activate_rows(std::vector<double>& v, int64_t width, nn::Activation a) {
  for (size_t row = 0; row < v.size() / width; ++row) {
    double* r = v.data() + row * width;
    if (a == nn::Activation::kSoftmax) {
      const double m = *std::max_element(r, r + width);
      double s = 0.0;
      for (int64_t j = 0; j < width; ++j) s += std::exp(r[j] - m);
      for (int64_t j = 0; j < width; ++j) r[j] = std::exp(r[j] - m) / s;
    } else {
      for (int64_t j = 0; j < width; ++j) r[j] = activate(r[j], a);
    }
  }
}

/// Naive NHWC convolution (TensorFlow SAME padding) in double.
std::vector<double> naive_conv(const td::Tensor& x, const td::Tensor& w, const td::Tensor& b,
                               int64_t stride, td::ops::Padding padding, int64_t& oh, int64_t& ow) {
  const auto xv = x.to_vector<double>(), wv = w.to_vector<double>(), bv = b.to_vector<double>();
  const int64_t n = x.dim(0), h = x.dim(1), wd = x.dim(2), c = x.dim(3);
  const int64_t kh = w.dim(0), kw = w.dim(1), f = w.dim(3);
  int64_t pad_top = 0, pad_left = 0;
  if (padding == td::ops::Padding::kSame) {
    oh = (h + stride - 1) / stride;
    ow = (wd + stride - 1) / stride;
    pad_top = std::max<int64_t>((oh - 1) * stride + kh - h, 0) / 2;
    pad_left = std::max<int64_t>((ow - 1) * stride + kw - wd, 0) / 2;
  } else {
    oh = (h - kh) / stride + 1;
    ow = (wd - kw) / stride + 1;
  }
  std::vector<double> y(n * oh * ow * f, 0.0);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t r = 0; r < oh; ++r)
      for (int64_t s = 0; s < ow; ++s)
        for (int64_t o = 0; o < f; ++o) {
          double acc = bv[o];
          for (int64_t p = 0; p < kh; ++p)
            for (int64_t q = 0; q < kw; ++q) {
              const int64_t yy = r * stride + p - pad_top, xx = s * stride + q - pad_left;
              if (yy < 0 || yy >= h || xx < 0 || xx >= wd) continue;
              for (int64_t k = 0; k < c; ++k)
                acc += xv[((i * h + yy) * wd + xx) * c + k] * wv[((p * kw + q) * c + k) * f + o];
            }
          y[((i * oh + r) * ow + s) * f + o] = acc;
        }
  return y;
}

}  // namespace

// ---- Dense -------------------------------------------------------------------------------------

TEST_CASE("Dense forward matches a naive reference for every activation", "[cpu][nn]") {
  const td::Tensor x = random_tensor({6, 7}, 1);
  for (auto a : {nn::Activation::kNone, nn::Activation::kRelu, nn::Activation::kSigmoid,
                 nn::Activation::kTanh, nn::Activation::kGelu, nn::Activation::kSoftmax}) {
    CAPTURE(nn::activation_name(a));
    nn::Dense dense(5, a);
    dense.build({7});
    dense.bias().assign(random_tensor({5}, 2));
    const auto xv = x.to_vector<double>(), kv = dense.kernel().value().to_vector<double>(),
               bv = dense.bias().value().to_vector<double>();
    std::vector<double> want(6 * 5);
    for (int i = 0; i < 6; ++i)
      for (int o = 0; o < 5; ++o) {
        double acc = bv[o];
        for (int k = 0; k < 7; ++k) acc += xv[i * 7 + k] * kv[k * 5 + o];
        want[i * 5 + o] = acc;
      }
    activate_rows(want, 5, a);
    const td::Tensor y = dense(x);
    REQUIRE(y.shape() == td::Shape{6, 5});
    CHECK(max_diff(y.to_vector<double>(), want) < 1e-5);
  }
}

TEST_CASE("Dense applies to the last axis of higher-rank inputs, without bias on request",
          "[cpu][nn]") {
  nn::Dense dense(3, nn::Activation::kNone, /*use_bias=*/false);
  const td::Tensor x = random_tensor({2, 4, 5}, 3);
  const td::Tensor y = dense(x);  // builds lazily from [4, 5]
  REQUIRE(y.shape() == td::Shape{2, 4, 3});
  CHECK(dense.weights().size() == 1);
  CHECK_FALSE(dense.bias().defined());
  const td::Tensor flat = td::ops::matmul(x.reshape({8, 5}), dense.kernel().value());
  CHECK(max_abs_error(y.reshape({8, 3}), flat) == 0.0);
  CHECK_THROWS_WITH(dense(random_tensor({2, 6}, 4)),
                    Catch::Contains("dense") && Catch::Contains("[2, 6]"));
}

TEST_CASE("Dense handles an empty batch", "[cpu][nn]") {
  nn::Sequential model({nn::Flatten(), nn::Dense(4, nn::Activation::kRelu), nn::Dense(2)});
  model.build({3, 3});
  const td::Tensor y = model(td::Tensor::zeros({0, 3, 3}));
  CHECK(y.shape() == td::Shape{0, 2});
}

TEST_CASE("Dense runs as one dense node: ReLU is fused, other activations follow it", "[cpu][nn]") {
  const td::Tensor x = random_tensor({4, 6}, 7);
  for (auto [activation, want] :
       {std::pair{nn::Activation::kRelu, std::vector<std::string>{"dense"}},
        std::pair{nn::Activation::kNone, std::vector<std::string>{"dense"}},
        std::pair{nn::Activation::kTanh, std::vector<std::string>{"dense", "tanh"}}}) {
    CAPTURE(nn::activation_name(activation));
    nn::Dense dense(3, activation);
    dense.build({6});
    // Tracks the variables read (not x, a first layer's input): the input gradient is skipped.
    td::testing::NodeRecorder recorder({});
    const td::Tensor y = dense(x);
    CHECK(recorder.ops() == want);
    std::vector<td::Tensor> grads;
    {
      td::ops::NoRecordGuard no_record;
      grads = recorder.backward(0)({td::Tensor::ones_like(y)});
    }
    REQUIRE(grads.size() == 3);
    CHECK_FALSE(grads[0].defined());
    CHECK(grads[1].shape() == td::Shape{6, 3});
    CHECK(grads[2].shape() == td::Shape{3});
  }
}

// ---- Conv2D and MaxPool2D ----------------------------------------------------------------------

TEST_CASE("Conv2D forward matches a naive convolution", "[cpu][nn]") {
  const td::Tensor x = random_tensor({2, 7, 6, 3}, 5);
  for (auto padding : {nn::Padding::kValid, nn::Padding::kSame}) {
    for (int64_t stride : {1, 2}) {
      CAPTURE(padding == nn::Padding::kSame, stride);
      nn::Conv2D conv(4, 3, stride, padding, nn::Activation::kRelu);
      conv.build({7, 6, 3});
      conv.bias().assign(random_tensor({4}, 6));
      int64_t oh = 0, ow = 0;
      std::vector<double> want =
          naive_conv(x, conv.kernel().value(), conv.bias().value(), stride, padding, oh, ow);
      activate_rows(want, 4, nn::Activation::kRelu);
      const td::Tensor y = conv(x);
      REQUIRE(y.shape() == td::Shape{2, oh, ow, 4});
      CHECK(conv.output_shape() == td::Shape{oh, ow, 4});
      CHECK(max_diff(y.to_vector<double>(), want) < 1e-5);
    }
  }
}

TEST_CASE("Conv2D runs as one conv2d node: bias and ReLU are fused, other activations follow it",
          "[cpu][nn]") {
  const td::Tensor x = random_tensor({2, 6, 5, 3}, 8);
  for (auto [activation, want] :
       {std::pair{nn::Activation::kRelu, std::vector<std::string>{"conv2d"}},
        std::pair{nn::Activation::kNone, std::vector<std::string>{"conv2d"}},
        std::pair{nn::Activation::kTanh, std::vector<std::string>{"conv2d", "tanh"}}}) {
    CAPTURE(nn::activation_name(activation));
    nn::Conv2D conv(4, 3, 1, nn::Padding::kSame, activation);
    conv.build({6, 5, 3});
    // Tracks the variables read (not x, a first layer's input): the input gradient is skipped.
    td::testing::NodeRecorder recorder({});
    const td::Tensor y = conv(x);
    CHECK(recorder.ops() == want);
    std::vector<td::Tensor> grads;
    {
      td::ops::NoRecordGuard no_record;
      grads = recorder.backward(0)({td::Tensor::ones_like(y)});
    }
    REQUIRE(grads.size() == 3);
    CHECK_FALSE(grads[0].defined());
    CHECK(grads[1].shape() == td::Shape{3, 3, 3, 4});
    CHECK(grads[2].shape() == td::Shape{4});
  }
}

TEST_CASE("Conv2D takes rectangular kernels and strides and rejects inputs it cannot cover",
          "[cpu][nn]") {
  nn::Conv2D conv(2, {2, 3}, {1, 2});
  conv.build({5, 7, 1});
  CHECK(conv.kernel().shape() == td::Shape{2, 3, 1, 2});
  CHECK(conv.output_shape() == td::Shape{4, 3, 2});
  nn::Conv2D big(2, 5);
  CHECK_THROWS_WITH(big.build({3, 3, 1}), Catch::Contains("does not fit"));
  nn::Conv2D flat(2, 3);
  CHECK_THROWS_WITH(flat.build({9, 9}), Catch::Contains("[height, width, channels]"));
}

TEST_CASE("MaxPool2D forward matches a naive reference", "[cpu][nn]") {
  const td::Tensor x = random_tensor({2, 5, 7, 3}, 7);
  const auto xv = x.to_vector<double>();
  struct Case {
    int64_t pool, stride;
    nn::Padding padding;
  };
  for (const Case& c : {Case{2, 2, nn::Padding::kValid}, Case{2, 2, nn::Padding::kSame},
                        Case{3, 1, nn::Padding::kValid}}) {
    CAPTURE(c.pool, c.stride, c.padding == nn::Padding::kSame);
    nn::MaxPool2D pool(c.pool, c.stride, c.padding);
    const td::Tensor y = pool(x);
    const int64_t oh = y.dim(1), ow = y.dim(2);
    int64_t pad_top = 0, pad_left = 0;
    if (c.padding == nn::Padding::kSame) {
      CHECK(oh == (5 + c.stride - 1) / c.stride);
      pad_top = std::max<int64_t>((oh - 1) * c.stride + c.pool - 5, 0) / 2;
      pad_left = std::max<int64_t>((ow - 1) * c.stride + c.pool - 7, 0) / 2;
    } else {
      CHECK(oh == (5 - c.pool) / c.stride + 1);
    }
    std::vector<double> want;
    for (int64_t i = 0; i < 2; ++i)
      for (int64_t r = 0; r < oh; ++r)
        for (int64_t s = 0; s < ow; ++s)
          for (int64_t k = 0; k < 3; ++k) {
            double m = -std::numeric_limits<double>::infinity();
            for (int64_t p = 0; p < c.pool; ++p)
              for (int64_t q = 0; q < c.pool; ++q) {
                const int64_t yy = r * c.stride + p - pad_top, xx = s * c.stride + q - pad_left;
                if (yy >= 0 && yy < 5 && xx >= 0 && xx < 7)
                  m = std::max(m, xv[((i * 5 + yy) * 7 + xx) * 3 + k]);
              }
            want.push_back(m);
          }
    CHECK(max_diff(y.to_vector<double>(), want) == 0.0);
  }
  CHECK(nn::MaxPool2D().type_name() == "MaxPooling2D");
}

// ---- Flatten and Dropout -----------------------------------------------------------------------

TEST_CASE("Flatten keeps the batch axis and the row-major order", "[cpu][nn]") {
  nn::Flatten flatten;
  const td::Tensor x = random_tensor({3, 2, 4}, 8);
  const td::Tensor y = flatten(x);
  CHECK(y.shape() == td::Shape{3, 8});
  CHECK(y.to_vector<float>() == x.to_vector<float>());
  CHECK(flatten.output_shape() == td::Shape{8});
}

TEST_CASE("Dropout is the identity outside training and inverted dropout while training",
          "[cpu][nn]") {
  nn::Dropout dropout(0.25);
  const td::Tensor x = td::Tensor::ones({64, 64});
  CHECK(dropout(x).to_vector<float>() == x.to_vector<float>());
  const auto y = dropout(x, /*training=*/true).to_vector<float>();
  int64_t kept = 0, other = 0;
  for (float v : y) {
    kept += std::abs(v - 1.0f / 0.75f) < 1e-6f;
    other += v != 0.0f && std::abs(v - 1.0f / 0.75f) >= 1e-6f;
  }
  CHECK(other == 0);  // every element is dropped (0) or kept and scaled by 1 / (1 - rate)
  const double fraction = static_cast<double>(kept) / static_cast<double>(y.size());
  CHECK(fraction == Approx(0.75).margin(0.03));
  // Each call draws a new mask; reseeding replays the stream.
  CHECK(dropout(x, true).to_vector<float>() != y);
  dropout.set_seed(nn::kDefaultSeed);
  CHECK(dropout(x, true).to_vector<float>() == y);
}

TEST_CASE("Dropout streams differ per replica and are shared by a model's layers", "[cpu][nn]") {
  nn::Dropout first(0.5), second(0.5);
  nn::Sequential model({first, second});
  auto& rng = model.generators();
  const td::Tensor x = td::Tensor::ones({1, 256});
  const auto replica0 = model(x, true).to_vector<float>();
  const uint64_t offset0 = rng.local().offset();
  CHECK(offset0 > 0);  // both layers drew from the model's replica-0 stream
  td::set_current_replica_binding({/*replica_id=*/1, /*num_replicas=*/1});
  const auto replica1 = model(x, true).to_vector<float>();
  CHECK(rng.local().stream() == 2);
  td::set_current_replica_binding({0, 1});
  CHECK(replica0 != replica1);
  CHECK(rng.states().size() == 2);
  // Restoring the saved states replays the same masks.
  const auto states = rng.states();
  model.set_seed(99);
  rng.set_states({{nn::kDefaultSeed, 1, 0, 0}});
  CHECK(model(x, true).to_vector<float>() == replica0);
  CHECK(states[0][2] == offset0);
}

// ---- naming, initialisers, seeds ---------------------------------------------------------------

TEST_CASE("Sequential names layers the Keras way and variables <layer>/<weight>", "[cpu][nn]") {
  nn::Sequential model({nn::Conv2D(4, 3), nn::MaxPool2D(), nn::Dropout(0.1), nn::Flatten(),
                        nn::Dense(8), nn::Dense(3)});
  std::vector<std::string> names;
  for (const nn::Module& m : model.layers()) names.push_back(m.name());
  CHECK(names == std::vector<std::string>{"conv2d", "max_pooling2d", "dropout", "flatten", "dense",
                                          "dense_1"});
  CHECK(model.name() == "sequential");
  model.build({8, 8, 1});
  std::vector<std::string> variables;
  for (const td::Variable& v : model.trainable_variables()) variables.push_back(v.name());
  CHECK(variables == std::vector<std::string>{"conv2d/kernel", "conv2d/bias", "dense/kernel",
                                              "dense/bias", "dense_1/kernel", "dense_1/bias"});
  CHECK(model.non_trainable_variables().empty());
  CHECK(model.layer(4).type_name() == "Dense");
  CHECK(model.get_layer("dense_1").as<nn::Dense>().kernel().shape() == td::Shape{8, 3});
  CHECK_THROWS_WITH(model.get_layer("dense_7"), Catch::Contains("dense_1"));
  CHECK_THROWS_WITH(model.layer(1).as<nn::Dense>(), Catch::Contains("MaxPooling2D"));
  CHECK(nn::Dense(3).name() == "dense");  // a standalone layer gets the prefix
}

TEST_CASE("Explicit layer names are kept, must be unique, and fix before build", "[cpu][nn]") {
  nn::Dense logits(10);
  logits.set_name("logits");
  nn::Dense hidden(4);
  nn::Sequential model({hidden, logits});
  CHECK(hidden.name() == "dense");  // the handle aliases the layer in the model
  CHECK(model.layer(1).name() == "logits");
  nn::Dense clash(2);
  clash.set_name("dense");
  CHECK_THROWS_WITH(model.add(clash), Catch::Contains("unique"));
  nn::Dense unnamed(2);
  model.add(unnamed);
  CHECK(unnamed.name() == "dense_1");
  CHECK_THROWS_WITH(model.add(unnamed), Catch::Contains("twice"));
  model.build({3});
  CHECK(logits.kernel().name() == "logits/kernel");
  CHECK_THROWS(logits.set_name("other"));
  CHECK_THROWS_WITH(model.add(nn::Dense(1)), Catch::Contains("before the model is built"));
}

TEST_CASE("Glorot uniform uses Keras fans and a zero bias", "[cpu][nn]") {
  CHECK(nn::compute_fans({784, 256}) == std::pair<int64_t, int64_t>{784, 256});
  CHECK(nn::compute_fans({3, 3, 2, 8}) == std::pair<int64_t, int64_t>{18, 72});
  nn::Dense dense(300);
  dense.build({500});
  const double limit = std::sqrt(6.0 / 800.0);
  const auto k = dense.kernel().value().to_vector<double>();
  double sum = 0, sum_sq = 0, largest = 0;
  for (double v : k) {
    largest = std::max(largest, std::abs(v));
    sum += v;
    sum_sq += v * v;
  }
  CHECK(largest <= limit);
  CHECK(largest > 0.99 * limit);
  const double n = static_cast<double>(k.size());
  CHECK(sum / n == Approx(0.0).margin(0.01 * limit));
  CHECK(std::sqrt(sum_sq / n) == Approx(limit / std::sqrt(3.0)).epsilon(0.01));
  const auto bias = dense.bias().value().to_vector<double>();
  CHECK(std::all_of(bias.begin(), bias.end(), [](double b) { return b == 0.0; }));

  nn::Conv2D conv(8, 3);
  conv.build({10, 10, 2});
  const double conv_limit = std::sqrt(6.0 / (18.0 + 72.0));
  const auto ck = conv.kernel().value().to_vector<double>();
  CHECK(*std::max_element(ck.begin(), ck.end()) <= conv_limit);
  CHECK(*std::max_element(ck.begin(), ck.end()) > 0.8 * conv_limit);
}

TEST_CASE("One seed builds one model, another seed another", "[cpu][nn]") {
  auto make = [](uint64_t seed) {
    nn::Sequential model({nn::Flatten(), nn::Dense(16, nn::Activation::kRelu), nn::Dense(4)});
    model.set_seed(seed);
    model.build({2, 3});
    std::vector<std::vector<float>> values;
    for (const td::Variable& v : model.weights()) values.push_back(v.value().to_vector<float>());
    return values;
  };
  CHECK(make(7) == make(7));
  CHECK(make(7) != make(8));
  // Layers inside one model draw different values (one generator consumed in order).
  nn::Sequential twins({nn::Dense(4), nn::Dense(4)});
  twins.build({4});
  CHECK(twins.layer(0).weights()[0].value().to_vector<float>() !=
        twins.layer(1).weights()[0].value().to_vector<float>());
  // An explicit generator works too, and advances.
  td::Generator g(7, nn::kInitializerStream);
  nn::Dense a(3), b(3);
  a.build({2}, g);
  b.build({2}, g);
  CHECK(a.kernel().value().to_vector<float>() != b.kernel().value().to_vector<float>());
}

TEST_CASE("Building validates shapes and is idempotent", "[cpu][nn]") {
  nn::Dense dense(3);
  dense.build({4});
  const auto before = dense.kernel().value().to_vector<float>();
  dense.build({4});
  CHECK(dense.kernel().value().to_vector<float>() == before);
  CHECK_THROWS_WITH(dense.build({5}), Catch::Contains("[4]") && Catch::Contains("[5]"));
  nn::Sequential model({nn::Flatten(), nn::Dense(2)});
  CHECK_THROWS_WITH(model.output_shape(), Catch::Contains("not built"));
  model.build({2, 2});
  CHECK_THROWS_WITH(model(td::Tensor::zeros({1, 3, 3})),
                    Catch::Contains("flatten") && Catch::Contains("[batch, 2, 2]"));
}

// ---- summary -----------------------------------------------------------------------------------

TEST_CASE("summary() of the 784-256-128-10 MLP shows Keras' parameter counts", "[cpu][nn]") {
  nn::Sequential model({nn::Flatten(), nn::Dense(256, nn::Activation::kRelu),
                        nn::Dense(128, nn::Activation::kRelu), nn::Dense(10)});
  model.build({28, 28});
  CHECK(model.layer(1).count_params() == 200960);
  CHECK(model.layer(2).count_params() == 32896);
  CHECK(model.layer(3).count_params() == 1290);
  CHECK(model.count_params() == 235146);
  const std::string s = model.summary();
  INFO(s);
  CHECK_THAT(s, Catch::Contains("Model: \"sequential\""));
  CHECK_THAT(s, Catch::Contains("Layer (type)") && Catch::Contains("Output Shape") &&
                    Catch::Contains("Param #"));
  CHECK_THAT(s, Catch::Contains("flatten (Flatten)") && Catch::Contains("(None, 784)"));
  CHECK_THAT(s, Catch::Contains("dense (Dense)") && Catch::Contains("(None, 256)") &&
                    Catch::Contains("200,960"));
  CHECK_THAT(s, Catch::Contains("dense_1 (Dense)") && Catch::Contains("32,896"));
  CHECK_THAT(s, Catch::Contains("dense_2 (Dense)") && Catch::Contains("(None, 10)") &&
                    Catch::Contains("1,290"));
  CHECK_THAT(s, Catch::Contains(" Total params: 235,146 (918.54 KB)"));
  CHECK_THAT(s, Catch::Contains(" Trainable params: 235,146 (918.54 KB)"));
  CHECK_THAT(s, Catch::Contains(" Non-trainable params: 0 (0.00 B)"));
  // The Keras row layout: name column 31 wide, shape 22, right-aligned params 13.
  CHECK_THAT(s,
             Catch::Contains("│ dense (Dense)                   │ (None, 256)            │       "
                             "200,960 │"));
  nn::Sequential unbuilt({nn::Dense(2)});
  CHECK_THAT(unbuilt.summary(), Catch::Contains("0 (unbuilt)"));
}

// ---- gradient checks (float64, central differences) --------------------------------------------

TEST_CASE("Dense gradients match finite differences", "[cpu][nn]") {
  for (auto a : {nn::Activation::kNone, nn::Activation::kTanh, nn::Activation::kSoftmax,
                 nn::Activation::kGelu}) {
    CAPTURE(nn::activation_name(a));
    nn::Dense dense(3, a);
    dense.set_dtype(td::DType::kFloat64);
    dense.build({4});
    dense.bias().assign(random_tensor({3}, 11, td::DType::kFloat64));
    const td::Tensor x = random_tensor({5, 4}, 12, td::DType::kFloat64);
    const td::Tensor upstream = random_tensor({5, 3}, 13, td::DType::kFloat64);
    auto loss = [&] { return td::ops::sum(td::ops::mul(dense(x), upstream)); };

    td::GradientTape tape;
    tape.watch(x);
    const td::Tensor l = loss();
    const std::vector<td::Tensor> sources{x, dense.kernel().value_untracked(),
                                          dense.bias().value_untracked()};
    const auto grads = tape.gradient(l, sources);
    auto value = [&] { return loss().item<double>(); };
    CHECK(max_diff(grads[0].to_vector<double>(), numeric_gradient(x, value)) < 1e-7);
    CHECK(max_diff(grads[1].to_vector<double>(),
                   numeric_gradient(dense.kernel().value_untracked(), value)) < 1e-7);
    CHECK(max_diff(grads[2].to_vector<double>(),
                   numeric_gradient(dense.bias().value_untracked(), value)) < 1e-7);
  }
}

TEST_CASE("Conv2D gradients match finite differences", "[cpu][nn]") {
  for (auto padding : {nn::Padding::kValid, nn::Padding::kSame}) {
    for (int64_t stride : {1, 2}) {
      CAPTURE(padding == nn::Padding::kSame, stride);
      nn::Conv2D conv(3, {3, 2}, stride, padding, nn::Activation::kTanh);
      conv.set_dtype(td::DType::kFloat64);
      conv.build({5, 6, 2});
      conv.bias().assign(random_tensor({3}, 21, td::DType::kFloat64));
      const td::Tensor x = random_tensor({2, 5, 6, 2}, 22, td::DType::kFloat64);
      const td::Tensor upstream = random_tensor(
          td::Shape{2, conv.output_shape()[0], conv.output_shape()[1], 3}, 23, td::DType::kFloat64);
      auto loss = [&] { return td::ops::sum(td::ops::mul(conv(x), upstream)); };
      td::GradientTape tape;
      const td::Tensor l = loss();
      const auto grads = tape.gradient(l, conv.trainable_variables());
      auto value = [&] { return loss().item<double>(); };
      CHECK(max_diff(grads[0].to_vector<double>(),
                     numeric_gradient(conv.kernel().value_untracked(), value)) < 1e-7);
      CHECK(max_diff(grads[1].to_vector<double>(),
                     numeric_gradient(conv.bias().value_untracked(), value)) < 1e-7);
    }
  }
}
