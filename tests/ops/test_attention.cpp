// scaled_dot_product_attention: the fused op against its composition (matmul, the masks as -inf,
// softmax, dropout, matmul) in float64, forward and backward, across tiles (sequences longer than
// one tile and not multiples of it), causal and masked, with dropout drawing the same mask as
// ops::dropout; finite differences; float32 and the 16-bit types against float64; rows with
// nothing to attend; and the argument errors.
#include <catch2/catch.hpp>
#include <cmath>
#include <vector>

#include "ops/gradcheck.h"
#include "ops/ops_testing.h"

using namespace tandem;
using tandem::testing::check_gradients;
using tandem::testing::random_tensor;
using tandem::testing::require_close;
using tandem::testing::values;

namespace {

using In = std::vector<Tensor>;

/// [tq, tk] bool: j <= i.
Tensor lower_triangle(int64_t tq, int64_t tk) {
  std::vector<uint8_t> bits;
  for (int64_t i = 0; i < tq; ++i)
    for (int64_t j = 0; j < tk; ++j) bits.push_back(j <= i ? 1 : 0);
  return ops::cast(Tensor::from_vector<uint8_t>(bits, Shape{tq, tk}), DType::kBool);
}

/// The attention written as separate ops: what the fused op must equal.
Tensor composed(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, const Tensor& mask,
                double rate = 0.0, Generator* generator = nullptr) {
  Tensor scores = ops::mul(ops::matmul(q, k, false, true), 1.0 / std::sqrt(double(q.dim(-1))));
  Tensor visible = mask;
  if (causal) {
    const Tensor triangle = lower_triangle(q.dim(-2), k.dim(-2));
    visible = visible.defined() ? ops::logical_and(visible, triangle) : triangle;
  }
  if (visible.defined())
    scores = ops::where(visible, scores, Tensor::full({}, -INFINITY, scores.dtype()));
  Tensor p = ops::softmax(scores, -1);
  if (rate > 0) p = ops::dropout(p, rate, *generator);
  return ops::matmul(p, v);
}

struct Case {
  Shape q, k, v;
  bool causal;
  Shape mask;  // rank 0: no mask
};

const std::vector<Case> kCases = {
    {{2, 3, 5, 4}, {2, 3, 5, 4}, {2, 3, 5, 4}, false, {}},
    {{2, 3, 5, 4}, {2, 3, 5, 4}, {2, 3, 5, 4}, true, {}},
    // Across tiles of 64, neither length a multiple of it; another value depth.
    {{2, 70, 8}, {2, 130, 8}, {2, 130, 6}, false, {}},
    {{1, 2, 150, 8}, {1, 2, 150, 8}, {1, 2, 150, 5}, true, {}},
    // A key-padding mask [Tk], a per-batch mask [B, 1, Tq, Tk], both with the causal one.
    {{2, 3, 67, 4}, {2, 3, 67, 4}, {2, 3, 67, 4}, true, {67}},
    {{2, 3, 9, 4}, {2, 3, 11, 4}, {2, 3, 11, 3}, false, {2, 1, 9, 11}},
};

/// A mask of `shape` that hides about a third of the keys, never all of a row's.
Tensor random_mask(const Shape& shape, uint64_t seed) {
  Tensor u = random_tensor(shape, seed, DType::kFloat64, 0.0, 1.0);
  std::vector<double> x = values(u);
  const int64_t tk = shape[-1];
  for (size_t i = 0; i < x.size(); i += static_cast<size_t>(tk)) x[i] = 1.0;  // key 0 visible
  return ops::greater(Tensor::from_vector<double>(x, shape), 0.33);
}

}  // namespace

/// The output's shape: q's with v's depth.
Shape output_shape(const Tensor& q, const Tensor& v) {
  std::vector<int64_t> dims = q.shape().dims();
  dims.back() = v.dim(-1);
  return Shape(dims);
}

/// Output and the gradients of sum(out * weight) with respect to q, k and v.
std::vector<Tensor> run_with_gradients(const std::function<Tensor(const In&)>& f, const In& qkv,
                                       const Tensor& weight) {
  GradientTape tape;
  for (const Tensor& x : qkv) tape.watch(x);
  const Tensor out = f(qkv);
  std::vector<Tensor> result{out};
  for (const Tensor& g : tape.gradient(ops::sum(ops::mul(out, weight)), qkv)) result.push_back(g);
  return result;
}

TEST_CASE("fused attention equals its composition in float64, forward and backward", "[cpu][ops]") {
  uint64_t seed = 500;
  for (const Case& c : kCases) {
    const Tensor q = random_tensor(c.q, ++seed, DType::kFloat64, -2, 2);
    const Tensor k = random_tensor(c.k, ++seed, DType::kFloat64, -2, 2);
    const Tensor v = random_tensor(c.v, ++seed);
    const Tensor mask = c.mask.rank() > 0 ? random_mask(c.mask, ++seed) : Tensor();
    const Tensor weight = random_tensor(output_shape(q, v), ++seed);
    INFO("q " << c.q << " k " << c.k << " v " << c.v << " causal " << c.causal << " mask "
              << c.mask);
    const std::vector<Tensor> fused = run_with_gradients(
        [&](const In& x) {
          return ops::scaled_dot_product_attention(x[0], x[1], x[2],
                                                   {.causal = c.causal, .mask = mask});
        },
        {q, k, v}, weight);
    const std::vector<Tensor> reference = run_with_gradients(
        [&](const In& x) { return composed(x[0], x[1], x[2], c.causal, mask); }, {q, k, v}, weight);
    for (size_t i = 0; i < 4; ++i) {
      INFO((i == 0 ? "output" : i == 1 ? "dq" : i == 2 ? "dk" : "dv"));
      require_close(fused[i], reference[i], 1e-11, 1e-12);
    }
  }
}

TEST_CASE("fused attention's gradients match finite differences", "[cpu][ops][grad]") {
  const Tensor q = random_tensor({2, 6, 3}, 31), k = random_tensor({2, 7, 3}, 32);
  const Tensor v = random_tensor({2, 7, 2}, 33);
  const Tensor mask = random_mask({6, 7}, 34);
  for (const bool causal : {false, true}) {
    INFO("causal " << causal);
    check_gradients(
        [&](const In& x) {
          return ops::scaled_dot_product_attention(x[0], x[1], x[2],
                                                   {.causal = causal, .mask = mask, .scale = 0.7});
        },
        {q, k, v});
  }
}

TEST_CASE("fused attention's dropout is ops::dropout's mask on the probabilities", "[cpu][ops]") {
  const Tensor q = random_tensor({2, 2, 70, 4}, 41), k = random_tensor({2, 2, 70, 4}, 42);
  const Tensor v = random_tensor({2, 2, 70, 4}, 43);
  const Tensor weight = random_tensor({2, 2, 70, 4}, 44);
  for (const bool causal : {false, true}) {
    INFO("causal " << causal);
    Generator a(9, 3), b(9, 3);
    a.reserve(5);
    b.reserve(5);
    const std::vector<Tensor> fused = run_with_gradients(
        [&](const In& x) {
          return ops::scaled_dot_product_attention(
              x[0], x[1], x[2], {.causal = causal, .dropout_rate = 0.25, .generator = &a});
        },
        {q, k, v}, weight);
    const std::vector<Tensor> reference = run_with_gradients(
        [&](const In& x) { return composed(x[0], x[1], x[2], causal, Tensor(), 0.25, &b); },
        {q, k, v}, weight);
    CHECK(a == b);  // the same blocks of the stream consumed
    for (size_t i = 0; i < 4; ++i) require_close(fused[i], reference[i], 1e-11, 1e-12);
    // Not the attention without dropout.
    CHECK(values(fused[0]) !=
          values(ops::scaled_dot_product_attention(q, k, v, {.causal = causal})));
  }
  Generator g(1);
  CHECK_THROWS_WITH(ops::scaled_dot_product_attention(q, k, v, {.dropout_rate = 0.1}),
                    Catch::Contains("needs a generator"));
  CHECK_THROWS_WITH(
      ops::scaled_dot_product_attention(q, k, v, {.dropout_rate = 1.0, .generator = &g}),
      Catch::Contains("dropout_rate must be in [0, 1), got 1"));
}

TEST_CASE("fused attention in float32, bfloat16 and float16 stays near float64", "[cpu][ops]") {
  const Tensor q = random_tensor({3, 100, 16}, 51, DType::kFloat64, -2, 2);
  const Tensor k = random_tensor({3, 100, 16}, 52, DType::kFloat64, -2, 2);
  const Tensor v = random_tensor({3, 100, 16}, 53);
  const Tensor weight = random_tensor({3, 100, 16}, 54);
  const auto attend = [](const In& x) {
    return ops::scaled_dot_product_attention(x[0], x[1], x[2], {.causal = true});
  };
  const std::vector<Tensor> exact = run_with_gradients(attend, {q, k, v}, weight);
  for (const auto& [dtype, tolerance] : std::vector<std::pair<DType, double>>{
           {DType::kFloat32, 2e-5}, {DType::kBFloat16, 3e-2}, {DType::kFloat16, 4e-3}}) {
    INFO(dtype);
    const In low{ops::cast(q, dtype), ops::cast(k, dtype), ops::cast(v, dtype)};
    const std::vector<Tensor> got = run_with_gradients(attend, low, ops::cast(weight, dtype));
    for (size_t i = 0; i < 4; ++i) {
      INFO(i);
      REQUIRE(got[i].dtype() == dtype);
      // Relative to the largest magnitude of the exact values.
      double largest = 0;
      for (double x : values(exact[i])) largest = std::max(largest, std::abs(x));
      require_close(ops::cast(got[i], DType::kFloat64), exact[i], 0.0, tolerance * largest);
    }
  }
}

TEST_CASE("a query with no key to attend gets zeros and passes no gradient", "[cpu][ops]") {
  const Tensor q = random_tensor({1, 3, 4}, 61), k = random_tensor({1, 5, 4}, 62);
  const Tensor v = random_tensor({1, 5, 2}, 63);
  // Row 1 sees nothing; rows 0 and 2 see some keys.
  const Tensor mask =
      ops::cast(Tensor::from_vector<uint8_t>({1, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 0}, {3, 5}),
                DType::kBool);
  GradientTape tape;
  tape.watch(q);
  const Tensor out = ops::scaled_dot_product_attention(q, k, v, {.mask = mask});
  const std::vector<double> o = values(out);
  CHECK(o[2] == 0.0);
  CHECK(o[3] == 0.0);
  for (double x : o) CHECK(std::isfinite(x));
  const std::vector<double> dq = values(tape.gradient(ops::sum(out), q));
  for (size_t i = 4; i < 8; ++i) CHECK(dq[i] == 0.0);
  for (double x : dq) CHECK(std::isfinite(x));
}

TEST_CASE("scaled_dot_product_attention names the shapes it cannot take", "[cpu][ops]") {
  const Tensor q = Tensor::zeros({2, 5, 4});
  CHECK_THROWS_WITH(ops::scaled_dot_product_attention(q, Tensor::zeros({2, 5, 3}), q),
                    Catch::Contains("different depths") && Catch::Contains("[2, 5, 3]"));
  CHECK_THROWS_WITH(ops::scaled_dot_product_attention(q, q, Tensor::zeros({2, 6, 4})),
                    Catch::Contains("different numbers of keys"));
  CHECK_THROWS_WITH(ops::scaled_dot_product_attention(q, Tensor::zeros({3, 5, 4}), q),
                    Catch::Contains("leading dimensions"));
  CHECK_THROWS_WITH(ops::scaled_dot_product_attention(q, Tensor::zeros({5, 4}), q),
                    Catch::Contains("of one rank"));
  CHECK_THROWS_WITH(
      ops::scaled_dot_product_attention(q, q, q, {.mask = Tensor::zeros({3, 5}, DType::kBool)}),
      Catch::Contains("mask of shape [3, 5] does not broadcast to [2, 5, 5]"));
  CHECK_THROWS_WITH(ops::scaled_dot_product_attention(q, q, ops::cast(q, DType::kFloat64)),
                    Catch::Contains("float64"));
}
