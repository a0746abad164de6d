// Finite-difference gradient checks (float64) of every differentiable op, through the tape:
// each op alone, under broadcasting where it broadcasts, and a small network that reuses a
// tensor so gradients accumulate.
#include <catch2/catch.hpp>

#include "ops/gradcheck.h"
#include "ops/ops_testing.h"

using namespace tandem;
using tandem::testing::check_gradients;
using tandem::testing::random_tensor;
using tandem::testing::require_close;
using In = std::vector<Tensor>;

namespace {

/// Uniform float64 input in [low, high), seeded by `seed`.
Tensor input(const Shape& shape, uint64_t seed, double low = -1.0, double high = 1.0) {
  return random_tensor(shape, seed, DType::kFloat64, low, high);
}

}  // namespace

TEST_CASE("gradients of binary ops under broadcasting", "[cpu][ops][grad]") {
  const std::pair<Shape, Shape> shapes[] = {
      {{3, 4}, {3, 4}}, {{3, 4}, {4}}, {{3, 1}, {1, 4}}, {{2, 3, 4}, {3, 1}}, {{}, {2, 3}}};
  for (const auto& [sa, sb] : shapes) {
    INFO("shapes " << sa << " and " << sb);
    const Tensor a = input(sa, 1), b = input(sb, 2, 0.5, 2.0);
    check_gradients([](const In& x) { return ops::add(x[0], x[1]); }, {a, b});
    check_gradients([](const In& x) { return ops::sub(x[0], x[1]); }, {a, b});
    check_gradients([](const In& x) { return ops::mul(x[0], x[1]); }, {a, b});
    check_gradients([](const In& x) { return ops::div(x[0], x[1]); }, {a, b});
    check_gradients([](const In& x) { return ops::maximum(x[0], x[1]); }, {a, input(sb, 3)});
    check_gradients([](const In& x) { return ops::minimum(x[0], x[1]); }, {a, input(sb, 3)});
  }
}

TEST_CASE("gradients of scalar forms and operators", "[cpu][ops][grad]") {
  const Tensor a = input({2, 3}, 4);
  check_gradients([](const In& x) { return ops::add(x[0], 2.5); }, {a});
  check_gradients([](const In& x) { return ops::mul(x[0], -1.5); }, {a});
  check_gradients([](const In& x) { return x[0] / 4.0 - 1.0; }, {a});
  check_gradients([](const In& x) { return 3.0 * -x[0] + x[0] * x[0]; }, {a});
}

TEST_CASE("gradients of unary math and activations", "[cpu][ops][grad]") {
  const Tensor x = input({4, 5}, 5, -2, 2), positive = input({4, 5}, 6, 0.2, 3);
  check_gradients([](const In& v) { return ops::neg(v[0]); }, {x});
  check_gradients([](const In& v) { return ops::abs(v[0]); }, {x});
  check_gradients([](const In& v) { return ops::exp(v[0]); }, {x});
  check_gradients([](const In& v) { return ops::log(v[0]); }, {positive});
  check_gradients([](const In& v) { return ops::log1p(v[0]); }, {input({4, 5}, 7, -0.5, 3)});
  check_gradients([](const In& v) { return ops::sqrt(v[0]); }, {positive});
  check_gradients([](const In& v) { return ops::square(v[0]); }, {x});
  check_gradients([](const In& v) { return ops::pow(v[0], 2.7); }, {positive});
  check_gradients([](const In& v) { return ops::pow(v[0], -1.5); }, {positive});
  check_gradients([](const In& v) { return ops::clip(v[0], -0.7, 0.9); }, {x});
  check_gradients([](const In& v) { return ops::relu(v[0]); }, {x});
  check_gradients([](const In& v) { return ops::sigmoid(v[0]); }, {x});
  check_gradients([](const In& v) { return ops::tanh(v[0]); }, {x});
  check_gradients([](const In& v) { return ops::gelu(v[0]); }, {input({4, 5}, 8, -4, 4)});
  check_gradients([](const In& v) { return ops::gelu(v[0], /*approximate=*/true); },
                  {input({4, 5}, 9, -4, 4)});
}

TEST_CASE("clip passes the gradient only inside [low, high]", "[cpu][ops][grad]") {
  const Tensor x = Tensor::from_vector<double>({-2, -1, 0, 1, 2});
  GradientTape tape;
  tape.watch(x);
  const Tensor g = tape.gradient(ops::clip(x, -1, 1), x);
  require_close(g, {0, 1, 1, 1, 0});
}

TEST_CASE("gradients of softmax and log_softmax", "[cpu][ops][grad]") {
  const Tensor x = input({3, 4, 5}, 10, -2, 2);
  for (const int64_t axis : {-1, 0, 1}) {
    INFO("axis " << axis);
    check_gradients([axis](const In& v) { return ops::softmax(v[0], axis); }, {x});
    check_gradients([axis](const In& v) { return ops::log_softmax(v[0], axis); }, {x});
  }
}

TEST_CASE("gradients of reductions", "[cpu][ops][grad]") {
  const Tensor x = input({3, 4, 5}, 11);
  check_gradients([](const In& v) { return ops::sum(v[0]); }, {x});
  check_gradients([](const In& v) { return ops::mean(v[0]); }, {x});
  check_gradients([](const In& v) { return ops::max(v[0]); }, {x});
  for (const int64_t axis : {0, 1, -1}) {
    for (const bool keepdims : {false, true}) {
      INFO("axis " << axis << " keepdims " << keepdims);
      check_gradients([=](const In& v) { return ops::sum(v[0], axis, keepdims); }, {x});
      check_gradients([=](const In& v) { return ops::mean(v[0], axis, keepdims); }, {x});
      check_gradients([=](const In& v) { return ops::max(v[0], axis, keepdims); }, {x});
    }
  }
  check_gradients([](const In& v) { return ops::sum_to(v[0], {4, 1}); }, {x});
}

TEST_CASE("max routes its gradient to the first maximum", "[cpu][ops][grad]") {
  const Tensor x = Tensor::from_vector<double>({1, 5, 5, 2, 3, 3}, {2, 3});
  GradientTape tape({.persistent = true});
  tape.watch(x);
  require_close(tape.gradient(ops::max(x), x), {0, 1, 0, 0, 0, 0});
  require_close(tape.gradient(ops::max(x, 1), x), {0, 1, 0, 0, 1, 0});
  require_close(tape.gradient(ops::maximum(x, Tensor::full({3}, 3.0, DType::kFloat64)), x),
                {0, 1, 1, 0, 1, 1});  // ties go to the first operand
}

TEST_CASE("gradients of shape ops", "[cpu][ops][grad]") {
  const Tensor x = input({4, 3, 2}, 12);
  check_gradients([](const In& v) { return ops::reshape(v[0], {6, 4}); }, {x});
  check_gradients([](const In& v) { return v[0].reshape({-1}); }, {x});
  check_gradients([](const In& v) { return ops::flatten(v[0]); }, {x});
  check_gradients([](const In& v) { return ops::slice(v[0], 1, 3); }, {x});
  check_gradients([](const In& v) { return v[0].slice(0, 1) * 2.0; }, {x});
  check_gradients([](const In& v) { return ops::transpose(v[0], {2, 0, 1}); }, {x});
  check_gradients([](const In& v) { return ops::transpose(v[0]); }, {input({3, 5}, 13)});
  check_gradients(
      [](const In& v) {
        return ops::concat({v[0], v[1], v[0]});
      },
      {input({2, 3}, 14), input({1, 3}, 15)});
}

TEST_CASE("cast passes gradients between floating types", "[cpu][ops][grad]") {
  const Tensor x = input({2, 3}, 16);
  GradientTape tape;
  tape.watch(x);
  const Tensor y = ops::cast(x, DType::kFloat32) * Tensor::full({2, 3}, 2.0);
  const Tensor g = tape.gradient(ops::sum(y), x);
  REQUIRE(g.dtype() == DType::kFloat64);
  require_close(g, std::vector<double>(6, 2.0));
}

TEST_CASE("gradients of matmul for every transpose combination", "[cpu][ops][grad]") {
  for (const bool ta : {false, true}) {
    for (const bool tb : {false, true}) {
      INFO("transpose_a=" << ta << " transpose_b=" << tb);
      const Tensor a = input(ta ? Shape{4, 3} : Shape{3, 4}, 17);
      const Tensor b = input(tb ? Shape{5, 4} : Shape{4, 5}, 18);
      check_gradients([=](const In& v) { return ops::matmul(v[0], v[1], ta, tb); }, {a, b});
    }
  }
}

TEST_CASE("gradient of sparse_softmax_cross_entropy", "[cpu][ops][grad]") {
  const Tensor logits = input({5, 4}, 19, -3, 3);
  for (const DType label_dtype : {DType::kInt32, DType::kInt64}) {
    const Tensor labels = ops::cast(Tensor::from_vector<int64_t>({3, 0, 1, 1, 2}), label_dtype);
    check_gradients([](const In& v) { return ops::sparse_softmax_cross_entropy(v[0], v[1]); },
                    {logits, labels});
  }
}

TEST_CASE("gradients of conv2d", "[cpu][ops][grad]") {
  const Tensor x = input({2, 5, 6, 2}, 20);
  const Tensor kernel = input({3, 2, 2, 3}, 21);
  for (const ops::Padding padding : {ops::Padding::kValid, ops::Padding::kSame}) {
    for (const int64_t s : {1, 2}) {
      INFO((padding == ops::Padding::kSame ? "SAME" : "VALID") << " stride " << s);
      check_gradients(
          [=](const In& v) {
            return ops::conv2d(v[0], v[1], {s, s}, padding);
          },
          {x, kernel});
    }
  }
  check_gradients(
      [](const In& v) {
        return ops::conv2d(v[0], v[1], {2, 1}, ops::Padding::kSame);
      },
      {x, kernel});
}

TEST_CASE("gradients of max_pool2d", "[cpu][ops][grad]") {
  const Tensor x = input({2, 5, 6, 2}, 22);
  check_gradients([](const In& v) { return ops::max_pool2d(v[0], {2, 2}, {2, 2}); }, {x});
  check_gradients(
      [](const In& v) {
        return ops::max_pool2d(v[0], {2, 2}, {2, 2}, ops::Padding::kSame);
      },
      {x});
  // Overlapping windows send several gradients to one input.
  check_gradients(
      [](const In& v) {
        return ops::max_pool2d(v[0], {3, 3}, {1, 2}, ops::Padding::kSame);
      },
      {x});
}

TEST_CASE("gradients of avg_pool2d", "[cpu][ops][grad]") {
  const Tensor x = input({2, 5, 6, 2}, 23);
  check_gradients([](const In& v) { return ops::avg_pool2d(v[0], {2, 2}, {2, 2}); }, {x});
  // SAME windows at the border average fewer inputs; overlapping windows share inputs.
  check_gradients(
      [](const In& v) {
        return ops::avg_pool2d(v[0], {3, 3}, {1, 2}, ops::Padding::kSame);
      },
      {x});
  check_gradients(
      [](const In& v) {
        return ops::avg_pool2d(v[0], {2, 3}, {2, 1}, ops::Padding::kSame);
      },
      {x});
}

TEST_CASE("gradients of batch_norm (training mode) for x, gamma and beta", "[cpu][ops][grad]") {
  const Tensor x = input({37, 5}, 25, -2.0, 3.0);
  const Tensor gamma = input({5}, 26, 0.5, 1.5), beta = input({5}, 27);
  check_gradients(
      [](const In& v) {
        Tensor mean, variance;
        return ops::batch_norm(v[0], v[1], v[2], 1e-3, mean, variance);
      },
      {x, gamma, beta});
  // Without scale and center.
  check_gradients(
      [](const In& v) {
        Tensor mean, variance;
        return ops::batch_norm(v[0], Tensor(), Tensor(), 1e-3, mean, variance);
      },
      {x});
  // With its ReLU (beta shifts the outputs so that some are cut).
  check_gradients(
      [](const In& v) {
        Tensor mean, variance;
        return ops::batch_norm(v[0], v[1], v[2], 1e-3, mean, variance, /*relu=*/true);
      },
      {x, gamma, beta});
}

TEST_CASE("gradients of layer_norm for x, gamma and beta", "[cpu][ops][grad]") {
  // 70 rows: three blocks of the parameter gradients' partial sums, the last one short.
  const Tensor x = input({70, 6}, 28, -2.0, 3.0);
  const Tensor gamma = input({6}, 29, 0.5, 1.5), beta = input({6}, 30);
  check_gradients([](const In& v) { return ops::layer_norm(v[0], v[1], v[2], 1e-5); },
                  {x, gamma, beta});
  check_gradients([](const In& v) { return ops::layer_norm(v[0], v[1], Tensor(), 1e-5); },
                  {x, gamma});
  check_gradients([](const In& v) { return ops::layer_norm(v[0], Tensor(), Tensor(), 1e-3); }, {x});
}

TEST_CASE("layer_norm's gradients have the same bits for any thread count", "[cpu][ops][grad]") {
  // 700 x 384 float32: past the grain, so two threads split the rows.
  const Tensor x = ops::cast(input({700, 384}, 31, -2.0, 3.0), DType::kFloat32);
  const Tensor gamma = ops::cast(input({384}, 32, 0.5, 1.5), DType::kFloat32);
  const Tensor beta = ops::cast(input({384}, 33), DType::kFloat32);
  const Tensor upstream = ops::cast(input({700, 384}, 34), DType::kFloat32);
  auto run = [&](int threads) {
    const int saved = compute_threads();
    set_compute_threads(threads);
    GradientTape tape;
    tape.watch(x);
    tape.watch(gamma);
    tape.watch(beta);
    const Tensor y = ops::layer_norm(x, gamma, beta, 1e-5);
    std::vector<Tensor> grads = tape.gradient(ops::sum(ops::mul(y, upstream)), {x, gamma, beta});
    grads.insert(grads.begin(), y);
    set_compute_threads(saved);
    std::vector<std::vector<float>> out;
    for (const Tensor& t : grads) out.push_back(t.to_vector<float>());
    return out;
  };
  const auto one = run(1), two = run(2);
  REQUIRE(one == two);
  // And the values are the formula's: row 0 against float64.
  const std::vector<double> xv = ops::cast(x, DType::kFloat64).to_vector<double>();
  double mean = 0, var = 0;
  for (int f = 0; f < 384; ++f) mean += xv[f] / 384.0;
  for (int f = 0; f < 384; ++f) var += (xv[f] - mean) * (xv[f] - mean) / 384.0;
  const std::vector<float> g = gamma.to_vector<float>(), b = beta.to_vector<float>();
  for (int f = 0; f < 384; ++f) {
    const double want = (xv[f] - mean) / std::sqrt(var + 1e-5) * g[f] + b[f];
    REQUIRE(std::abs(one[0][f] - want) <= 1e-5 * (1.0 + std::abs(want)));
  }
}

TEST_CASE("gradient of embedding, with repeated indices", "[cpu][ops][grad]") {
  const Tensor table = input({6, 4}, 24);
  const Tensor indices = Tensor::from_vector(std::vector<int64_t>{5, 1, 5, 0, 3, 5, 1}, Shape{7});
  check_gradients([indices](const In& v) { return ops::embedding(v[0], indices); }, {table});
}

TEST_CASE("gradient of dropout with a fixed generator state", "[cpu][ops][grad]") {
  const Tensor x = input({6, 7}, 23);
  check_gradients(
      [](const In& v) {
        Generator generator(/*seed=*/99, /*stream=*/1);
        return ops::dropout(v[0], 0.4, generator);
      },
      {x});
}

TEST_CASE("gradients through a small network accumulate over reuse", "[cpu][ops][grad]") {
  const Tensor x = input({4, 3}, 24), w1 = input({3, 5}, 25), b1 = input({5}, 26);
  const Tensor w2 = input({5, 3}, 27);
  const Tensor labels = Tensor::from_vector<int64_t>({0, 2, 1, 2});
  check_gradients(
      [&](const In& v) {
        const Tensor h = ops::tanh(ops::matmul(v[0], v[1]) + v[2]);
        // x feeds the logits twice: through the hidden layer and directly.
        const Tensor logits = ops::matmul(h, v[3]) + v[0] * 0.5;
        return ops::mean(ops::sparse_softmax_cross_entropy(logits, labels));
      },
      {x, w1, b1, w2});
}
