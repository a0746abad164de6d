// Comparison, logical and selection ops against hand-computed values: greater, greater_equal,
// less, less_equal, not_equal (and equal, their model) under broadcasting, with NaN, in every
// dtype and with a scalar; logical_and, logical_or and logical_not; where, forward and
// backward (finite differences in float64); none of the comparisons records on a tape; the
// argument errors name the op and the values (inputs on different devices: tests/cuda).
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "ops/gradcheck.h"
#include "ops/ops_testing.h"

using namespace tandem;
using tandem::testing::check_gradients;
using tandem::testing::random_tensor;
using tandem::testing::require_close;
using In = std::vector<Tensor>;
using Bools = std::vector<int>;

namespace {

const double kNaN = std::numeric_limits<double>::quiet_NaN();
const double kInf = std::numeric_limits<double>::infinity();

struct Comparison {
  const char* name;
  Tensor (*op)(const Tensor&, const Tensor&);
  Tensor (*scalar_op)(const Tensor&, double);
  bool (*reference)(double, double);
};

const Comparison kComparisons[] = {
    {"equal", ops::equal, ops::equal, [](double a, double b) { return a == b; }},
    {"not_equal", ops::not_equal, ops::not_equal, [](double a, double b) { return a != b; }},
    {"greater", ops::greater, ops::greater, [](double a, double b) { return a > b; }},
    {"greater_equal", ops::greater_equal, ops::greater_equal,
     [](double a, double b) { return a >= b; }},
    {"less", ops::less, ops::less, [](double a, double b) { return a < b; }},
    {"less_equal", ops::less_equal, ops::less_equal, [](double a, double b) { return a <= b; }},
};

const DType kEveryDType[] = {DType::kFloat32, DType::kFloat64, DType::kInt32,    DType::kInt64,
                             DType::kUInt8,   DType::kBool,    DType::kBFloat16, DType::kFloat16};

/// `values` (shaped `shape`) as a tensor of `dtype`, converted from float64.
Tensor make(const std::vector<double>& values, const Shape& shape, DType dtype) {
  return ops::cast(Tensor::from_vector<double>(values, shape), dtype);
}

/// A bool tensor of 0/1 values.
Tensor flags(const std::vector<double>& values, const Shape& shape) {
  return make(values, shape, DType::kBool);
}

/// Requires `t` to be a bool tensor of shape `shape` holding `expected` (0/1, row-major).
void require_bools(const Tensor& t, const Shape& shape, const Bools& expected) {
  REQUIRE(t.dtype() == DType::kBool);
  REQUIRE(t.shape() == shape);
  REQUIRE(t.to_vector<int>() == expected);
}

}  // namespace

// ---- comparisons ----------------------------------------------------------------------------

TEST_CASE("comparisons against hand-computed values, with broadcasting", "[cpu][ops][compare]") {
  // a [2, 3] against b [3]: each row of a against the same b.
  const Tensor a = Tensor::from_vector<double>({1, 2, 3, 3, 2, 1}, {2, 3});
  const Tensor b = Tensor::from_vector<double>({2, 2, 2});
  require_bools(ops::greater(a, b), {2, 3}, {0, 0, 1, 1, 0, 0});
  require_bools(ops::greater_equal(a, b), {2, 3}, {0, 1, 1, 1, 1, 0});
  require_bools(ops::less(a, b), {2, 3}, {1, 0, 0, 0, 0, 1});
  require_bools(ops::less_equal(a, b), {2, 3}, {1, 1, 0, 0, 1, 1});
  require_bools(ops::not_equal(a, b), {2, 3}, {1, 0, 1, 1, 0, 1});
  require_bools(ops::equal(a, b), {2, 3}, {0, 1, 0, 0, 1, 0});

  // [2, 1] against [1, 3]: both operands broadcast, to [2, 3].
  const Tensor column = Tensor::from_vector<float>({1, 3}, {2, 1});
  const Tensor row = Tensor::from_vector<float>({0, 1, 2}, {1, 3});
  require_bools(ops::greater(column, row), {2, 3}, {1, 0, 0, 1, 1, 1});
  require_bools(ops::less_equal(column, row), {2, 3}, {0, 1, 1, 0, 0, 0});
  require_bools(ops::greater_equal(row, column), {2, 3}, {0, 1, 1, 0, 0, 0});
  require_bools(ops::not_equal(row, column), {2, 3}, {1, 0, 1, 1, 1, 1});

  // A rank-0 operand on either side, and a rank-3 broadcast of a [4] against [2, 1, 1].
  const Tensor two = Tensor::scalar(2.0, DType::kFloat64);
  require_bools(ops::less(two, b), {3}, {0, 0, 0});
  require_bools(ops::less(a, two), {2, 3}, {1, 0, 0, 0, 0, 1});
  const Tensor x = Tensor::from_vector<int32_t>({0, 1, 2, 3});
  const Tensor t = Tensor::from_vector<int32_t>({1, 2}, {2, 1, 1});
  require_bools(ops::greater(x, t), {2, 1, 4}, {0, 0, 1, 1, 0, 0, 0, 1});

  // Empty shapes give empty results.
  require_bools(ops::less(Tensor::zeros({0, 3}), Tensor::zeros({3})), {0, 3}, {});
}

TEST_CASE("comparisons with NaN are false except not_equal, and infinities order",
          "[cpu][ops][compare]") {
  for (DType dtype : {DType::kFloat32, DType::kFloat64, DType::kBFloat16, DType::kFloat16}) {
    INFO(dtype);
    // Every pair of {NaN, 1, inf, -inf} against NaN, and the infinities against finite values.
    const Tensor a = make({kNaN, 1, kNaN, kNaN, kInf, -kInf, kInf}, {7}, dtype);
    const Tensor b = make({1, kNaN, kNaN, kInf, 1, 1, kInf}, {7}, dtype);
    require_bools(ops::equal(a, b), {7}, {0, 0, 0, 0, 0, 0, 1});
    require_bools(ops::not_equal(a, b), {7}, {1, 1, 1, 1, 1, 1, 0});
    require_bools(ops::greater(a, b), {7}, {0, 0, 0, 0, 1, 0, 0});
    require_bools(ops::greater_equal(a, b), {7}, {0, 0, 0, 0, 1, 0, 1});
    require_bools(ops::less(a, b), {7}, {0, 0, 0, 0, 0, 1, 0});
    require_bools(ops::less_equal(a, b), {7}, {0, 0, 0, 0, 0, 1, 1});
    // A NaN scalar too.
    for (const Comparison& c : kComparisons) {
      INFO(c.name);
      require_bools(c.scalar_op(a, kNaN), {7}, Bools(7, c.reference(1.0, kNaN) ? 1 : 0));
    }
  }
  // -0 equals +0.
  const Tensor zeros = Tensor::from_vector<double>({-0.0, 0.0});
  require_bools(ops::equal(zeros, Tensor::from_vector<double>({0.0, -0.0})), {2}, {1, 1});
  require_bools(ops::less(zeros, Tensor::from_vector<double>({0.0, -0.0})), {2}, {0, 0});
}

TEST_CASE("every comparison in every dtype, against the host reference", "[cpu][ops][compare]") {
  // a [2, 4] against b [4]; values every dtype holds (bool: 0 and 1 only).
  const std::vector<double> av = {0, 1, 2, 7, 7, 2, 1, 0}, bv = {1, 1, 0, 7};
  const std::vector<double> a_bool = {0, 1, 1, 0, 1, 1, 0, 0}, b_bool = {1, 1, 0, 0};
  for (DType dtype : kEveryDType) {
    const bool is_bool = dtype == DType::kBool;
    const std::vector<double>& va = is_bool ? a_bool : av;
    const std::vector<double>& vb = is_bool ? b_bool : bv;
    const Tensor a = make(va, {2, 4}, dtype), b = make(vb, {4}, dtype);
    for (const Comparison& c : kComparisons) {
      INFO(c.name << " on " << dtype);
      Bools expected;
      for (size_t i = 0; i < va.size(); ++i)
        expected.push_back(c.reference(va[i], vb[i % vb.size()]) ? 1 : 0);
      require_bools(c.op(a, b), {2, 4}, expected);
      // Swapped operands: b broadcasts on the left.
      Bools swapped;
      for (size_t i = 0; i < va.size(); ++i)
        swapped.push_back(c.reference(vb[i % vb.size()], va[i]) ? 1 : 0);
      require_bools(c.op(b, a), {2, 4}, swapped);
    }
  }
  // Extremes of the integer types compare exactly (no detour through a float).
  const Tensor big = Tensor::from_vector<int64_t>({(int64_t{1} << 53) + 1, INT64_MAX, INT64_MIN});
  const Tensor near = Tensor::from_vector<int64_t>({int64_t{1} << 53, INT64_MAX - 1, INT64_MIN});
  require_bools(ops::greater(big, near), {3}, {1, 1, 0});
  require_bools(ops::not_equal(big, near), {3}, {1, 1, 0});
  const Tensor bytes = Tensor::from_vector<uint8_t>({0, 255, 128});
  require_bools(ops::less(bytes, Tensor::from_vector<uint8_t>({255})), {3}, {1, 0, 1});
}

TEST_CASE("16-bit comparisons see the rounded values exactly", "[cpu][ops][compare]") {
  // 1 + 2^-8 rounds to 1 in bfloat16 (8 significant bits) but not in float16 (11).
  const std::vector<double> a = {1.0 + 1.0 / 256.0}, b = {1.0};
  require_bools(ops::equal(make(a, {1}, DType::kBFloat16), make(b, {1}, DType::kBFloat16)), {1},
                {1});
  require_bools(ops::greater(make(a, {1}, DType::kFloat16), make(b, {1}, DType::kFloat16)), {1},
                {1});
}

TEST_CASE("comparisons with a scalar: the scalar takes the tensor's dtype", "[cpu][ops][compare]") {
  const Tensor x = Tensor::from_vector<float>({-1.5f, 0.f, 0.5f, 2.f});
  require_bools(ops::greater(x, 0.0), {4}, {0, 0, 1, 1});
  require_bools(ops::greater_equal(x, 0.5), {4}, {0, 0, 1, 1});
  require_bools(ops::less(x, 0.5), {4}, {1, 1, 0, 0});
  require_bools(ops::less_equal(x, -1.5), {4}, {1, 0, 0, 0});
  require_bools(ops::equal(x, 2.0), {4}, {0, 0, 0, 1});
  require_bools(ops::not_equal(x, 2.0), {4}, {1, 1, 1, 0});
  // float32 compares against the float32 rounding of the scalar (0.1f, not 0.1).
  require_bools(ops::equal(Tensor::from_vector<float>({0.1f}), 0.1), {1}, {1});
  // The scalar forms equal the tensor forms against a rank-0 tensor, in every dtype.
  for (DType dtype : kEveryDType) {
    const Tensor t = make({0, 1, 1, 0}, {2, 2}, dtype);
    for (const Comparison& c : kComparisons) {
      INFO(c.name << " on " << dtype);
      REQUIRE(c.scalar_op(t, 1.0).to_vector<int>() ==
              c.op(t, Tensor::scalar(1.0, dtype)).to_vector<int>());
    }
  }
  // Integers: exact scalars only; a fractional or out-of-range one would silently become
  // another comparison, so it raises naming the op, the value and the dtype.
  const Tensor n = Tensor::from_vector<int32_t>({-2, 0, 3});
  require_bools(ops::less(n, 0.0), {3}, {1, 0, 0});
  require_bools(ops::greater_equal(n, -2.0), {3}, {1, 1, 1});
  REQUIRE_THROWS_WITH(ops::less(n, 0.5), Catch::Contains("less") && Catch::Contains("0.5") &&
                                             Catch::Contains("int32"));
  REQUIRE_THROWS_WITH(ops::equal(n, 3e9), Catch::Contains("equal") && Catch::Contains("int32"));
  REQUIRE_THROWS_WITH(ops::greater(Tensor::from_vector<uint8_t>({1}), -1.0),
                      Catch::Contains("greater") && Catch::Contains("uint8"));
  REQUIRE_THROWS_WITH(ops::greater(Tensor::from_vector<uint8_t>({1}), 256.0),
                      Catch::Contains("uint8"));
  REQUIRE_THROWS_WITH(ops::not_equal(n, kNaN), Catch::Contains("not_equal"));
  require_bools(ops::less(Tensor::from_vector<uint8_t>({0, 255}), 255.0), {2}, {1, 0});
  require_bools(ops::equal(Tensor::from_vector<int64_t>({-(int64_t{1} << 62)}), -std::ldexp(1, 62)),
                {1}, {1});
  const Tensor p = Tensor::from_vector<bool>({true, false});
  require_bools(ops::equal(p, 1.0), {2}, {1, 0});
  REQUIRE_THROWS_WITH(ops::equal(p, 2.0), Catch::Contains("equal") && Catch::Contains("bool"));
}

TEST_CASE("comparisons raise naming the op, the shapes and the dtypes", "[cpu][ops][compare]") {
  const Tensor a = Tensor::zeros({2, 3}), b = Tensor::zeros({4});
  for (const Comparison& c : kComparisons) {
    INFO(c.name);
    REQUIRE_THROWS_WITH(
        c.op(a, b), Catch::Contains(c.name) && Catch::Contains("[2, 3]") && Catch::Contains("[4]"));
    REQUIRE_THROWS_WITH(
        c.op(a, Tensor::zeros({3}, DType::kFloat64)),
        Catch::Contains(c.name) && Catch::Contains("float32") && Catch::Contains("float64"));
    REQUIRE_THROWS_WITH(c.op(a, Tensor()), Catch::Contains(c.name) && Catch::Contains("undefined"));
    REQUIRE_THROWS_WITH(c.scalar_op(Tensor(), 1.0), Catch::Contains(c.name));
  }
}

TEST_CASE("comparisons and logical ops do not record on a tape", "[cpu][ops][compare][tape]") {
  const Tensor x = Tensor::from_vector<double>({1, 2, 3}), y = Tensor::from_vector<double>({2});
  GradientTape tape({.persistent = true});
  tape.watch(x);
  tape.watch(y);
  for (const Comparison& c : kComparisons) {
    INFO(c.name);
    const Tensor result = c.op(x, y);
    REQUIRE_FALSE(tape.gradient(result, x).defined());
    REQUIRE_FALSE(tape.gradient(result, y).defined());
    REQUIRE_FALSE(tape.gradient(c.scalar_op(x, 2.0), x).defined());
  }
  const Tensor logical =
      ops::logical_not(ops::logical_or(ops::logical_and(x, y), ops::greater(x, 1.0)));
  REQUIRE_FALSE(tape.gradient(logical, x).defined());
  // A loss that reaches x only through a comparison has no gradient for x; through a cast
  // of one the gradient is undefined too (cast from bool records nothing).
  const Tensor counted = ops::sum(ops::cast(ops::greater(x, 1.5), DType::kFloat64));
  REQUIRE_FALSE(tape.gradient(counted, x).defined());
}

// ---- logical ops ----------------------------------------------------------------------------

TEST_CASE("logical_and, logical_or and logical_not: truth tables and broadcasting",
          "[cpu][ops][compare]") {
  // Every pair of truth values: a [4] against b [4].
  const Tensor a = flags({0, 0, 1, 1}, {4}), b = flags({0, 1, 0, 1}, {4});
  require_bools(ops::logical_and(a, b), {4}, {0, 0, 0, 1});
  require_bools(ops::logical_or(a, b), {4}, {0, 1, 1, 1});
  require_bools(ops::logical_not(a), {4}, {1, 1, 0, 0});
  // [2, 1] against [3].
  const Tensor column = flags({0, 1}, {2, 1}), row = flags({1, 0, 1}, {3});
  require_bools(ops::logical_and(column, row), {2, 3}, {0, 0, 0, 1, 0, 1});
  require_bools(ops::logical_or(column, row), {2, 3}, {1, 0, 1, 1, 1, 1});
  require_bools(ops::logical_not(column), {2, 1}, {1, 0});
  require_bools(ops::logical_not(Tensor::zeros({0}, DType::kBool)), {0}, {});
  // On the comparisons' results: 0 < x < 2 and its complement.
  const Tensor x = Tensor::from_vector<double>({-1, 0.5, 1.5, 2, kNaN});
  const Tensor inside = ops::logical_and(ops::greater(x, 0.0), ops::less(x, 2.0));
  require_bools(inside, {5}, {0, 1, 1, 0, 0});
  require_bools(ops::logical_not(inside), {5}, {1, 0, 0, 1, 1});
  require_bools(ops::logical_or(ops::less_equal(x, 0.0), ops::greater_equal(x, 2.0)), {5},
                {1, 0, 0, 1, 0});
}

TEST_CASE("logical ops read any dtype as nonzero = true", "[cpu][ops][compare]") {
  for (DType dtype : kEveryDType) {
    INFO(dtype);
    // 0, 0 | 0, 2 | 3, 0 | 1, 1 (bool: 2 and 3 become true).
    const Tensor a = make({0, 0, 3, 1}, {4}, dtype), b = make({0, 2, 0, 1}, {4}, dtype);
    require_bools(ops::logical_and(a, b), {4}, {0, 0, 0, 1});
    require_bools(ops::logical_or(a, b), {4}, {0, 1, 1, 1});
    require_bools(ops::logical_not(b), {4}, {1, 0, 1, 0});
  }
  // NaN is true, -0 is false, as a cast to bool reads them.
  const Tensor f = Tensor::from_vector<float>({std::nanf(""), -0.f, 0.25f, -3.f});
  require_bools(ops::logical_not(f), {4}, {0, 1, 0, 0});
  require_bools(ops::logical_and(f, f), {4}, {1, 0, 1, 1});
  require_bools(ops::logical_or(f, Tensor::zeros({})), {4}, {1, 0, 1, 1});
}

TEST_CASE("logical ops raise naming the op and the values", "[cpu][ops][compare]") {
  const Tensor a = flags({0, 1}, {2}), b = flags({1, 0, 1}, {3});
  REQUIRE_THROWS_WITH(ops::logical_and(a, b), Catch::Contains("logical_and") &&
                                                  Catch::Contains("[2]") && Catch::Contains("[3]"));
  REQUIRE_THROWS_WITH(ops::logical_or(a, Tensor::zeros({2})), Catch::Contains("logical_or") &&
                                                                  Catch::Contains("bool") &&
                                                                  Catch::Contains("float32"));
  REQUIRE_THROWS_WITH(ops::logical_not(Tensor()),
                      Catch::Contains("logical_not") && Catch::Contains("undefined"));
}

// ---- where ----------------------------------------------------------------------------------

TEST_CASE("where picks x where the condition holds, else y", "[cpu][ops][where]") {
  const Tensor c = flags({1, 0, 0, 1}, {4});
  const Tensor x = Tensor::from_vector<double>({1, 2, 3, 4});
  const Tensor y = Tensor::from_vector<double>({-1, -2, -3, -4});
  const Tensor out = ops::where(c, x, y);
  REQUIRE(out.dtype() == DType::kFloat64);
  require_close(out, {1, -2, -3, 4});

  // Broadcasting of all three: condition [2, 1], x [3], y rank 0 -> [2, 3].
  const Tensor rows = flags({1, 0}, {2, 1});
  const Tensor x3 = Tensor::from_vector<float>({1, 2, 3});
  const Tensor zero = Tensor::scalar(0.0);
  const Tensor picked = ops::where(rows, x3, zero);
  REQUIRE(picked.shape() == Shape({2, 3}));
  require_close(picked, {1, 2, 3, 0, 0, 0});
  // The condition broadcast along the last axis ([3] against x [2, 3] and y [2, 1]).
  const Tensor cols = flags({0, 1, 0}, {3});
  const Tensor x23 = Tensor::from_vector<float>({1, 2, 3, 4, 5, 6}, {2, 3});
  const Tensor y21 = Tensor::from_vector<float>({-1, -2}, {2, 1});
  require_close(ops::where(cols, x23, y21), {-1, 2, -1, -2, 5, -2});
  // The condition the largest: rank 3 [2, 1, 2] against x [2] and y [1].
  const Tensor c3 = flags({1, 0, 0, 1}, {2, 1, 2});
  const Tensor big =
      ops::where(c3, Tensor::from_vector<double>({10, 20}), Tensor::from_vector<double>({-5}));
  REQUIRE(big.shape() == Shape({2, 1, 2}));
  require_close(big, {10, -5, -5, 20});
  // With a comparison: relu written as where(x > 0, x, 0).
  const Tensor v = Tensor::from_vector<double>({-2, -0.5, 0, 0.5, 2});
  require_close(ops::where(ops::greater(v, 0.0), v, Tensor::scalar(0.0, DType::kFloat64)),
                {0, 0, 0, 0.5, 2});
  // NaN and infinities pass through unchanged, from whichever side is picked.
  const Tensor specials = Tensor::from_vector<double>({kNaN, kInf, -kInf});
  require_close(ops::where(flags({1, 1, 0}, {3}), specials, Tensor::scalar(7.0, DType::kFloat64)),
                {kNaN, kInf, 7});
  // Empty.
  REQUIRE(ops::where(flags({}, {0}), Tensor::zeros({0}), Tensor::zeros({})).shape() == Shape({0}));
}

TEST_CASE("where in every dtype, and a condition of any dtype", "[cpu][ops][where]") {
  for (DType dtype : kEveryDType) {
    INFO(dtype);
    const Tensor x = make({1, 0, 1, 1}, {4}, dtype), y = make({0, 1}, {2, 1, 1}, dtype);
    const Tensor out = ops::where(flags({1, 1, 0, 0}, {4}), x, y);
    REQUIRE(out.dtype() == dtype);
    REQUIRE(out.shape() == Shape({2, 1, 4}));
    REQUIRE(out.to_vector<double>() == std::vector<double>{1, 0, 0, 0, 1, 0, 1, 1});
    // The condition in this dtype: nonzero picks x.
    const Tensor cond = make({0, 1, 0, 1}, {4}, dtype);
    REQUIRE(ops::where(cond, Tensor::from_vector<double>({1, 2, 3, 4}),
                       Tensor::from_vector<double>({-1, -2, -3, -4}))
                .to_vector<double>() == std::vector<double>{-1, 2, -3, 4});
  }
  // Integer and 16-bit values move bit for bit (no detour through a float).
  const Tensor wide = Tensor::from_vector<int64_t>({INT64_MAX, (int64_t{1} << 53) + 1});
  REQUIRE(ops::where(flags({1, 1}, {2}), wide, Tensor::scalar(0.0, DType::kInt64))
              .to_vector<int64_t>() == wide.to_vector<int64_t>());
  // A float condition: NaN is nonzero (true), -0 is zero (false).
  const Tensor c = Tensor::from_vector<float>({std::nanf(""), -0.f, 2.f});
  require_close(ops::where(c, Tensor::from_vector<float>({1, 2, 3}), Tensor::scalar(-1.0)),
                {1, -1, 3});
}

TEST_CASE("where raises naming the op and the values", "[cpu][ops][where]") {
  const Tensor c = flags({1, 0}, {2}), x = Tensor::zeros({2}), y = Tensor::zeros({3});
  REQUIRE_THROWS_WITH(ops::where(c, x, y),
                      Catch::Contains("where") && Catch::Contains("[2] (condition)") &&
                          Catch::Contains("[2] (x)") && Catch::Contains("[3] (y)"));
  REQUIRE_THROWS_WITH(ops::where(flags({1, 0, 1}, {3}), x, x),
                      Catch::Contains("where") && Catch::Contains("[3] (condition)"));
  REQUIRE_THROWS_WITH(
      ops::where(c, x, Tensor::zeros({2}, DType::kFloat64)),
      Catch::Contains("where") && Catch::Contains("float32") && Catch::Contains("float64"));
  REQUIRE_THROWS_WITH(ops::where(Tensor(), x, x),
                      Catch::Contains("where") && Catch::Contains("undefined"));
}

TEST_CASE("where's gradient goes to x where the condition holds, else to y",
          "[cpu][ops][where][grad]") {
  // By hand: condition [2, 1] = {1, 0}, x [3], y [2, 3]; out [2, 3] is row 0 of x, row 1 of y.
  const Tensor c = flags({1, 0}, {2, 1});
  const Tensor x = Tensor::from_vector<double>({1, 2, 3});
  const Tensor y = Tensor::from_vector<double>({4, 5, 6, 7, 8, 9}, {2, 3});
  const Tensor w = Tensor::from_vector<double>({1, 10, 100, 1000, 10000, 100000}, {2, 3});
  GradientTape tape({.persistent = true});
  tape.watch(x);
  tape.watch(y);
  const Tensor loss = ops::sum(ops::mul(ops::where(c, x, y), w));
  const std::vector<Tensor> g = tape.gradient(loss, std::vector<Tensor>{x, y, c});
  require_close(g[0], {1, 10, 100});
  REQUIRE(g[1].shape() == Shape({2, 3}));
  require_close(g[1], {0, 0, 0, 1000, 10000, 100000});
  REQUIRE_FALSE(g[2].defined());  // the condition gets no gradient

  // The same tensor on both sides: its gradient is the whole upstream gradient.
  const Tensor both = tape.gradient(ops::sum(ops::mul(ops::where(c, x, x), w)), x);
  require_close(both, {1001, 10010, 100100});
}

TEST_CASE("gradients of where under broadcasting, by finite differences",
          "[cpu][ops][where][grad]") {
  struct Shapes {
    Shape c, x, y;
  };
  const Shapes cases[] = {{{3, 4}, {3, 4}, {3, 4}}, {{3, 4}, {4}, {3, 1}},    {{3, 1}, {3, 4}, {}},
                          {{4}, {3, 4}, {3, 4}},    {{2, 1, 4}, {3, 1}, {4}}, {{}, {2, 3}, {3}}};
  uint64_t seed = 1;
  for (const Shapes& s : cases) {
    INFO("condition " << s.c << ", x " << s.x << ", y " << s.y);
    const Tensor c = ops::greater(random_tensor(s.c, seed++), Tensor::scalar(0.0, DType::kFloat64));
    const Tensor x = random_tensor(s.x, seed++), y = random_tensor(s.y, seed++);
    check_gradients([](const In& v) { return ops::where(v[0], v[1], v[2]); }, {c, x, y});
    // Composed: a piecewise function of x alone (x^2 where x > 0, else -x).
    check_gradients(
        [](const In& v) {
          return ops::where(ops::greater(v[0], 0.0), ops::square(v[0]), ops::neg(v[0]));
        },
        {x});
  }
}
