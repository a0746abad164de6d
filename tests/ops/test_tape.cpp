// The gradient tape's contract as the ops use it: undefined gradients for unconnected
// sources, non-scalar targets, persistent and non-persistent tapes, nested tapes, watched
// variables, in-place ops that do not record, and per-thread recording.
#include <catch2/catch.hpp>
#include <thread>

#include "ops/ops_testing.h"

using namespace tandem;
using tandem::testing::require_close;

TEST_CASE("a source the target does not depend on gets an undefined gradient", "[cpu][ops][tape]") {
  const Tensor x = Tensor::from_vector<double>({1, 2}), unused = Tensor::ones({2}, DType::kFloat64);
  GradientTape tape;
  tape.watch(x);
  tape.watch(unused);
  const std::vector<Tensor> g = tape.gradient(ops::sum(ops::square(x)), {x, unused});
  require_close(g[0], {2, 4});
  REQUIRE_FALSE(g[1].defined());
}

TEST_CASE("a non-scalar target is summed", "[cpu][ops][tape]") {
  const Tensor x = Tensor::from_vector<double>({1, 2, 3});
  GradientTape tape;
  tape.watch(x);
  const Tensor y = ops::mul(x, x);  // d sum(x^2) / dx = 2x
  require_close(tape.gradient(y, x), {2, 4, 6});
}

TEST_CASE("a non-persistent tape computes gradients once", "[cpu][ops][tape]") {
  const Tensor x = Tensor::from_vector<double>({3});
  GradientTape tape;
  tape.watch(x);
  const Tensor y = ops::exp(x);
  REQUIRE(tape.gradient(y, x).item<double>() == Approx(std::exp(3.0)));
  REQUIRE_THROWS_WITH(tape.gradient(y, x), Catch::Contains("persistent"));
}

TEST_CASE("a persistent tape allows several gradient calls", "[cpu][ops][tape]") {
  const Tensor x = Tensor::from_vector<double>({2});
  GradientTape tape({.persistent = true});
  tape.watch(x);
  const Tensor y = ops::square(x);
  const Tensor z = ops::mul(y, x);
  REQUIRE(tape.gradient(y, x).item<double>() == 4.0);
  REQUIRE(tape.gradient(z, x).item<double>() == 12.0);
  REQUIRE(tape.gradient(y, x).item<double>() == 4.0);
}

TEST_CASE("nested tapes both record the ops run under them", "[cpu][ops][tape]") {
  const Tensor x = Tensor::from_vector<double>({1.5});
  GradientTape outer;
  outer.watch(x);
  GradientTape inner;
  inner.watch(x);
  const Tensor y = ops::pow(x, 3.0);
  // The inner tape's backward is not recorded (recording pauses during gradient()), so only
  // first derivatives are available from either tape.
  REQUIRE(inner.gradient(y, x).item<double>() == Approx(3 * 1.5 * 1.5));
  REQUIRE(outer.gradient(y, x).item<double>() == Approx(3 * 1.5 * 1.5));
}

TEST_CASE("trainable variables read under a tape are watched", "[cpu][ops][tape]") {
  Variable w("w", Tensor::from_vector<double>({1, -2}));
  Variable frozen("frozen", Tensor::from_vector<double>({3, 3}), /*trainable=*/false);
  GradientTape tape;
  const Tensor loss = ops::sum(ops::mul(w.value(), frozen.value()));
  const std::vector<Tensor> g = tape.gradient(loss, std::vector<Variable>{w, frozen});
  require_close(g[0], {3, 3});
  REQUIRE_FALSE(g[1].defined());
}

TEST_CASE("in-place ops and integer results do not record", "[cpu][ops][tape]") {
  const Tensor x = Tensor::from_vector<double>({1, 2});
  GradientTape tape({.persistent = true});
  tape.watch(x);
  Tensor y = ops::mul(x, 2.0);
  ops::add_(y, x);  // y now holds 3x, but the tape only knows y = 2x
  ops::scale_(y, 10.0);
  require_close(y, {30, 60});
  require_close(tape.gradient(y, x), {2, 2});
  const Tensor index = ops::argmax(x);
  const Tensor same = ops::equal(x, x);
  REQUIRE_FALSE(tape.gradient(index, x).defined());
  REQUIRE_FALSE(tape.gradient(same, x).defined());
}

TEST_CASE("a tape does not record ops run on another thread", "[cpu][ops][tape]") {
  const Tensor x = Tensor::from_vector<double>({1, 2});
  GradientTape tape;
  tape.watch(x);
  Tensor from_thread;
  std::thread worker([&] { from_thread = ops::mul(x, 5.0); });
  worker.join();
  const Tensor here = ops::mul(x, 3.0);
  const Tensor g = tape.gradient(ops::add(from_thread, here), x);
  // Only the local mul reaches x: 3, not 8.
  require_close(g, {3, 3});
}

TEST_CASE("ops record nothing when no tape is active", "[cpu][ops][tape]") {
  const Tensor x = Tensor::from_vector<double>({1, 2});
  const Tensor y = ops::mul(x, x);
  GradientTape tape;
  tape.watch(x);
  // y was computed before the tape existed: it is not connected to x.
  REQUIRE_FALSE(tape.gradient(ops::add(y, 1.0), x).defined());
}

TEST_CASE("repeated uses add up without changing a shared gradient", "[cpu][ops][tape]") {
  // z = ((a + b) + a) + a: add passes its output gradient on unchanged, so the first
  // contribution to a's gradient is the very tensor that is also b's and t's gradient; the sum
  // the tape adds in place must be a buffer of its own.
  const Tensor a = Tensor::from_vector<double>({1, 2}), b = Tensor::from_vector<double>({3, 4});
  GradientTape tape;
  tape.watch(a);
  tape.watch(b);
  const Tensor t = ops::add(a, b);
  const Tensor z = ops::add(ops::add(t, a), a);
  const std::vector<Tensor> g = tape.gradient(z, std::vector<Tensor>{a, b, t});
  require_close(g[0], {3, 3});
  require_close(g[1], {1, 1});
  require_close(g[2], {1, 1});
}

TEST_CASE("a 16-bit tensor used three times gets the sum of its three gradients",
          "[cpu][ops][grad]") {
  for (const DType dtype : {DType::kBFloat16, DType::kFloat16}) {
    INFO(dtype);
    const Tensor x = ops::cast(Tensor::from_vector<float>({1.0f, -2.0f, 0.5f}), dtype);
    GradientTape tape;
    tape.watch(x);
    // Three uses: the tape adds the third contribution to the sum of the first two.
    const Tensor y = ops::add(ops::add(ops::mul(x, 1.0), ops::mul(x, 2.0)), ops::mul(x, 4.0));
    const Tensor g = tape.gradient(ops::sum(ops::cast(y, DType::kFloat32)), x);
    REQUIRE(g.dtype() == dtype);
    CHECK(ops::cast(g, DType::kFloat32).to_vector<float>() == std::vector<float>{7, 7, 7});
  }
}
