// Elementwise ops against host references: binary ops under every broadcasting path, unary
// math and activations, scalar forms and operators, comparison, cast, in-place updates, and
// the argument errors; add with a fused ReLU against relu(add).
#include <catch2/catch.hpp>
#include <cmath>
#include <limits>
#include <utility>
#include <vector>

#include "ops/ops_testing.h"

using namespace tandem;
using tandem::testing::random_tensor;
using tandem::testing::reference_binary;
using tandem::testing::reference_unary;
using tandem::testing::require_close;
using tandem::testing::values;

namespace {

struct BinaryCase {
  const char* name;
  Tensor (*op)(const Tensor&, const Tensor&);
  double (*reference)(double, double);
};

const BinaryCase kBinaryCases[] = {
    {"add", ops::add, [](double a, double b) { return a + b; }},
    {"sub", ops::sub, [](double a, double b) { return a - b; }},
    {"mul", ops::mul, [](double a, double b) { return a * b; }},
    {"div", ops::div, [](double a, double b) { return a / b; }},
    {"maximum", ops::maximum, [](double a, double b) { return std::max(a, b); }},
    {"minimum", ops::minimum, [](double a, double b) { return std::min(a, b); }},
};

/// Restores the calling thread's compute-thread count on scope exit.
class ComputeThreads {
 public:
  explicit ComputeThreads(int threads) : saved_(compute_threads()) { set_compute_threads(threads); }
  ~ComputeThreads() { set_compute_threads(saved_); }

 private:
  int saved_;
};

}  // namespace

TEST_CASE("binary ops match the host reference on equal shapes", "[cpu][ops]") {
  for (const DType dtype : {DType::kFloat32, DType::kFloat64}) {
    // 100k elements: large enough for the parallel path.
    for (const Shape& shape : {Shape{7, 13}, Shape{100000}}) {
      const Tensor a = random_tensor(shape, 1, dtype), b = random_tensor(shape, 2, dtype, 0.5, 2);
      for (const BinaryCase& c : kBinaryCases) {
        INFO(c.name << " " << dtype << " " << shape);
        const Tensor out = c.op(a, b);
        REQUIRE(out.dtype() == dtype);
        REQUIRE(out.shape() == shape);
        // The reference runs in double on the (exactly representable) float inputs.
        require_close(out, reference_binary(a, b, shape, c.reference),
                      dtype == DType::kFloat32 ? 1e-6 : 1e-15, 0);
      }
    }
  }
}

TEST_CASE("binary ops broadcast like numpy on every path", "[cpu][ops]") {
  struct Case {
    Shape a, b, out;
  };
  const Case cases[] = {
      {{4, 5}, {5}, {4, 5}},                       // bias row
      {{4, 5}, {4, 1}, {4, 5}},                    // column
      {{1}, {3, 4}, {3, 4}},                       // one-element operand
      {{}, {2, 3}, {2, 3}},                        // rank-0 scalar on the left
      {{2, 3}, {}, {2, 3}},                        // and on the right
      {{3, 1}, {1, 4}, {3, 4}},                    // outer product
      {{2, 1, 4}, {3, 1}, {2, 3, 4}},              // ranks differ, broadcast both ways
      {{2, 3, 4}, {2, 1, 4}, {2, 3, 4}},           // middle axis
      {{5, 1, 3, 1}, {1, 4, 1, 2}, {5, 4, 3, 2}},  // alternating
      {{1, 1}, {1}, {1, 1}},                       // one element in all
      {{0, 3}, {3}, {0, 3}},                       // empty
      {{300, 257}, {257}, {300, 257}},             // parallel chunks that split rows
      {{300, 1, 257}, {1, 4, 1}, {300, 4, 257}},   // parallel, general odometer
  };
  for (const Case& c : cases) {
    const Tensor a = random_tensor(c.a, 3), b = random_tensor(c.b, 4, DType::kFloat64, 0.5, 2);
    INFO("shapes " << c.a << " and " << c.b);
    REQUIRE(ops::broadcast_shapes(c.a, c.b) == c.out);
    for (const BinaryCase& bc : kBinaryCases) {
      INFO(bc.name);
      const Tensor out = bc.op(a, b);
      REQUIRE(out.shape() == c.out);
      require_close(out, reference_binary(a, b, c.out, bc.reference), 1e-15, 0);
    }
  }
}

TEST_CASE("broadcast results do not depend on the thread count", "[cpu][ops]") {
  const Tensor a = random_tensor({513, 301}, 5, DType::kFloat32);
  const Tensor b = random_tensor({301}, 6, DType::kFloat32);
  Tensor one, two;
  {
    ComputeThreads threads(1);
    one = ops::mul(a, b);
  }
  {
    ComputeThreads threads(2);
    two = ops::mul(a, b);
  }
  REQUIRE(one.to_vector<float>() == two.to_vector<float>());
}

TEST_CASE("binary ops on integer tensors", "[cpu][ops]") {
  const Tensor a = Tensor::from_vector<int32_t>({1, -2, 3, 40}, {2, 2});
  const Tensor b = Tensor::from_vector<int32_t>({10, 20}, {2});
  REQUIRE(ops::add(a, b).to_vector<int32_t>() == std::vector<int32_t>{11, 18, 13, 60});
  REQUIRE(ops::sub(a, b).to_vector<int32_t>() == std::vector<int32_t>{-9, -22, -7, 20});
  REQUIRE(ops::mul(a, b).to_vector<int32_t>() == std::vector<int32_t>{10, -40, 30, 800});
  REQUIRE(ops::maximum(a, b).to_vector<int32_t>() == std::vector<int32_t>{10, 20, 10, 40});
  REQUIRE(ops::add(a, b).dtype() == DType::kInt32);
  const Tensor c = Tensor::from_vector<int64_t>({int64_t{1} << 40, 5});
  REQUIRE(ops::add(c, c).to_vector<int64_t>() == std::vector<int64_t>{int64_t{1} << 41, 10});
  const Tensor u = Tensor::from_vector<uint8_t>({200, 7});
  REQUIRE(ops::mul(u, 2.0).to_vector<int>() == std::vector<int>{144, 14});  // wraps as uint8
  REQUIRE(ops::add(a, 5.0).to_vector<int32_t>() == std::vector<int32_t>{6, 3, 8, 45});
  REQUIRE_THROWS_WITH(ops::div(a, a), Catch::Contains("div") && Catch::Contains("int32"));
  REQUIRE_THROWS_WITH(ops::exp(a), Catch::Contains("exp") && Catch::Contains("int32"));
}

TEST_CASE("binary op errors name both operands", "[cpu][ops]") {
  const Tensor a = Tensor::ones({2, 3}), b = Tensor::ones({4});
  REQUIRE_THROWS_WITH(ops::add(a, b), Catch::Contains("add") && Catch::Contains("[2, 3]") &&
                                          Catch::Contains("[4]"));
  REQUIRE_THROWS_WITH(
      a * b, Catch::Contains("mul") && Catch::Contains("[2, 3]") && Catch::Contains("[4]"));
  REQUIRE_THROWS_WITH(ops::broadcast_shapes({2, 3}, {3, 2}),
                      Catch::Contains("[2, 3]") && Catch::Contains("[3, 2]"));
  const Tensor d = Tensor::ones({3}, DType::kFloat64);
  REQUIRE_THROWS_WITH(ops::add(Tensor::ones({3}), d), Catch::Contains("add") &&
                                                          Catch::Contains("float32") &&
                                                          Catch::Contains("float64"));
  REQUIRE_THROWS_WITH(ops::add(a, Tensor()),
                      Catch::Contains("add") && Catch::Contains("undefined"));
  REQUIRE_THROWS_AS(ops::add(a, b), Error);
}

TEST_CASE("unary math and activations match std:: references", "[cpu][ops]") {
  struct Case {
    const char* name;
    std::function<Tensor(const Tensor&)> op;
    std::function<double(double)> reference;
    double low, high;
  };
  const double pi = 3.14159265358979323846;
  const Case cases[] = {
      {"neg", [](const Tensor& x) { return ops::neg(x); }, [](double x) { return -x; }, -2, 2},
      {"abs", [](const Tensor& x) { return ops::abs(x); }, [](double x) { return std::abs(x); }, -2,
       2},
      {"exp", [](const Tensor& x) { return ops::exp(x); }, [](double x) { return std::exp(x); }, -3,
       3},
      {"log", [](const Tensor& x) { return ops::log(x); }, [](double x) { return std::log(x); },
       0.1, 5},
      {"log1p", [](const Tensor& x) { return ops::log1p(x); },
       [](double x) { return std::log1p(x); }, -0.5, 5},
      {"sqrt", [](const Tensor& x) { return ops::sqrt(x); }, [](double x) { return std::sqrt(x); },
       0.1, 5},
      {"square", [](const Tensor& x) { return ops::square(x); }, [](double x) { return x * x; }, -3,
       3},
      {"pow", [](const Tensor& x) { return ops::pow(x, 2.5); },
       [](double x) { return std::pow(x, 2.5); }, 0.1, 3},
      {"clip", [](const Tensor& x) { return ops::clip(x, -0.5, 0.25); },
       [](double x) { return std::min(std::max(x, -0.5), 0.25); }, -1, 1},
      {"relu", [](const Tensor& x) { return ops::relu(x); },
       [](double x) { return x > 0 ? x : 0.0; }, -2, 2},
      {"sigmoid", [](const Tensor& x) { return ops::sigmoid(x); },
       [](double x) { return 1.0 / (1.0 + std::exp(-x)); }, -8, 8},
      {"tanh", [](const Tensor& x) { return ops::tanh(x); }, [](double x) { return std::tanh(x); },
       -3, 3},
      {"gelu", [](const Tensor& x) { return ops::gelu(x); },
       [](double x) { return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0))); }, -4, 4},
      {"gelu tanh", [](const Tensor& x) { return ops::gelu(x, /*approximate=*/true); },
       [pi](double x) {
         return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / pi) * (x + 0.044715 * x * x * x)));
       },
       -4, 4},
  };
  for (const Case& c : cases) {
    for (const DType dtype : {DType::kFloat32, DType::kFloat64}) {
      INFO(c.name << " " << dtype);
      const Tensor x = random_tensor({7, 10001}, 7, dtype, c.low, c.high);  // parallel
      const Tensor y = c.op(x);
      REQUIRE(y.dtype() == dtype);
      REQUIRE(y.shape() == x.shape());
      if (dtype == DType::kFloat32)
        require_close(y, reference_unary(x, c.reference), 2e-6, 1e-7);
      else
        require_close(y, reference_unary(x, c.reference), 1e-14, 1e-15);
    }
  }
}

TEST_CASE("activations stay finite at the extremes", "[cpu][ops]") {
  const Tensor x = Tensor::from_vector<float>({-1000.f, -88.f, 0.f, 88.f, 1000.f});
  const std::vector<double> s = values(ops::sigmoid(x));
  REQUIRE((s[0] == 0.0 && s[2] == 0.5 && s[4] == 1.0));
  for (double v : s) REQUIRE(std::isfinite(v));
  for (double v : values(ops::tanh(x))) REQUIRE(std::isfinite(v));
  for (double v : values(ops::gelu(x))) REQUIRE(std::isfinite(v));
  require_close(ops::relu(x), {0, 0, 0, 88, 1000});
  REQUIRE_THROWS_WITH(ops::clip(x, 1.0, -1.0), Catch::Contains("clip") && Catch::Contains("low"));
}

TEST_CASE("GELU and its gradient in float32 keep their relative accuracy in both tails",
          "[cpu][ops]") {
  // Every 1/4096 from -9 to 9, and NaN and the infinities: Phi(x) is about 1e-19 at -9, where
  // 0.5 (1 + erf(x / sqrt 2)) would have lost every digit to cancellation.
  std::vector<float> xs;
  for (int i = -9 * 4096; i <= 9 * 4096; ++i) xs.push_back(static_cast<float>(i) / 4096.0f);
  const size_t finite = xs.size();
  xs.insert(xs.end(),
            {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
             -std::numeric_limits<float>::infinity()});
  const Shape shape{static_cast<int64_t>(xs.size())};
  const Tensor x = Tensor::from_vector<float>(xs, shape);
  GradientTape tape;
  tape.watch(x);
  const Tensor y = ops::gelu(x);
  const std::vector<double> got = values(y);
  const std::vector<double> grad = values(tape.gradient(y * 0.75, x));  // upstream 0.75
  for (size_t i = 0; i < finite; ++i) {
    const double v = xs[i];
    const double cdf = 0.5 * std::erfc(-v / std::sqrt(2.0));
    const double pdf = std::exp(-0.5 * v * v) / std::sqrt(2.0 * M_PI);
    INFO("x = " << v);
    // Rounding x^2 in float bounds the relative error by about 2.5e-7 * (1 + x^2 / 2).
    const double rtol = 1e-6 * (1.0 + v * v / 8.0);
    REQUIRE(std::abs(got[i] - v * cdf) <= rtol * std::abs(v * cdf));
    // The gradient crosses zero near x = -0.75: there, relative to its terms.
    const double d = 0.75 * (cdf + v * pdf);
    REQUIRE(std::abs(grad[i] - d) <= rtol * 0.75 * (cdf + std::abs(v) * pdf));
  }
  REQUIRE(std::isnan(got[finite]));
  REQUIRE(got[finite + 1] == std::numeric_limits<double>::infinity());
  REQUIRE(std::isnan(got[finite + 2]));  // -inf * Phi(-inf) = -inf * 0, as 0.5 x (1 + erf)
  REQUIRE(std::isnan(grad[finite]));
}

TEST_CASE("GELU in the 16-bit types is float32's GELU of the widened input, rounded once",
          "[cpu][ops]") {
  const Tensor x32 = random_tensor({3, 1001}, 11, DType::kFloat32, -6, 6);  // odd lengths: tails
  const Tensor g32 = random_tensor({3, 1001}, 12, DType::kFloat32, -1, 1);
  for (const DType dtype : {DType::kBFloat16, DType::kFloat16}) {
    INFO(dtype);
    const Tensor x = ops::cast(x32, dtype), g = ops::cast(g32, dtype);
    const Tensor wide_x = ops::cast(x, DType::kFloat32), wide_g = ops::cast(g, DType::kFloat32);
    GradientTape tape({.persistent = true});
    tape.watch(x);
    tape.watch(wide_x);
    const Tensor y = ops::gelu(x), wide_y = ops::gelu(wide_x);
    REQUIRE(y.dtype() == dtype);
    REQUIRE(values(y) == values(ops::cast(wide_y, dtype)));
    // Upstream gradients g (exact in both: multiplying by ones rounds nothing).
    const Tensor dx = tape.gradient(y * g, x), wide_dx = tape.gradient(wide_y * wide_g, wide_x);
    REQUIRE(values(dx) == values(ops::cast(wide_dx, dtype)));
  }
}

TEST_CASE("scalar forms and Tensor operators", "[cpu][ops]") {
  const Tensor a = Tensor::from_vector<double>({1, 2, 3, 4}, {2, 2});
  const Tensor b = Tensor::from_vector<double>({10, 20}, {2});
  require_close(a + b, {11, 22, 13, 24});
  require_close(a - b, {-9, -18, -7, -16});
  require_close(a * b, {10, 40, 30, 80});
  require_close(b / a, {10, 10, 10.0 / 3, 5});
  require_close(-a, {-1, -2, -3, -4});
  require_close(a + 0.5, {1.5, 2.5, 3.5, 4.5});
  require_close(a - 0.5, {0.5, 1.5, 2.5, 3.5});
  require_close(a * 3.0, {3, 6, 9, 12});
  require_close(3.0 * a, {3, 6, 9, 12});
  require_close(a / 4.0, {0.25, 0.5, 0.75, 1});
  require_close(ops::add(a, 1.0), {2, 3, 4, 5});
  require_close(ops::mul(a, -1.0), {-1, -2, -3, -4});
  // The scalar takes a's dtype.
  const Tensor f = Tensor::from_vector<float>({1.f, 3.f});
  REQUIRE((f / 3.0).dtype() == DType::kFloat32);
  REQUIRE((f / 3.0).to_vector<float>() == std::vector<float>{1.f / 3.f, 1.f});
}

TEST_CASE("equal compares with broadcasting, as bool", "[cpu][ops]") {
  const Tensor a = Tensor::from_vector<int64_t>({1, 2, 3, 2, 2, 0}, {2, 3});
  const Tensor b = Tensor::from_vector<int64_t>({1, 2, 0}, {3});
  const Tensor eq = ops::equal(a, b);
  REQUIRE(eq.dtype() == DType::kBool);
  REQUIRE(eq.to_vector<int>() == std::vector<int>{1, 1, 0, 0, 1, 1});
  const Tensor p = Tensor::from_vector<bool>({true, false});
  REQUIRE(ops::equal(p, Tensor::from_vector<bool>({true})).to_vector<int>() ==
          std::vector<int>{1, 0});
  const Tensor x = Tensor::from_vector<float>({0.5f, std::nanf("")});
  REQUIRE(ops::equal(x, x).to_vector<int>() == std::vector<int>{1, 0});
  REQUIRE_THROWS_WITH(ops::equal(a, Tensor::ones({3})), Catch::Contains("equal") &&
                                                            Catch::Contains("int64") &&
                                                            Catch::Contains("float32"));
}

TEST_CASE("cast converts between every dtype", "[cpu][ops]") {
  const Tensor f = Tensor::from_vector<double>({-2.75, 0.0, 1.5, 300.25});
  REQUIRE(ops::cast(f, DType::kInt32).to_vector<int32_t>() == std::vector<int32_t>{-2, 0, 1, 300});
  REQUIRE(ops::cast(f, DType::kInt64).dtype() == DType::kInt64);
  REQUIRE(ops::cast(f, DType::kBool).to_vector<int>() == std::vector<int>{1, 0, 1, 1});
  REQUIRE(ops::cast(f, DType::kFloat32).to_vector<float>() ==
          std::vector<float>{-2.75f, 0.f, 1.5f, 300.25f});
  const Tensor flags = Tensor::from_vector<bool>({true, false, true});
  REQUIRE(ops::cast(flags, DType::kFloat32).to_vector<float>() == std::vector<float>{1, 0, 1});
  const Tensor bytes = Tensor::from_vector<uint8_t>({0, 255});
  REQUIRE(ops::cast(bytes, DType::kFloat64).to_vector<double>() == std::vector<double>{0, 255});
  const Tensor rounded = ops::cast(Tensor::from_vector<double>({0.1}), DType::kFloat32);
  REQUIRE(rounded.to_vector<float>()[0] == 0.1f);
  // Casting to the same dtype returns the tensor itself, as tf.cast.
  REQUIRE(ops::cast(f, DType::kFloat64).shares_storage_with(f));
  const Tensor big = random_tensor({100000}, 8);
  require_close(ops::cast(ops::cast(big, DType::kFloat32), DType::kFloat64),
                values(ops::cast(big, DType::kFloat32)));
}

TEST_CASE("add_ and scale_ update in place", "[cpu][ops]") {
  Tensor dst = Tensor::from_vector<float>({1, 2, 3});
  const void* storage = dst.raw_data();
  ops::add_(dst, Tensor::from_vector<float>({10, 20, 30}), 0.5);
  REQUIRE(dst.to_vector<float>() == std::vector<float>{6, 12, 18});
  ops::add_(dst, Tensor::from_vector<float>({1, 1, 1}));
  REQUIRE(dst.to_vector<float>() == std::vector<float>{7, 13, 19});
  ops::scale_(dst, 2.0);
  REQUIRE(dst.to_vector<float>() == std::vector<float>{14, 26, 38});
  REQUIRE(dst.raw_data() == storage);

  Tensor big = random_tensor({300000}, 9);
  const Tensor src = random_tensor({300000}, 10);
  const std::vector<double> expected =
      reference_binary(big, src, big.shape(), [](double a, double b) { return a - 3 * b; });
  ops::add_(big, src, -3.0);
  require_close(big, expected, 1e-15, 1e-15);

  Tensor counts = Tensor::from_vector<int64_t>({1, 2});
  ops::add_(counts, Tensor::from_vector<int64_t>({5, 5}), 2.0);
  REQUIRE(counts.to_vector<int64_t>() == std::vector<int64_t>{11, 12});
  REQUIRE_THROWS_WITH(ops::add_(counts, counts, 0.5),
                      Catch::Contains("add_") && Catch::Contains("0.5"));
  REQUIRE_THROWS_WITH(ops::add_(dst, Tensor::ones({4})),
                      Catch::Contains("add_") && Catch::Contains("[3]") && Catch::Contains("[4]"));
}

TEST_CASE("sum_to reverses broadcasting", "[cpu][ops]") {
  const Tensor x = random_tensor({2, 3, 4}, 11);
  const std::vector<double> v = values(x);
  auto at = [&](int64_t i, int64_t j, int64_t k) { return v[(i * 3 + j) * 4 + k]; };
  {
    const Tensor y = ops::sum_to(x, {4});
    REQUIRE(y.shape() == Shape{4});
    std::vector<double> expected(4, 0.0);
    for (int i = 0; i < 2; ++i)
      for (int j = 0; j < 3; ++j)
        for (int k = 0; k < 4; ++k) expected[k] += at(i, j, k);
    require_close(y, expected, 1e-14, 1e-14);
  }
  {
    const Tensor y = ops::sum_to(x, {2, 1, 4});
    REQUIRE(y.shape() == Shape{2, 1, 4});
    std::vector<double> expected(8, 0.0);
    for (int i = 0; i < 2; ++i)
      for (int j = 0; j < 3; ++j)
        for (int k = 0; k < 4; ++k) expected[i * 4 + k] += at(i, j, k);
    require_close(y, expected, 1e-14, 1e-14);
  }
  {
    const Tensor y = ops::sum_to(x, {3, 1});
    std::vector<double> expected(3, 0.0);
    for (int i = 0; i < 2; ++i)
      for (int j = 0; j < 3; ++j)
        for (int k = 0; k < 4; ++k) expected[j] += at(i, j, k);
    require_close(y, expected, 1e-14, 1e-14);
  }
  {
    const Tensor y = ops::sum_to(x, {});
    REQUIRE(y.rank() == 0);
    double total = 0;
    for (double e : v) total += e;
    require_close(y, {total}, 1e-14, 1e-14);
  }
  REQUIRE(ops::sum_to(x, x.shape()).shares_storage_with(x));
  REQUIRE_THROWS_WITH(ops::sum_to(x, {5}), Catch::Contains("sum_to") && Catch::Contains("[5]") &&
                                               Catch::Contains("[2, 3, 4]"));
}

TEST_CASE("add with a fused ReLU gives relu(add(a, b)) bit for bit, forward and backward",
          "[cpu][ops]") {
  for (const DType dtype : {DType::kFloat32, DType::kFloat64, DType::kBFloat16}) {
    // Equal shapes (100k elements: the parallel path) and a per-channel b, broadcast.
    for (const auto& [sa, sb] :
         {std::pair{Shape{100000}, Shape{100000}}, std::pair{Shape{4, 5, 5, 8}, Shape{8}}}) {
      INFO(dtype << " " << sa << " + " << sb);
      const Tensor a = ops::cast(random_tensor(sa, 1, DType::kFloat32), dtype);
      const Tensor b = ops::cast(random_tensor(sb, 2, DType::kFloat32), dtype);
      const Tensor weights = ops::cast(random_tensor(sa, 3, DType::kFloat32), dtype);
      GradientTape tape({.persistent = true});
      tape.watch(a);
      tape.watch(b);
      const Tensor fused = ops::add(a, b, ops::FusedActivation::kRelu);
      const Tensor composed = ops::relu(ops::add(a, b));
      REQUIRE(fused.dtype() == dtype);
      REQUIRE(values(fused) == values(composed));
      // About half the sums are negative: the mask matters.
      REQUIRE(ops::sum(ops::cast(ops::greater(fused, 0.0), DType::kInt64)).item<int64_t>() >
              sa.numel() / 4);
      const std::vector<Tensor> g_fused = tape.gradient(ops::sum(ops::mul(fused, weights)), {a, b});
      const std::vector<Tensor> g_composed =
          tape.gradient(ops::sum(ops::mul(composed, weights)), {a, b});
      REQUIRE(values(g_fused[0]) == values(g_composed[0]));
      REQUIRE(values(g_fused[1]) == values(g_composed[1]));
    }
  }
  // kLinear is add itself; the ReLU needs a floating dtype.
  const Tensor i = Tensor::from_vector<int32_t>({1, -3});
  REQUIRE(values(ops::add(i, i, ops::FusedActivation::kLinear)) == std::vector<double>{2, -6});
  REQUIRE_THROWS_WITH(ops::add(i, i, ops::FusedActivation::kRelu),
                      Catch::Contains("add with a ReLU") && Catch::Contains("int32"));
}
