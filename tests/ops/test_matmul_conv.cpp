// matmul, conv2d, max_pool2d, avg_pool2d and dropout: forward passes against naive host loops
// (every transpose flag, VALID/SAME padding, strides 1 and 2), Keras parity on the fixture file,
// dropout's use of the generator, and the argument errors.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <limits>

#include "ops/ops_testing.h"
#include "support/keras_fixtures.h"

using namespace tandem;
using tandem::testing::KerasFixtures;
using tandem::testing::max_abs_error;
using tandem::testing::random_tensor;
using tandem::testing::require_close;
using tandem::testing::values;

namespace {

std::vector<double> reference_matmul(const Tensor& a, const Tensor& b, bool ta, bool tb) {
  const std::vector<double> av = values(a), bv = values(b);
  const int64_t m = ta ? a.dim(1) : a.dim(0), k = ta ? a.dim(0) : a.dim(1);
  const int64_t n = tb ? b.dim(0) : b.dim(1);
  std::vector<double> c(static_cast<size_t>(m * n), 0.0);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j)
      for (int64_t p = 0; p < k; ++p)
        c[i * n + j] += (ta ? av[p * m + i] : av[i * k + p]) * (tb ? bv[j * k + p] : bv[p * n + j]);
  return c;
}

struct Window {
  int64_t out, pad;
};

/// Output size and leading padding of one spatial dimension, as TensorFlow.
Window window(int64_t n, int64_t k, int64_t s, ops::Padding padding) {
  if (padding == ops::Padding::kValid) return {(n - k) / s + 1, 0};
  const int64_t out = (n + s - 1) / s;
  return {out, std::max<int64_t>((out - 1) * s + k - n, 0) / 2};
}

std::vector<double> reference_conv2d(const Tensor& x, const Tensor& kernel, int64_t s,
                                     ops::Padding padding) {
  const std::vector<double> xv = values(x), kv = values(kernel);
  const int64_t N = x.dim(0), H = x.dim(1), W = x.dim(2), C = x.dim(3);
  const int64_t KH = kernel.dim(0), KW = kernel.dim(1), F = kernel.dim(3);
  const Window wh = window(H, KH, s, padding), ww = window(W, KW, s, padding);
  std::vector<double> y;
  for (int64_t n = 0; n < N; ++n)
    for (int64_t oh = 0; oh < wh.out; ++oh)
      for (int64_t ow = 0; ow < ww.out; ++ow)
        for (int64_t f = 0; f < F; ++f) {
          double total = 0;
          for (int64_t kh = 0; kh < KH; ++kh)
            for (int64_t kw = 0; kw < KW; ++kw) {
              const int64_t ih = oh * s - wh.pad + kh, iw = ow * s - ww.pad + kw;
              if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
              for (int64_t c = 0; c < C; ++c)
                total += xv[((n * H + ih) * W + iw) * C + c] * kv[((kh * KW + kw) * C + c) * F + f];
            }
          y.push_back(total);
        }
  return y;
}

std::vector<double> reference_max_pool(const Tensor& x, int64_t k, int64_t s,
                                       ops::Padding padding) {
  const std::vector<double> xv = values(x);
  const int64_t N = x.dim(0), H = x.dim(1), W = x.dim(2), C = x.dim(3);
  const Window wh = window(H, k, s, padding), ww = window(W, k, s, padding);
  std::vector<double> y;
  for (int64_t n = 0; n < N; ++n)
    for (int64_t oh = 0; oh < wh.out; ++oh)
      for (int64_t ow = 0; ow < ww.out; ++ow)
        for (int64_t c = 0; c < C; ++c) {
          double best = -std::numeric_limits<double>::infinity();
          for (int64_t kh = 0; kh < k; ++kh)
            for (int64_t kw = 0; kw < k; ++kw) {
              const int64_t ih = oh * s - wh.pad + kh, iw = ow * s - ww.pad + kw;
              if (ih >= 0 && ih < H && iw >= 0 && iw < W)
                best = std::max(best, xv[((n * H + ih) * W + iw) * C + c]);
            }
          y.push_back(best);
        }
  return y;
}

/// Means over the window's inputs inside the image (TensorFlow's SAME divides by their count).
std::vector<double> reference_avg_pool(const Tensor& x, int64_t k, int64_t s,
                                       ops::Padding padding) {
  const std::vector<double> xv = values(x);
  const int64_t N = x.dim(0), H = x.dim(1), W = x.dim(2), C = x.dim(3);
  const Window wh = window(H, k, s, padding), ww = window(W, k, s, padding);
  std::vector<double> y;
  for (int64_t n = 0; n < N; ++n)
    for (int64_t oh = 0; oh < wh.out; ++oh)
      for (int64_t ow = 0; ow < ww.out; ++ow)
        for (int64_t c = 0; c < C; ++c) {
          double sum = 0;
          int count = 0;
          for (int64_t kh = 0; kh < k; ++kh)
            for (int64_t kw = 0; kw < k; ++kw) {
              const int64_t ih = oh * s - wh.pad + kh, iw = ow * s - ww.pad + kw;
              if (ih >= 0 && ih < H && iw >= 0 && iw < W) {
                sum += xv[((n * H + ih) * W + iw) * C + c];
                ++count;
              }
            }
          y.push_back(sum / count);
        }
  return y;
}

const char* padding_name(ops::Padding p) { return p == ops::Padding::kSame ? "SAME" : "VALID"; }

}  // namespace

TEST_CASE("matmul with every transpose combination", "[cpu][ops]") {
  for (const DType dtype : {DType::kFloat32, DType::kFloat64}) {
    for (const bool ta : {false, true}) {
      for (const bool tb : {false, true}) {
        INFO(dtype << " transpose_a=" << ta << " transpose_b=" << tb);
        const int64_t m = 37, k = 29, n = 41;
        const Tensor a = random_tensor(ta ? Shape{k, m} : Shape{m, k}, 41, dtype);
        const Tensor b = random_tensor(tb ? Shape{n, k} : Shape{k, n}, 42, dtype);
        const Tensor c = ops::matmul(a, b, ta, tb);
        REQUIRE(c.shape() == Shape{m, n});
        REQUIRE(c.dtype() == dtype);
        require_close(c, reference_matmul(a, b, ta, tb), dtype == DType::kFloat32 ? 1e-5 : 1e-13,
                      dtype == DType::kFloat32 ? 1e-5 : 1e-13);
      }
    }
  }
  // An empty inner dimension gives zeros.
  require_close(ops::matmul(Tensor::zeros({2, 0}), Tensor::zeros({0, 3})),
                std::vector<double>(6, 0.0));
}

TEST_CASE("matmul errors name both shapes", "[cpu][ops]") {
  const Tensor a = Tensor::ones({2, 3}), b = Tensor::ones({4, 5});
  REQUIRE_THROWS_WITH(ops::matmul(a, b), Catch::Contains("matmul") && Catch::Contains("[2, 3]") &&
                                             Catch::Contains("[4, 5]") &&
                                             Catch::Contains("incompatible"));
  REQUIRE_NOTHROW(ops::matmul(a, Tensor::ones({5, 3}), false, true));
  REQUIRE_THROWS_WITH(ops::matmul(a, Tensor::ones({3})), Catch::Contains("[3]"));
  REQUIRE_THROWS_WITH(ops::matmul(a, Tensor::ones({3, 2}, DType::kFloat64)),
                      Catch::Contains("float32") && Catch::Contains("float64"));
  REQUIRE_THROWS_WITH(
      ops::matmul(Tensor::ones({2, 2}, DType::kInt32), Tensor::ones({2, 2}, DType::kInt32)),
      Catch::Contains("matmul") && Catch::Contains("int32"));
}

TEST_CASE("conv2d matches a direct convolution", "[cpu][ops]") {
  const Tensor x = random_tensor({2, 7, 6, 3}, 43);
  for (const Shape& kernel_shape : {Shape{3, 3, 3, 4}, Shape{2, 3, 3, 5}, Shape{1, 1, 3, 2}}) {
    const Tensor kernel = random_tensor(kernel_shape, 44);
    for (const ops::Padding padding : {ops::Padding::kValid, ops::Padding::kSame}) {
      for (const int64_t s : {1, 2}) {
        INFO("kernel " << kernel_shape << " " << padding_name(padding) << " stride " << s);
        const Tensor y = ops::conv2d(x, kernel, {s, s}, padding);
        const Window wh = window(7, kernel_shape[0], s, padding),
                     ww = window(6, kernel_shape[1], s, padding);
        REQUIRE(y.shape() == Shape{2, wh.out, ww.out, kernel_shape[3]});
        require_close(y, reference_conv2d(x, kernel, s, padding), 1e-13, 1e-13);
        const Tensor y32 = ops::conv2d(ops::cast(x, DType::kFloat32),
                                       ops::cast(kernel, DType::kFloat32), {s, s}, padding);
        require_close(y32, values(y), 1e-5, 1e-5);
      }
    }
  }
  REQUIRE(ops::conv_output_size(7, 3, 2, ops::Padding::kValid) == 3);
  REQUIRE(ops::conv_output_size(7, 3, 2, ops::Padding::kSame) == 4);
  REQUIRE(ops::conv_output_size(6, 5, 1, ops::Padding::kSame) == 6);
  REQUIRE_THROWS_WITH(ops::conv2d(x, Tensor::ones({3, 3, 2, 4}, DType::kFloat64)),
                      Catch::Contains("conv2d") && Catch::Contains("[2, 7, 6, 3]") &&
                          Catch::Contains("[3, 3, 2, 4]"));
  REQUIRE_THROWS_WITH(ops::conv2d(x, Tensor::ones({8, 3, 3, 4}, DType::kFloat64)),
                      Catch::Contains("conv2d") && Catch::Contains("VALID"));
  REQUIRE_THROWS_WITH(ops::conv2d(x, Tensor::ones({3, 3, 3, 4}, DType::kFloat64), {0, 1}),
                      Catch::Contains("strides"));
}

TEST_CASE("max_pool2d matches a direct window maximum", "[cpu][ops]") {
  const Tensor x = random_tensor({2, 7, 6, 3}, 45);
  for (const int64_t k : {2, 3}) {
    for (const int64_t s : {1, 2}) {
      for (const ops::Padding padding : {ops::Padding::kValid, ops::Padding::kSame}) {
        INFO("pool " << k << " stride " << s << " " << padding_name(padding));
        const Tensor y = ops::max_pool2d(x, {k, k}, {s, s}, padding);
        const Window wh = window(7, k, s, padding), ww = window(6, k, s, padding);
        REQUIRE(y.shape() == Shape{2, wh.out, ww.out, 3});
        require_close(y, reference_max_pool(x, k, s, padding), 0, 0);
      }
    }
  }
  REQUIRE_THROWS_WITH(ops::max_pool2d(x, {8, 2}, {1, 1}),
                      Catch::Contains("max_pool2d") && Catch::Contains("VALID"));
  REQUIRE_THROWS_WITH(ops::max_pool2d(Tensor::ones({2, 3}), {2, 2}, {2, 2}),
                      Catch::Contains("max_pool2d") && Catch::Contains("[2, 3]"));
}

TEST_CASE("avg_pool2d matches a direct window mean, counting only inputs inside the image",
          "[cpu][ops]") {
  const Tensor x = random_tensor({2, 7, 6, 3}, 46);
  for (const int64_t k : {2, 3}) {
    for (const int64_t s : {1, 2}) {
      for (const ops::Padding padding : {ops::Padding::kValid, ops::Padding::kSame}) {
        INFO("pool " << k << " stride " << s << " " << padding_name(padding));
        const Tensor y = ops::avg_pool2d(x, {k, k}, {s, s}, padding);
        const Window wh = window(7, k, s, padding), ww = window(6, k, s, padding);
        REQUIRE(y.shape() == Shape{2, wh.out, ww.out, 3});
        require_close(y, reference_avg_pool(x, k, s, padding), 1e-12, 1e-12);
      }
    }
  }
  // A SAME corner window of a 3x3 pool with stride 1 averages 4 inputs, not 9.
  const Tensor ones = Tensor::ones({1, 4, 4, 1}, DType::kFloat64);
  require_close(ops::avg_pool2d(ones, {3, 3}, {1, 1}, ops::Padding::kSame),
                std::vector<double>(16, 1.0), 0, 0);
  // bfloat16 sums in float32 and rounds once: the mean of 4 equal values is that value.
  const Tensor half = Tensor::full({1, 2, 2, 1}, 0.3, DType::kBFloat16);
  const Tensor half_mean = ops::avg_pool2d(half, {2, 2}, {2, 2});
  REQUIRE(half_mean.dtype() == DType::kBFloat16);
  REQUIRE(values(half_mean) == std::vector<double>{values(half)[0]});
  REQUIRE_THROWS_WITH(ops::avg_pool2d(x, {8, 2}, {1, 1}),
                      Catch::Contains("avg_pool2d") && Catch::Contains("VALID"));
  REQUIRE_THROWS_WITH(ops::avg_pool2d(Tensor::ones({2, 3}), {2, 2}, {2, 2}),
                      Catch::Contains("avg_pool2d") && Catch::Contains("[2, 3]"));
}

TEST_CASE("embedding gathers rows, adds repeated rows' gradients, and names a bad index",
          "[cpu][ops]") {
  const Tensor table = random_tensor({5, 3}, 47);
  const std::vector<double> tv = values(table);
  const std::vector<int64_t> picks{4, 0, 4, 2, 4, 1};
  for (const DType index_type : {DType::kInt32, DType::kInt64}) {
    INFO(index_type);
    const Tensor indices = ops::cast(Tensor::from_vector(picks, Shape{2, 3}), index_type);
    const Variable v("table", table);
    GradientTape tape;
    const Tensor y = ops::embedding(v.value(), indices);
    REQUIRE(y.shape() == Shape{2, 3, 3});
    std::vector<double> expected;
    for (const int64_t p : picks)
      for (int64_t c = 0; c < 3; ++c) expected.push_back(tv[static_cast<size_t>(p * 3 + c)]);
    require_close(y, expected, 0, 0);
    // Weights 1..18 on the outputs: row 4 gets three rows of them, row 3 none.
    const Tensor weight =
        ops::cast(ops::add(Tensor::arange(18, DType::kInt64).reshape({2, 3, 3}), int64_t{1}),
                  DType::kFloat64);
    const Tensor grad = tape.gradient(ops::sum(ops::mul(y, weight)), {v})[0];
    REQUIRE(grad.shape() == Shape{5, 3});
    const std::vector<double> g = values(grad);
    const std::vector<double> expected_grad{4,  5, 6, 16, 17,         18,         10,        11,
                                            12, 0, 0, 0,  1 + 7 + 13, 2 + 8 + 14, 3 + 9 + 15};
    REQUIRE(g == expected_grad);
  }
  REQUIRE_THROWS_WITH(ops::embedding(table, Tensor::from_vector(std::vector<int64_t>{1, 5})),
                      Catch::Contains("embedding: row index 5 at index 1 is outside [0, 5)"));
  REQUIRE_THROWS_WITH(ops::embedding(table, Tensor::from_vector(std::vector<int64_t>{-1})),
                      Catch::Contains("row index -1"));
  REQUIRE_THROWS_WITH(ops::embedding(table, ops::cast(table, DType::kFloat32)),
                      Catch::Contains("int32 or int64"));
  // A bfloat16 table gathers exact copies of its rows.
  const Tensor half = ops::cast(table, DType::kBFloat16);
  const Tensor rows = ops::embedding(half, Tensor::from_vector(std::vector<int64_t>{3}));
  REQUIRE(rows.dtype() == DType::kBFloat16);
  const std::vector<double> hv = values(half);
  REQUIRE(values(rows) == std::vector<double>(hv.begin() + 9, hv.begin() + 12));
}

TEST_CASE("batch_norm: the batch's mean and biased variance, the normalized output", "[cpu][ops]") {
  for (const DType dtype : {DType::kFloat32, DType::kFloat64}) {
    INFO(dtype);
    // 1500 rows: several blocks of the kernel's partial sums.
    const Tensor x = ops::cast(random_tensor({1500, 3}, 48, DType::kFloat64, -2.0, 5.0), dtype);
    const Tensor gamma = ops::cast(Tensor::from_vector(std::vector<double>{1.5, -0.5, 2.0}), dtype);
    const Tensor beta = ops::cast(Tensor::from_vector(std::vector<double>{0.25, 0.0, -1.0}), dtype);
    Tensor mean, variance;
    const Tensor y = ops::batch_norm(x, gamma, beta, 1e-3, mean, variance);
    const std::vector<double> xv = values(x);
    std::vector<double> m(3, 0.0), v(3, 0.0), expected;
    for (size_t i = 0; i < xv.size(); ++i) m[i % 3] += xv[i] / 1500;
    for (size_t i = 0; i < xv.size(); ++i)
      v[i % 3] += (xv[i] - m[i % 3]) * (xv[i] - m[i % 3]) / 1500;
    const double g[3] = {1.5, -0.5, 2.0}, b[3] = {0.25, 0.0, -1.0};
    for (size_t i = 0; i < xv.size(); ++i)
      expected.push_back((xv[i] - m[i % 3]) / std::sqrt(v[i % 3] + 1e-3) * g[i % 3] + b[i % 3]);
    const double tolerance = dtype == DType::kFloat32 ? 2e-6 : 1e-12;
    require_close(mean, m, tolerance, tolerance);
    require_close(variance, v, tolerance, tolerance);
    require_close(y, expected, 4 * tolerance, 4 * tolerance);
  }
  Tensor mean, variance;
  REQUIRE_THROWS_WITH(
      ops::batch_norm(Tensor::ones({2, 3, 4}), Tensor(), Tensor(), 1e-3, mean, variance),
      Catch::Contains("batch_norm") && Catch::Contains("[2, 3, 4]"));
  REQUIRE_THROWS_WITH(
      ops::batch_norm(Tensor::ones({2, 3}), Tensor::ones({4}), Tensor(), 1e-3, mean, variance),
      Catch::Contains("gamma and beta") && Catch::Contains("[4]"));
}

TEST_CASE("batch_norm with its ReLU gives the bits of batch_norm then relu, and their gradients",
          "[cpu][ops]") {
  for (const DType dtype : {DType::kFloat32, DType::kFloat64}) {
    INFO(dtype);
    // 1500 rows (several blocks of partial sums), 19 channels (vector loops' tails).
    const Tensor x = ops::cast(random_tensor({1500, 19}, 49, DType::kFloat64, -2.0, 3.0), dtype);
    const Tensor upstream = ops::cast(random_tensor({1500, 19}, 50, DType::kFloat64), dtype);
    const Variable gamma("gamma",
                         ops::cast(random_tensor({19}, 51, DType::kFloat64, 0.5, 1.5), dtype));
    const Variable beta("beta", ops::cast(random_tensor({19}, 52, DType::kFloat64), dtype));
    const Variable input("x", x);
    auto run = [&](bool fused) {
      GradientTape tape;
      Tensor mean, variance;
      Tensor y = ops::batch_norm(input.value(), gamma.value(), beta.value(), 1e-3, mean, variance,
                                 /*relu=*/fused);
      if (!fused) y = ops::relu(y);
      const Tensor loss = ops::sum(ops::mul(y, upstream));
      std::vector<Tensor> out{y};
      for (const Tensor& g : tape.gradient(loss, {input, gamma, beta})) out.push_back(g);
      return out;
    };
    const std::vector<Tensor> fused = run(true), composed = run(false);
    const std::vector<double> y = values(fused[0]);
    const auto cut = std::count(y.begin(), y.end(), 0.0);  // the ReLU cut some outputs, not all
    REQUIRE(cut > 1000);
    REQUIRE(cut < static_cast<std::ptrdiff_t>(y.size()) - 1000);
    for (size_t i = 0; i < fused.size(); ++i) {
      INFO("output " << i << " (y, dx, dgamma, dbeta)");
      REQUIRE(values(fused[i]) == values(composed[i]));
    }
  }
}

TEST_CASE("dropout masks from the generator and scales what it keeps", "[cpu][ops]") {
  const Tensor x = Tensor::ones({1001}, DType::kFloat64);
  Generator generator(/*seed=*/7, /*stream=*/3);
  // Identity, without a draw, when not training or when the rate is 0.
  REQUIRE(ops::dropout(x, 0.5, generator, /*training=*/false).shares_storage_with(x));
  REQUIRE(ops::dropout(x, 0.0, generator).shares_storage_with(x));
  REQUIRE(generator.offset() == 0);

  const Tensor y = ops::dropout(x, 0.25, generator);
  REQUIRE(generator.offset() == (1001 + 3) / 4);
  int64_t kept = 0;
  for (double v : values(y)) {
    REQUIRE((v == 0.0 || v == Approx(1.0 / 0.75).epsilon(1e-15)));
    kept += v != 0.0;
  }
  REQUIRE(kept > 680);  // expected 750.75, standard deviation about 13.7
  REQUIRE(kept < 820);

  // The same generator state gives the same mask, in either dtype; the next draw differs.
  Generator replay(7, 3);
  require_close(ops::dropout(x, 0.25, replay), values(y), 0, 0);
  Generator replay32(7, 3);
  require_close(ops::dropout(ops::cast(x, DType::kFloat32), 0.25, replay32), values(y), 1e-7, 0);
  REQUIRE(values(ops::dropout(x, 0.25, generator)) != values(y));

  REQUIRE_THROWS_WITH(ops::dropout(x, 1.0, generator),
                      Catch::Contains("dropout") && Catch::Contains("[0, 1)"));
  REQUIRE_THROWS_WITH(ops::dropout(x, -0.1, generator), Catch::Contains("dropout"));
}

TEST_CASE("Keras parity of conv2d, max_pool2d, dense activations and sparse xent", "[cpu][ops]") {
  const KerasFixtures& fx = KerasFixtures::get();
  const Tensor x = fx.tensor("conv.x"), kernel = fx.tensor("conv.kernel"),
               bias = fx.tensor("conv.bias");
  const std::pair<const char*, std::pair<ops::Padding, int64_t>> conv_cases[] = {
      {"valid_s1", {ops::Padding::kValid, 1}},
      {"same_s1", {ops::Padding::kSame, 1}},
      {"valid_s2", {ops::Padding::kValid, 2}},
      {"same_s2", {ops::Padding::kSame, 2}},
  };
  for (const auto& [tag, config] : conv_cases) {
    INFO("conv " << tag);
    const auto [padding, s] = config;
    const Tensor y = ops::conv2d(x, kernel, {s, s}, padding) + bias;
    REQUIRE(max_abs_error(y, fx.tensor(std::string("conv.y_") + tag)) < 2e-6);
  }
  for (const std::string& tag : std::vector<std::string>{"same_s1", "valid_s2"}) {
    INFO("conv gradients " << tag);
    const auto padding = tag == "same_s1" ? ops::Padding::kSame : ops::Padding::kValid;
    const int64_t s = tag == "same_s1" ? 1 : 2;
    GradientTape tape;
    tape.watch(x);
    tape.watch(kernel);
    tape.watch(bias);
    const Tensor y = ops::conv2d(x, kernel, {s, s}, padding) + bias;
    const Tensor loss = ops::sum(y * fx.tensor("conv.upstream_" + tag));
    const std::vector<Tensor> g = tape.gradient(loss, {x, kernel, bias});
    REQUIRE(max_abs_error(g[0], fx.tensor("conv.grad_x_" + tag)) < 1e-5);
    REQUIRE(max_abs_error(g[1], fx.tensor("conv.grad_kernel_" + tag)) < 1e-5);
    REQUIRE(max_abs_error(g[2], fx.tensor("conv.grad_bias_" + tag)) < 1e-5);
  }
  const Tensor px = fx.tensor("pool.x");
  REQUIRE(max_abs_error(ops::max_pool2d(px, {2, 2}, {2, 2}), fx.tensor("pool.y_2x2_valid")) == 0);
  REQUIRE(max_abs_error(ops::max_pool2d(px, {2, 2}, {2, 2}, ops::Padding::kSame),
                        fx.tensor("pool.y_2x2_same")) == 0);
  REQUIRE(max_abs_error(ops::max_pool2d(px, {3, 3}, {1, 1}), fx.tensor("pool.y_3x3_s1_valid")) ==
          0);

  const Tensor z =
      ops::matmul(fx.tensor("dense.x"), fx.tensor("dense.kernel")) + fx.tensor("dense.bias");
  REQUIRE(max_abs_error(z, fx.tensor("dense.y_linear")) < 2e-6);
  REQUIRE(max_abs_error(ops::relu(z), fx.tensor("dense.y_relu")) < 2e-6);
  REQUIRE(max_abs_error(ops::sigmoid(z), fx.tensor("dense.y_sigmoid")) < 2e-6);
  REQUIRE(max_abs_error(ops::tanh(z), fx.tensor("dense.y_tanh")) < 2e-6);
  REQUIRE(max_abs_error(ops::gelu(z), fx.tensor("dense.y_gelu")) < 2e-6);
  REQUIRE(max_abs_error(ops::gelu(z, true), fx.tensor("dense.y_gelu_tanh")) < 2e-6);
  REQUIRE(max_abs_error(ops::softmax(z), fx.tensor("dense.y_softmax")) < 2e-6);

  const Tensor loss =
      ops::sparse_softmax_cross_entropy(fx.tensor("scce.logits"), fx.tensor("scce.labels"));
  REQUIRE(max_abs_error(loss, fx.tensor("scce.loss_logits")) < 2e-6);
  REQUIRE(std::abs(ops::mean(loss).item<double>() -
                   fx.tensor("scce.loss_logits_mean").item<double>()) < 2e-6);
}
