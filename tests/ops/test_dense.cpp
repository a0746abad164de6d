// The fused dense op: forward and backward against the composition it replaces (matmul, add,
// relu) in float32 and float64 over odd shapes, with and without bias, ReLU and linear;
// finite-difference gradients; one recorded node; no input gradient for an untracked input.
#include <catch2/catch.hpp>
#include <cmath>
#include <string>
#include <vector>

#include "ops/gradcheck.h"
#include "ops/ops_testing.h"
#include "support/node_recorder.h"

using namespace tandem;
using tandem::testing::check_gradients;
using tandem::testing::NodeRecorder;
using tandem::testing::random_tensor;
using tandem::testing::require_close;
using tandem::testing::values;

namespace {

struct DenseCase {
  int64_t m, k, n;
};

// Batch 1, odd sizes, an empty batch and an empty inner dimension, the sample's layers, and
// kernels whose rows lie a power of two of >= 2 KiB apart (on AVX2 copied to a padded stride
// before oneDNN reads them).
const std::vector<DenseCase> kCases = {
    {1, 1, 1},      {1, 7, 3},     {5, 13, 9},      {17, 31, 33},  {0, 4, 3},    {3, 0, 4},
    {64, 784, 256}, {63, 256, 10}, {256, 784, 256}, {16, 40, 512}, {9, 24, 1024}};

Tensor unfused(const Tensor& x, const Tensor& kernel, const Tensor& bias, bool relu) {
  Tensor y = ops::matmul(x, kernel);
  if (bias.defined()) y = ops::add(y, bias);
  return relu ? ops::relu(y) : y;
}

Tensor fused(const Tensor& x, const Tensor& kernel, const Tensor& bias, bool relu) {
  return ops::dense(x, kernel, bias,
                    relu ? ops::FusedActivation::kRelu : ops::FusedActivation::kLinear);
}

/// Every element equal (== on values: a ReLU may give -0 where the composition gives +0).
void require_equal(const Tensor& actual, const Tensor& expected) {
  REQUIRE(actual.defined() == expected.defined());
  if (!actual.defined()) return;
  REQUIRE(actual.shape() == expected.shape());
  REQUIRE(actual.dtype() == expected.dtype());
  require_close(actual, expected, /*rtol=*/0.0, /*atol=*/0.0);
}

/// x rounded to a multiple of 1/8 (|x| < 1 stays below 1).
Tensor eighths(const Tensor& x) {
  std::vector<float> v = x.to_vector<float>();
  for (float& e : v) e = std::round(e * 8.0f) / 8.0f;
  return Tensor::from_vector<float>(v, x.shape());
}

struct Grads {
  Tensor y, x, kernel, bias;
};

/// The output and the gradients of sum(f(...) * w) for a fixed random weight w.
template <typename F>
Grads run(const F& f, const Tensor& x, const Tensor& kernel, const Tensor& bias, bool relu) {
  GradientTape tape;
  tape.watch(x);
  tape.watch(kernel);
  if (bias.defined()) tape.watch(bias);
  Grads out;
  out.y = f(x, kernel, bias, relu);
  const Tensor w = random_tensor(out.y.shape(), /*seed=*/99, x.dtype());
  const std::vector<Tensor> g =
      tape.gradient(ops::sum(ops::mul(out.y, w)), std::vector<Tensor>{x, kernel, bias});
  out.x = g[0];
  out.kernel = g[1];
  out.bias = g[2];
  return out;
}

}  // namespace

TEST_CASE("dense equals matmul + add + relu bitwise, forward and backward", "[cpu][ops][dense]") {
  // float64 runs the same GEMM either way. float32's fused GEMM (a oneDNN matmul primitive) may
  // add the products in another order than dnnl_sgemm: with inputs that are multiples of 1/8
  // below 1 every partial sum is exact in float32, so any order gives the same bits and what is
  // compared is the epilogue and the backward (whose GEMMs are the same calls either way).
  for (const DType dtype : {DType::kFloat32, DType::kFloat64}) {
    for (const DenseCase& c : kCases) {
      for (const bool with_bias : {true, false}) {
        for (const bool relu : {true, false}) {
          INFO(dtype << " x [" << c.m << ", " << c.k << "] @ [" << c.k << ", " << c.n << "]"
                     << (with_bias ? " + bias" : "") << (relu ? ", relu" : ", linear"));
          auto input = [&](const Shape& shape, uint64_t seed) {
            const Tensor t = random_tensor(shape, seed, dtype);
            return dtype == DType::kFloat64 ? t : eighths(t);
          };
          const Tensor x = input({c.m, c.k}, /*seed=*/1);
          const Tensor kernel = input({c.k, c.n}, /*seed=*/2);
          const Tensor bias = with_bias ? input({c.n}, /*seed=*/3) : Tensor();
          const Grads want = run(unfused, x, kernel, bias, relu);
          const Grads got = run(fused, x, kernel, bias, relu);
          require_equal(got.y, want.y);
          require_equal(got.x, want.x);
          require_equal(got.kernel, want.kernel);
          require_equal(got.bias, want.bias);
        }
      }
    }
  }
}

TEST_CASE("float32 dense stays within the summation-order bound of the composition",
          "[cpu][ops][dense]") {
  // Two float32 sums of the same K + 1 terms (products and bias) in different orders each lie
  // within gamma(K + 1) * sum|term| of the exact value, gamma(n) = n u / (1 - n u), u = 2^-24
  // (Higham, Accuracy and Stability of Numerical Algorithms, 3.1); they differ by at most twice
  // that. ReLU does not widen a difference.
  for (const DenseCase& c : kCases) {
    for (const bool relu : {true, false}) {
      INFO("x [" << c.m << ", " << c.k << "] @ [" << c.k << ", " << c.n << "] + bias"
                 << (relu ? ", relu" : ", linear"));
      const Tensor x = random_tensor({c.m, c.k}, /*seed=*/4, DType::kFloat32);
      const Tensor kernel = random_tensor({c.k, c.n}, /*seed=*/5, DType::kFloat32);
      const Tensor bias = random_tensor({c.n}, /*seed=*/6, DType::kFloat32);
      const std::vector<double> got = values(fused(x, kernel, bias, relu));
      const std::vector<double> want = values(unfused(x, kernel, bias, relu));
      const std::vector<double> magnitude =
          values(ops::add(ops::matmul(ops::cast(ops::abs(x), DType::kFloat64),
                                      ops::cast(ops::abs(kernel), DType::kFloat64)),
                          ops::cast(ops::abs(bias), DType::kFloat64)));
      const double u = std::ldexp(1.0, -24), terms = static_cast<double>(c.k + 1);
      const double gamma = terms * u / (1.0 - terms * u);
      REQUIRE(got.size() == want.size());
      size_t bad = 0;
      for (size_t i = 0; i < got.size(); ++i)
        if (std::abs(got[i] - want[i]) > 2.0 * gamma * magnitude[i]) ++bad;
      CHECK(bad == 0);
    }
  }
}

TEST_CASE("gradients of dense", "[cpu][ops][grad][dense]") {
  for (const bool relu : {true, false}) {
    const auto activation = relu ? ops::FusedActivation::kRelu : ops::FusedActivation::kLinear;
    INFO((relu ? "relu" : "linear"));
    const Tensor x = random_tensor({4, 5}, /*seed=*/11);
    const Tensor kernel = random_tensor({5, 3}, /*seed=*/12);
    const Tensor bias = random_tensor({3}, /*seed=*/13);
    check_gradients(
        [&](const std::vector<Tensor>& in) { return ops::dense(in[0], in[1], in[2], activation); },
        {x, kernel, bias});
    check_gradients(
        [&](const std::vector<Tensor>& in) {
          return ops::dense(in[0], in[1], Tensor(), activation);
        },
        {x, kernel});
  }
}

TEST_CASE("dense records one node and no input gradient for an untracked input",
          "[cpu][ops][dense]") {
  const Tensor x = random_tensor({6, 4}, /*seed=*/21);
  const Tensor kernel = random_tensor({4, 3}, /*seed=*/22);
  const Tensor bias = random_tensor({3}, /*seed=*/23);
  const Tensor g = random_tensor({6, 3}, /*seed=*/24);

  SECTION("a first layer: only the kernel and the bias are tracked") {
    NodeRecorder recorder({kernel, bias});
    ops::dense(x, kernel, bias, ops::FusedActivation::kRelu);
    REQUIRE(recorder.ops() == std::vector<std::string>{"dense"});
    std::vector<Tensor> grads;
    {
      ops::NoRecordGuard no_record;
      grads = recorder.backward(0)({g});
    }
    REQUIRE(grads.size() == 3);
    REQUIRE_FALSE(grads[0].defined());  // the input GEMM did not run
    REQUIRE(grads[1].shape() == kernel.shape());
    REQUIRE(grads[2].shape() == bias.shape());
  }
  SECTION("a tracked input gets its gradient") {
    NodeRecorder recorder({x, kernel, bias});
    ops::dense(x, kernel, bias, ops::FusedActivation::kRelu);
    std::vector<Tensor> grads;
    {
      ops::NoRecordGuard no_record;
      grads = recorder.backward(0)({g});
    }
    REQUIRE(grads[0].shape() == x.shape());
  }
  SECTION("through a tape, the untracked input has no gradient and the others are right") {
    GradientTape tape;
    tape.watch(kernel);
    tape.watch(bias);
    const Tensor loss = ops::sum(ops::mul(ops::dense(x, kernel, bias), g));
    const std::vector<Tensor> grads = tape.gradient(loss, std::vector<Tensor>{x, kernel, bias});
    REQUIRE_FALSE(grads[0].defined());
    require_close(grads[1], ops::matmul(x, g, /*transpose_a=*/true), 1e-12, 1e-12);
    require_close(grads[2], ops::sum(g, /*axis=*/0), 1e-12, 1e-12);
  }
}

TEST_CASE("dense refuses mismatched shapes and dtypes, naming them", "[cpu][ops][dense]") {
  const Tensor x = Tensor::ones({2, 3}, DType::kFloat32);
  const Tensor kernel = Tensor::ones({3, 4}, DType::kFloat32);
  REQUIRE_THROWS_WITH(ops::dense(x, Tensor::ones({2, 4}, DType::kFloat32)),
                      Catch::Contains("[2, 3]") && Catch::Contains("[2, 4]"));
  REQUIRE_THROWS_WITH(ops::dense(x, kernel, Tensor::ones({3}, DType::kFloat32)),
                      Catch::Contains("bias of shape [3]"));
  REQUIRE_THROWS_WITH(ops::dense(x, Tensor::ones({3, 4}, DType::kFloat64)),
                      Catch::Contains("float64"));
  REQUIRE_THROWS_WITH(
      ops::dense(Tensor::ones({2, 3}, DType::kInt32), Tensor::ones({3, 4}, DType::kInt32)),
      Catch::Contains("int32"));
}
