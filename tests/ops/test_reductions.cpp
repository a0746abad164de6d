// Reductions (sum, mean, max, argmax), softmax, log-softmax, the sparse cross-entropy and
// one_hot against host references, including their argument errors.
#include <catch2/catch.hpp>
#include <cmath>
#include <limits>

#include "ops/ops_testing.h"

using namespace tandem;
using tandem::testing::random_tensor;
using tandem::testing::require_close;
using tandem::testing::values;

namespace {

/// x viewed as [outer, n, inner] around `axis`, reduced over n on the host.
struct HostReduction {
  std::vector<double> sum, max;
  std::vector<int64_t> argmax;
};

HostReduction reduce_on_host(const Tensor& x, int64_t axis) {
  const std::vector<double> v = values(x);
  int64_t outer = 1, inner = 1;
  const int64_t n = x.dim(axis);
  for (int64_t i = 0; i < axis; ++i) outer *= x.dim(i);
  for (int64_t i = axis + 1; i < x.rank(); ++i) inner *= x.dim(i);
  HostReduction r;
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t i = 0; i < inner; ++i) {
      double s = 0, m = -std::numeric_limits<double>::infinity();
      int64_t best = 0;
      for (int64_t k = 0; k < n; ++k) {
        const double e = v[(o * n + k) * inner + i];
        s += e;
        if (e > m) {
          m = e;
          best = k;
        }
      }
      r.sum.push_back(s);
      r.max.push_back(m);
      r.argmax.push_back(best);
    }
  }
  return r;
}

}  // namespace

TEST_CASE("sum, mean and max over each axis, with and without keepdims", "[cpu][ops]") {
  for (const DType dtype : {DType::kFloat32, DType::kFloat64}) {
    const Tensor x = random_tensor({3, 4, 5}, 21, dtype);
    const double tol = dtype == DType::kFloat32 ? 1e-6 : 1e-14;
    for (int64_t axis = 0; axis < 3; ++axis) {
      INFO("axis " << axis << " " << dtype);
      const HostReduction r = reduce_on_host(x, axis);
      std::vector<int64_t> kept = x.shape().dims(), dropped = kept;
      kept[axis] = 1;
      dropped.erase(dropped.begin() + axis);
      for (const bool keepdims : {false, true}) {
        const Shape expected_shape(keepdims ? kept : dropped);
        const Tensor s = ops::sum(x, axis, keepdims);
        REQUIRE(s.shape() == expected_shape);
        require_close(s, r.sum, tol, tol);
        // Negative axes count from the end.
        require_close(ops::sum(x, axis - 3, keepdims), r.sum, tol, tol);
        std::vector<double> mean = r.sum;
        for (double& m : mean) m /= static_cast<double>(x.dim(axis));
        REQUIRE(ops::mean(x, axis, keepdims).shape() == expected_shape);
        require_close(ops::mean(x, axis, keepdims), mean, tol, tol);
        REQUIRE(ops::max(x, axis, keepdims).shape() == expected_shape);
        require_close(ops::max(x, axis, keepdims), r.max, 0, 0);
      }
      const Tensor index = ops::argmax(x, axis);
      REQUIRE(index.dtype() == DType::kInt64);
      REQUIRE(index.to_vector<int64_t>() == r.argmax);
    }
    const HostReduction all = reduce_on_host(x.reshape({60}), 0);
    REQUIRE(ops::sum(x).rank() == 0);
    require_close(ops::sum(x), all.sum, tol, tol);
    require_close(ops::mean(x), {all.sum[0] / 60}, tol, tol);
    require_close(ops::max(x), all.max, 0, 0);
  }
}

TEST_CASE("large sums are accurate and independent of the thread count", "[cpu][ops]") {
  const Tensor x = random_tensor({1000003}, 22, DType::kFloat32);
  double expected = 0;
  for (double v : values(x)) expected += v;
  const int saved = compute_threads();
  set_compute_threads(1);
  const float one = ops::sum(x).item<float>();
  set_compute_threads(2);
  const float two = ops::sum(x).item<float>();
  set_compute_threads(saved);
  REQUIRE(one == two);
  // Accumulated in double: only the final rounding to float remains.
  REQUIRE(std::abs(one - expected) <= 1e-7 * std::abs(expected) + 1e-4);
  // Column sums of a tall matrix (the bias-gradient shape).
  const Tensor m = random_tensor({4001, 37}, 23);
  const std::vector<double> v = values(m);
  std::vector<double> columns(37, 0.0);
  for (size_t i = 0; i < v.size(); ++i) columns[i % 37] += v[i];
  require_close(ops::sum(m, 0), columns, 1e-12, 1e-12);
}

TEST_CASE("integer sums, max and argmax", "[cpu][ops]") {
  const Tensor x = Tensor::from_vector<int32_t>({3, 9, 9, -1, 4, 2}, {2, 3});
  REQUIRE(ops::sum(x).dtype() == DType::kInt32);
  REQUIRE(ops::sum(x).item<int>() == 26);
  REQUIRE(ops::sum(x, 1).to_vector<int32_t>() == std::vector<int32_t>{21, 5});
  REQUIRE(ops::max(x, 0).to_vector<int32_t>() == std::vector<int32_t>{3, 9, 9});
  // Ties go to the first index.
  REQUIRE(ops::argmax(x).to_vector<int64_t>() == std::vector<int64_t>{1, 1});
  REQUIRE(ops::argmax(Tensor::from_vector<float>({2, 7, 7, 1})).item<int64_t>() == 1);
  REQUIRE(ops::sum(Tensor::zeros({0, 3})).item<double>() == 0.0);
  REQUIRE_THROWS_WITH(ops::mean(x), Catch::Contains("mean") && Catch::Contains("int32"));
  REQUIRE_THROWS_WITH(ops::sum(Tensor::ones({2}, DType::kBool)),
                      Catch::Contains("sum") && Catch::Contains("bool"));
}

TEST_CASE("reduction errors name the axis and the shape", "[cpu][ops]") {
  const Tensor x = Tensor::ones({2, 3});
  REQUIRE_THROWS_WITH(ops::sum(x, 2), Catch::Contains("sum") && Catch::Contains("axis 2") &&
                                          Catch::Contains("[2, 3]"));
  REQUIRE_THROWS_WITH(ops::max(x, -3), Catch::Contains("max") && Catch::Contains("[2, 3]"));
  REQUIRE_THROWS_WITH(ops::max(Tensor::zeros({0})),
                      Catch::Contains("max") && Catch::Contains("empty"));
  REQUIRE_THROWS_WITH(ops::argmax(Tensor::zeros({2, 0})), Catch::Contains("argmax"));
}

TEST_CASE("softmax and log_softmax over any axis", "[cpu][ops]") {
  for (const DType dtype : {DType::kFloat32, DType::kFloat64}) {
    const Tensor x = random_tensor({3, 4, 5}, 24, dtype, -3, 3);
    const double tol = dtype == DType::kFloat32 ? 2e-6 : 1e-14;
    const std::vector<double> v = values(x);
    for (int64_t axis : {0, 1, 2, -1}) {
      INFO("axis " << axis << " " << dtype);
      const int64_t a = axis < 0 ? axis + 3 : axis;
      int64_t outer = 1, inner = 1;
      const int64_t n = x.dim(a);
      for (int64_t i = 0; i < a; ++i) outer *= x.dim(i);
      for (int64_t i = a + 1; i < 3; ++i) inner *= x.dim(i);
      std::vector<double> soft(v.size()), logsoft(v.size());
      for (int64_t o = 0; o < outer; ++o) {
        for (int64_t i = 0; i < inner; ++i) {
          double total = 0;
          for (int64_t k = 0; k < n; ++k) total += std::exp(v[(o * n + k) * inner + i]);
          for (int64_t k = 0; k < n; ++k) {
            const int64_t at = (o * n + k) * inner + i;
            soft[at] = std::exp(v[at]) / total;
            logsoft[at] = v[at] - std::log(total);
          }
        }
      }
      require_close(ops::softmax(x, axis), soft, tol, tol);
      require_close(ops::log_softmax(x, axis), logsoft, tol, tol);
    }
  }
}

TEST_CASE("softmax is stable for large logits", "[cpu][ops]") {
  const Tensor x = Tensor::from_vector<float>({1000.f, 1000.f, -1000.f, 0.f}, {1, 4});
  require_close(ops::softmax(x), {0.5, 0.5, 0, 0}, 1e-7, 1e-7);
  const std::vector<double> ls = values(ops::log_softmax(x));
  REQUIRE(ls[0] == Approx(-std::log(2.0)).epsilon(1e-6));
  REQUIRE(ls[2] == Approx(-2000 - std::log(2.0)).epsilon(1e-6));
}

TEST_CASE("sparse_softmax_cross_entropy: fused, stable, and checks labels", "[cpu][ops]") {
  const Tensor logits = random_tensor({7, 5}, 25, DType::kFloat64, -4, 4);
  const std::vector<int64_t> label_values{0, 4, 2, 2, 1, 3, 0};
  const std::vector<double> z = values(logits);
  std::vector<double> expected;
  for (int r = 0; r < 7; ++r) {
    double total = 0;
    for (int k = 0; k < 5; ++k) total += std::exp(z[r * 5 + k]);
    expected.push_back(std::log(total) - z[r * 5 + label_values[r]]);
  }
  const Tensor labels64 = Tensor::from_vector<int64_t>(label_values);
  const Tensor loss = ops::sparse_softmax_cross_entropy(logits, labels64);
  REQUIRE(loss.shape() == Shape{7});
  require_close(loss, expected, 1e-14, 1e-14);
  std::vector<int32_t> label32(label_values.begin(), label_values.end());
  require_close(ops::sparse_softmax_cross_entropy(logits, Tensor::from_vector<int32_t>(label32)),
                expected, 1e-14, 1e-14);
  const Tensor f32 =
      ops::sparse_softmax_cross_entropy(ops::cast(logits, DType::kFloat32), labels64);
  REQUIRE(f32.dtype() == DType::kFloat32);
  require_close(f32, expected, 1e-5, 1e-6);

  // Logits of 1e4 would overflow exp without the max subtraction.
  const Tensor huge = Tensor::from_vector<float>({1e4f, 0.f, -1e4f}, {1, 3});
  require_close(ops::sparse_softmax_cross_entropy(huge, Tensor::from_vector<int64_t>({1})), {1e4},
                1e-6, 0);

  const Tensor bad = Tensor::from_vector<int64_t>({0, 4, 2, 9, 1, 3, 0});
  REQUIRE_THROWS_WITH(
      ops::sparse_softmax_cross_entropy(logits, bad),
      Catch::Contains("label 9") && Catch::Contains("index 3") && Catch::Contains("[0, 5)"));
  REQUIRE_THROWS_WITH(ops::sparse_softmax_cross_entropy(
                          logits, Tensor::from_vector<int32_t>({-1, 0, 0, 0, 0, 0, 0})),
                      Catch::Contains("label -1") && Catch::Contains("index 0"));
  REQUIRE_THROWS_WITH(ops::sparse_softmax_cross_entropy(logits, Tensor::zeros({7})),
                      Catch::Contains("int32 or int64") && Catch::Contains("float32"));
  REQUIRE_THROWS_WITH(ops::sparse_softmax_cross_entropy(logits, Tensor::from_vector<int64_t>({0})),
                      Catch::Contains("[7, 5]") && Catch::Contains("[1]"));
}

TEST_CASE("one_hot encodes and validates labels", "[cpu][ops]") {
  const Tensor labels = Tensor::from_vector<int32_t>({2, 0, 1});
  const Tensor y = ops::one_hot(labels, 4);
  REQUIRE(y.shape() == Shape{3, 4});
  REQUIRE(y.dtype() == DType::kFloat32);
  require_close(y, {0, 0, 1, 0, 1, 0, 0, 0, 0, 1, 0, 0});
  const Tensor y64 = ops::one_hot(Tensor::from_vector<int64_t>({1, 1}), 2, DType::kInt64);
  REQUIRE(y64.to_vector<int64_t>() == std::vector<int64_t>{0, 1, 0, 1});
  REQUIRE_THROWS_WITH(
      ops::one_hot(Tensor::from_vector<int32_t>({0, 4}), 4),
      Catch::Contains("one_hot") && Catch::Contains("label 4") && Catch::Contains("index 1"));
  REQUIRE_THROWS_WITH(ops::one_hot(Tensor::zeros({2}), 4),
                      Catch::Contains("one_hot") && Catch::Contains("float32"));
  REQUIRE_THROWS_WITH(ops::one_hot(labels, 0), Catch::Contains("depth"));
}
