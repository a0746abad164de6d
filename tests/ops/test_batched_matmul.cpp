// Batched matmul: [..., M, K] x [..., K, N] with numpy's broadcasting of the batch dimensions and
// every transpose flag, against a naive float64 loop; gradients against finite differences
// (broadcast operands sum theirs over the repeated dimensions); float32 and the 16-bit types
// equal the 2-D matmul of each matrix; and the argument errors.
#include <catch2/catch.hpp>
#include <vector>

#include "ops/gradcheck.h"
#include "ops/ops_testing.h"

using namespace tandem;
using tandem::testing::broadcast_offset;
using tandem::testing::check_gradients;
using tandem::testing::random_tensor;
using tandem::testing::require_close;
using tandem::testing::unravel;
using tandem::testing::values;

namespace {

using In = std::vector<Tensor>;

Shape batch_of(const Shape& s) {
  return Shape(std::vector<int64_t>(s.dims().begin(), s.dims().end() - 2));
}

/// The shape of an operand whose matrix is [rows, cols] before the transpose flag.
Shape operand(std::vector<int64_t> batch, int64_t rows, int64_t cols, bool transposed) {
  batch.push_back(transposed ? cols : rows);
  batch.push_back(transposed ? rows : cols);
  return Shape(std::move(batch));
}

/// op(a) @ op(b) by the definition, batch by batch, broadcasting as numpy.
std::vector<double> reference_batched(const Tensor& a, const Tensor& b, bool ta, bool tb,
                                      const Shape& batch) {
  const std::vector<double> av = values(a), bv = values(b);
  const int64_t m = ta ? a.dim(-1) : a.dim(-2), k = ta ? a.dim(-2) : a.dim(-1);
  const int64_t n = tb ? b.dim(-2) : b.dim(-1);
  const Shape batch_a = batch_of(a.shape()), batch_b = batch_of(b.shape());
  std::vector<double> c;
  for (int64_t flat = 0; flat < batch.numel(); ++flat) {
    const std::vector<int64_t> index = unravel(flat, batch);
    const int64_t oa = broadcast_offset(index, batch_a) * m * k;
    const int64_t ob = broadcast_offset(index, batch_b) * k * n;
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double total = 0;
        for (int64_t p = 0; p < k; ++p)
          total += (ta ? av[oa + p * m + i] : av[oa + i * k + p]) *
                   (tb ? bv[ob + j * k + p] : bv[ob + p * n + j]);
        c.push_back(total);
      }
  }
  return c;
}

struct Case {
  std::vector<int64_t> batch_a, batch_b, batch;  // batch dims of a, b and of the result
};

// Equal batches, both broadcasting, a missing leading dimension, a single right-hand matrix
// (one GEMM over all rows), a single left-hand matrix, batch dimensions of 1, and none at all.
const std::vector<Case> kCases = {
    {{2, 3}, {2, 3}, {2, 3}}, {{2, 1}, {1, 3}, {2, 3}}, {{2, 3}, {3}, {2, 3}},
    {{3, 2}, {}, {3, 2}},     {{}, {2}, {2}},           {{1}, {1, 1}, {1, 1}},
    {{4}, {1}, {4}},          {{0}, {0}, {0}},          {{0, 2}, {}, {0, 2}},
};

}  // namespace

TEST_CASE("batched matmul equals the definition for every broadcast and transpose", "[cpu][ops]") {
  const int64_t m = 4, k = 5, n = 3;
  uint64_t seed = 100;
  for (const Case& c : kCases)
    for (const bool ta : {false, true})
      for (const bool tb : {false, true}) {
        const Tensor a = random_tensor(operand(c.batch_a, m, k, ta), ++seed);
        const Tensor b = random_tensor(operand(c.batch_b, k, n, tb), ++seed);
        INFO("a " << a.shape() << " b " << b.shape() << " transpose_a=" << ta
                  << " transpose_b=" << tb);
        const Tensor out = ops::matmul(a, b, ta, tb);
        std::vector<int64_t> dims = c.batch;
        dims.push_back(m);
        dims.push_back(n);
        REQUIRE(out.shape() == Shape(dims));
        require_close(out, reference_batched(a, b, ta, tb, Shape(c.batch)), 1e-12, 1e-12);
      }
}

TEST_CASE("batched matmul of float32, bfloat16 and float16 equals the matmul of each matrix",
          "[cpu][ops]") {
  const int64_t m = 7, k = 33, n = 9;
  for (const DType dtype : {DType::kFloat32, DType::kBFloat16, DType::kFloat16})
    for (const bool ta : {false, true})
      for (const bool tb : {false, true}) {
        INFO(dtype << " transpose_a=" << ta << " transpose_b=" << tb);
        const Tensor a =
            ops::cast(random_tensor(operand({2, 3}, m, k, ta), 7, DType::kFloat32), dtype);
        const Tensor b =
            ops::cast(random_tensor(operand({1, 3}, k, n, tb), 8, DType::kFloat32), dtype);
        const Tensor out = ops::matmul(a, b, ta, tb);
        REQUIRE(out.dtype() == dtype);
        REQUIRE(out.shape() == Shape{2, 3, m, n});
        for (int64_t i = 0; i < 2; ++i)
          for (int64_t j = 0; j < 3; ++j) {
            const Tensor ai = ops::reshape(
                ops::slice(ops::reshape(a, Shape{6, a.dim(2), a.dim(3)}), i * 3 + j, i * 3 + j + 1),
                Shape{a.dim(2), a.dim(3)});
            const Tensor bj =
                ops::reshape(ops::slice(b.reshape(Shape{3, b.dim(2), b.dim(3)}), j, j + 1),
                             Shape{b.dim(2), b.dim(3)});
            const Tensor oij = ops::reshape(
                ops::slice(ops::reshape(out, Shape{6, m, n}), i * 3 + j, i * 3 + j + 1),
                Shape{m, n});
            // Bitwise: each matrix is the same GEMM as the 2-D op runs.
            CHECK(values(oij) == values(ops::matmul(ai, bj, ta, tb)));
          }
      }
  // A single right-hand matrix folds the batch into the rows: still each row's product.
  const Tensor x = random_tensor({2, 5, 16}, 9, DType::kFloat32);
  const Tensor w = random_tensor({16, 8}, 10, DType::kFloat32);
  require_close(ops::matmul(x, w), reference_batched(x, w, false, false, Shape{2}), 1e-5, 1e-5);
}

TEST_CASE("gradients of batched matmul, broadcast operands summed over the repeats",
          "[cpu][ops][grad]") {
  uint64_t seed = 300;
  for (const Case& c : kCases) {
    if (Shape(c.batch).numel() == 0) continue;
    for (const bool ta : {false, true})
      for (const bool tb : {false, true}) {
        const Tensor a = random_tensor(operand(c.batch_a, 3, 4, ta), ++seed);
        const Tensor b = random_tensor(operand(c.batch_b, 4, 2, tb), ++seed);
        INFO("a " << a.shape() << " b " << b.shape() << " transpose_a=" << ta
                  << " transpose_b=" << tb);
        check_gradients([=](const In& v) { return ops::matmul(v[0], v[1], ta, tb); }, {a, b});
      }
  }
}

TEST_CASE("batched matmul names the shapes it cannot multiply", "[cpu][ops]") {
  const Tensor v = Tensor::zeros({4});
  const Tensor m = Tensor::zeros({4, 4});
  CHECK_THROWS_WITH(ops::matmul(v, m), Catch::Contains("rank 2 or more") &&
                                           Catch::Contains("[4]") && Catch::Contains("[4, 4]"));
  CHECK_THROWS_WITH(ops::matmul(Tensor::zeros({2, 4, 3}), Tensor::zeros({3, 3, 5})),
                    Catch::Contains("batch dimensions [2]") && Catch::Contains("[3]") &&
                        Catch::Contains("do not broadcast"));
  CHECK_THROWS_WITH(ops::matmul(Tensor::zeros({2, 4, 3}), Tensor::zeros({2, 4, 5})),
                    Catch::Contains("inner dimensions 3 and 4"));
  CHECK_THROWS_WITH(
      ops::matmul(Tensor::zeros({2, 4, 3}), Tensor::zeros({2, 3, 5}, DType::kFloat64)),
      Catch::Contains("float64"));
}
