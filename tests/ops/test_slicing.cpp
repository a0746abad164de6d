// Slicing along any axis, split, tril, and the sparse cross-entropy over a language model's
// [B, T, V] logits: values against host loops, gradients against finite differences, errors.
#include <catch2/catch.hpp>
#include <vector>

#include "ops/gradcheck.h"
#include "ops/ops_testing.h"

using namespace tandem;
using tandem::testing::check_gradients;
using tandem::testing::random_tensor;
using tandem::testing::require_close;
using tandem::testing::unravel;
using tandem::testing::values;

namespace {

using In = std::vector<Tensor>;

/// x[..., begin:end, ...] along `axis`, on the host.
std::vector<double> reference_slice(const Tensor& x, int64_t axis, int64_t begin, int64_t end) {
  const std::vector<double> v = values(x);
  std::vector<double> out;
  for (int64_t i = 0; i < x.numel(); ++i) {
    const int64_t at = unravel(i, x.shape())[static_cast<size_t>(axis)];
    if (at >= begin && at < end) out.push_back(v[static_cast<size_t>(i)]);
  }
  return out;
}

}  // namespace

TEST_CASE("slice along any axis takes x[..., begin:end, ...]", "[cpu][ops]") {
  const Tensor x = random_tensor({3, 4, 5}, 71);
  for (int64_t axis = 0; axis < 3; ++axis)
    for (const auto& [begin, end] :
         std::vector<std::pair<int64_t, int64_t>>{{0, 2}, {1, 3}, {2, 2}}) {
      INFO("axis " << axis << " [" << begin << ", " << end << ")");
      const Tensor y = ops::slice(x, axis, begin, end);
      std::vector<int64_t> dims = x.shape().dims();
      dims[static_cast<size_t>(axis)] = end - begin;
      REQUIRE(y.shape() == Shape(dims));
      require_close(y, reference_slice(x, axis, begin, end));
      // Negative axes count from the end.
      require_close(ops::slice(x, axis - 3, begin, end), reference_slice(x, axis, begin, end));
    }
  // Leading axes of size 1: a view of x's storage.
  const Tensor row = random_tensor({1, 6, 2}, 72);
  CHECK(ops::slice(row, 1, 2, 5).data<double>() == row.data<double>() + 2 * 2);
}

TEST_CASE("gradients of slice along an axis and of split", "[cpu][ops][grad]") {
  const Tensor x = random_tensor({2, 5, 3}, 73);
  for (int64_t axis = 0; axis < 3; ++axis) {
    INFO("axis " << axis);
    check_gradients([=](const In& v) { return ops::slice(v[0], axis, 1, 2); }, {x});
  }
  // The parts of a split, used unevenly: each part's gradient lands in its place.
  check_gradients(
      [](const In& v) {
        const std::vector<Tensor> parts = ops::split(v[0], {1, 3, 1}, 1);
        return ops::add(ops::mul(parts[0], 2.0), ops::sum(ops::square(parts[1]), 1, true)) +
               ops::mul(parts[2], parts[0]);
      },
      {x});
}

TEST_CASE("split into sizes or equal parts, with errors naming the shape", "[cpu][ops]") {
  const Tensor x = random_tensor({2, 6}, 74);
  const std::vector<Tensor> three = ops::split(x, 3, -1);
  REQUIRE(three.size() == 3);
  for (int64_t i = 0; i < 3; ++i) {
    REQUIRE(three[static_cast<size_t>(i)].shape() == Shape{2, 2});
    require_close(three[static_cast<size_t>(i)], reference_slice(x, 1, 2 * i, 2 * i + 2));
  }
  const std::vector<Tensor> sizes = ops::split(x, {1, 0, 5}, 1);
  CHECK(sizes[0].shape() == Shape{2, 1});
  CHECK(sizes[1].shape() == Shape{2, 0});
  CHECK(sizes[2].shape() == Shape{2, 5});
  CHECK_THROWS_WITH(ops::split(x, 4, 1), Catch::Contains("do not split into 4 equal parts") &&
                                             Catch::Contains("[2, 6]"));
  CHECK_THROWS_WITH(ops::split(x, {2, 3}, 1), Catch::Contains("adding up to 5") &&
                                                  Catch::Contains("the 6 entries of axis 1"));
  CHECK_THROWS_WITH(ops::slice(x, 2, 0, 1), Catch::Contains("axis 2 is out of range"));
  CHECK_THROWS_WITH(ops::slice(x, 1, 4, 7), Catch::Contains("[4, 7) is not within the 6"));
}

TEST_CASE("tril keeps the lower triangle, as numpy.tril", "[cpu][ops]") {
  const Tensor x = random_tensor({2, 3, 4}, 75);
  for (const int64_t diagonal : {-1, 0, 1}) {
    INFO("diagonal " << diagonal);
    std::vector<double> expected = values(x);
    for (int64_t i = 0; i < x.numel(); ++i) {
      const std::vector<int64_t> at = unravel(i, x.shape());
      if (at[2] - at[1] > diagonal) expected[static_cast<size_t>(i)] = 0.0;
    }
    require_close(ops::tril(x, diagonal), expected);
    check_gradients([=](const In& v) { return ops::tril(v[0], diagonal); }, {x});
  }
  // Of ones, the causal mask: row i has i + 1 ones.
  const std::vector<double> mask = values(ops::tril(Tensor::full({4, 4}, 1.0)));
  CHECK(mask == std::vector<double>{1, 0, 0, 0, 1, 1, 0, 0, 1, 1, 1, 0, 1, 1, 1, 1});
  CHECK_THROWS_WITH(ops::tril(Tensor::zeros({3})), Catch::Contains("rank >= 2"));
}

TEST_CASE("sparse cross-entropy over [B, T, V] logits equals the rows' losses", "[cpu][ops]") {
  const Tensor logits = random_tensor({2, 3, 5}, 76, DType::kFloat64, -3, 3);
  const Tensor labels = Tensor::from_vector<int64_t>({0, 4, 2, 1, 3, 3}, {2, 3});
  const Tensor loss = ops::sparse_softmax_cross_entropy(logits, labels);
  REQUIRE(loss.shape() == Shape{2, 3});
  const Tensor rows =
      ops::sparse_softmax_cross_entropy(ops::reshape(logits, {6, 5}), ops::reshape(labels, {6}));
  require_close(loss, ops::reshape(rows, {2, 3}), 0, 0);
  check_gradients([=](const In& v) { return ops::sparse_softmax_cross_entropy(v[0], labels); },
                  {logits});
  CHECK_THROWS_WITH(ops::sparse_softmax_cross_entropy(logits, Tensor::zeros({2, 4}, DType::kInt64)),
                    Catch::Contains("[2, 3, 5]") && Catch::Contains("[2, 4]"));
}
