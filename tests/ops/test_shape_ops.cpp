// Shape ops: reshape, flatten and slice as views, concat along axis 0, and transposes under
// every permutation path (matrix tiles, batched matrices, general) for every element size.
#include <catch2/catch.hpp>
#include <numeric>

#include "ops/ops_testing.h"

using namespace tandem;
using tandem::testing::random_tensor;
using tandem::testing::require_close;
using tandem::testing::unravel;
using tandem::testing::values;

namespace {

/// x with its axes permuted, on the host.
std::vector<double> reference_transpose(const Tensor& x, const std::vector<int64_t>& perm) {
  std::vector<int64_t> dims;
  for (int64_t p : perm) dims.push_back(x.dim(p));
  const Shape out(dims);
  const std::vector<double> v = values(x);
  const std::vector<int64_t> strides = x.shape().strides();
  std::vector<double> result(v.size());
  for (int64_t i = 0; i < out.numel(); ++i) {
    const std::vector<int64_t> index = unravel(i, out);
    int64_t offset = 0;
    for (size_t k = 0; k < perm.size(); ++k) offset += index[k] * strides[perm[k]];
    result[i] = v[offset];
  }
  return result;
}

}  // namespace

TEST_CASE("reshape and flatten are views", "[cpu][ops]") {
  const Tensor x = random_tensor({2, 3, 4}, 31);
  const Tensor y = ops::reshape(x, {6, 4});
  REQUIRE(y.shape() == Shape{6, 4});
  REQUIRE(y.shares_storage_with(x));
  REQUIRE(values(y) == values(x));
  REQUIRE(ops::reshape(x, {4, -1}).shape() == Shape{4, 6});
  REQUIRE(ops::reshape(x, {-1}).shape() == Shape{24});
  REQUIRE(x.reshape({2, 12}).shape() == Shape{2, 12});
  REQUIRE(ops::flatten(x).shape() == Shape{2, 12});
  REQUIRE(ops::flatten(x).shares_storage_with(x));
  REQUIRE(ops::flatten(Tensor::zeros({0, 5, 2})).shape() == Shape{0, 10});
  REQUIRE(ops::flatten(Tensor::zeros({3})).shape() == Shape{3, 1});
  REQUIRE_THROWS_WITH(ops::reshape(x, {5, 5}), Catch::Contains("reshape") &&
                                                   Catch::Contains("[2, 3, 4]") &&
                                                   Catch::Contains("[5, 5]"));
  REQUIRE_THROWS_WITH(ops::reshape(x, {-1, 5}), Catch::Contains("[-1, 5]"));
  REQUIRE_THROWS_WITH(ops::reshape(x, {-1, -1}), Catch::Contains("reshape"));
  REQUIRE_THROWS_WITH(ops::flatten(Tensor::scalar(1.0)), Catch::Contains("flatten"));
}

TEST_CASE("slice takes rows as a view", "[cpu][ops]") {
  const Tensor x = Tensor::from_vector<int32_t>({0, 1, 2, 3, 4, 5, 6, 7}, {4, 2});
  const Tensor y = ops::slice(x, 1, 3);
  REQUIRE(y.shape() == Shape{2, 2});
  REQUIRE(y.to_vector<int32_t>() == std::vector<int32_t>{2, 3, 4, 5});
  REQUIRE(y.data<int32_t>() == x.data<int32_t>() + 2);
  REQUIRE(x.slice(3, 4).to_vector<int32_t>() == std::vector<int32_t>{6, 7});
  REQUIRE(x.slice(2, 2).numel() == 0);
  REQUIRE_THROWS_WITH(ops::slice(x, 2, 5), Catch::Contains("slice") && Catch::Contains("[2, 5)") &&
                                               Catch::Contains("[4, 2]"));
  REQUIRE_THROWS_WITH(ops::slice(x, 3, 1), Catch::Contains("slice"));
}

TEST_CASE("concat joins along axis 0", "[cpu][ops]") {
  const Tensor a = Tensor::from_vector<double>({1, 2, 3, 4}, {2, 2});
  const Tensor b = Tensor::from_vector<double>({5, 6}, {1, 2});
  const Tensor c = Tensor::zeros({0, 2}, DType::kFloat64);
  const Tensor y = ops::concat({a, c, b, a});
  REQUIRE(y.shape() == Shape{5, 2});
  require_close(y, {1, 2, 3, 4, 5, 6, 1, 2, 3, 4});
  REQUIRE(ops::concat({a}, -2).shape() == Shape{2, 2});
  REQUIRE_THROWS_WITH(ops::concat({a, b}, 1), Catch::Contains("concat") &&
                                                  Catch::Contains("axis 0") &&
                                                  Catch::Contains("axis 1"));
  REQUIRE_THROWS_WITH(ops::concat({a, Tensor::zeros({1, 3}, DType::kFloat64)}),
                      Catch::Contains("[2, 2]") && Catch::Contains("[1, 3]"));
  REQUIRE_THROWS_WITH(ops::concat({a, Tensor::zeros({1, 2})}),
                      Catch::Contains("float64") && Catch::Contains("float32"));
  REQUIRE_THROWS_WITH(ops::concat({}), Catch::Contains("concat"));
}

TEST_CASE("transpose permutes axes for every element size", "[cpu][ops]") {
  const std::vector<std::pair<Shape, std::vector<int64_t>>> cases = {
      {{5, 7}, {1, 0}},
      {{130, 67}, {1, 0}},             // several tiles, ragged edges
      {{2, 3, 4}, {0, 2, 1}},          // batched matrices
      {{2, 3, 4}, {2, 0, 1}},          // merges to a matrix transpose
      {{2, 3, 4}, {1, 0, 2}},          // general, contiguous inner runs
      {{2, 3, 4, 5}, {3, 1, 0, 2}},    // general
      {{2, 1, 3, 1}, {3, 2, 1, 0}},    // size-1 axes drop out
      {{2, 3, 4}, {0, 1, 2}},          // identity
      {{40, 30, 60}, {2, 0, 1}},       // parallel
      {{6, 50, 70, 3}, {0, 3, 1, 2}},  // NHWC -> NCHW
  };
  for (const auto& [shape, perm] : cases) {
    INFO("shape " << shape << " perm " << Shape(perm));
    const Tensor x = random_tensor(shape, 32, DType::kFloat64, 0, 100);  // uint8-safe
    const std::vector<double> expected = reference_transpose(x, perm);
    for (const DType dtype : {DType::kFloat64, DType::kFloat32, DType::kInt32, DType::kUInt8}) {
      const Tensor xt = ops::cast(x, dtype);
      const Tensor y = ops::transpose(xt, perm);
      REQUIRE(y.dtype() == dtype);
      require_close(y, reference_transpose(xt, perm), 0, 0);
    }
    require_close(ops::transpose(x, perm), expected, 0, 0);
  }
  const Tensor m = Tensor::from_vector<int64_t>({1, 2, 3, 4, 5, 6}, {2, 3});
  REQUIRE(ops::transpose(m).shape() == Shape{3, 2});
  REQUIRE(ops::transpose(m).to_vector<int64_t>() == std::vector<int64_t>{1, 4, 2, 5, 3, 6});
  REQUIRE(ops::transpose(m, {-1, -2}).to_vector<int64_t>() ==
          ops::transpose(m).to_vector<int64_t>());
  REQUIRE_THROWS_WITH(ops::transpose(Tensor::zeros({2, 3, 4})),
                      Catch::Contains("matrix") && Catch::Contains("[2, 3, 4]"));
  REQUIRE_THROWS_WITH(ops::transpose(m, {0, 0}),
                      Catch::Contains("[0, 0]") && Catch::Contains("[2, 3]"));
  REQUIRE_THROWS_WITH(ops::transpose(m, {0}), Catch::Contains("transpose"));
}
