// bfloat16 and float16 tensors: made, filled, read back, cast both ways (rounding to nearest
// even, exactly back to float32), differentiated through a cast; elementwise ops computing in
// float32 and rounding once, sums accumulating wider; an op that does not compute in them yet
// names the dtype instead of misreading it.
#include <catch2/catch.hpp>
#include <cmath>
#include <vector>

#include "tandem/tandem.h"

namespace td = tandem;
using td::DType;

TEST_CASE("bfloat16 and float16 tensors: names, sizes, fills, casts both ways", "[cpu][tensor]") {
  CHECK(td::dtype_name(DType::kBFloat16) == "bfloat16");
  CHECK(td::dtype_name(DType::kFloat16) == "float16");
  CHECK(td::dtype_size(DType::kBFloat16) == 2);
  CHECK(td::dtype_size(DType::kFloat16) == 2);
  CHECK(td::is_floating(DType::kBFloat16));
  CHECK(td::is_floating(DType::kFloat16));

  for (const DType half : {DType::kBFloat16, DType::kFloat16}) {
    INFO(half);
    td::Tensor t = td::Tensor::empty({3, 2}, half);
    CHECK(t.nbytes() == 12);
    t.fill_(1.5);
    CHECK(t.to_vector<float>() == std::vector<float>(6, 1.5f));
    CHECK(td::Tensor::arange(5, half).to_vector<int64_t>() == std::vector<int64_t>{0, 1, 2, 3, 4});
    // float32 -> 16 bits rounds to nearest even; back to float32 is exact.
    const td::Tensor x = td::Tensor::from_vector<float>({1.0f, 1.00390625f, 1.01171875f, -3.0f});
    const td::Tensor y = td::ops::cast(x, half);
    CHECK(y.dtype() == half);
    const std::vector<float> back = td::ops::cast(y, DType::kFloat32).to_vector<float>();
    if (half == DType::kBFloat16) {
      // 8 significant bits: 1 + 2^-8 is a tie (to 1), 1 + 3 x 2^-8 a tie (to 1 + 2^-6).
      CHECK(back == std::vector<float>{1.0f, 1.0f, 1.015625f, -3.0f});
    } else {
      CHECK(back == std::vector<float>{1.0f, 1.00390625f, 1.01171875f, -3.0f});  // exact in 11
    }
    // Through int and bool.
    CHECK(td::ops::cast(td::ops::cast(x, half), DType::kInt32).to_vector<int32_t>() ==
          std::vector<int32_t>{1, 1, 1, -3});
    CHECK(td::ops::cast(td::Tensor::from_vector<float>({0.0f, 2.0f}), half).to_vector<uint8_t>() ==
          std::vector<uint8_t>{0, 2});
  }
  // float16 saturates to infinity above 65504 (+ half an ulp); bfloat16 keeps float32's range.
  const td::Tensor big = td::Tensor::from_vector<float>({65504.0f, 65520.0f, 1e30f});
  const std::vector<float> f16 =
      td::ops::cast(td::ops::cast(big, DType::kFloat16), DType::kFloat32).to_vector<float>();
  CHECK(f16[0] == 65504.0f);
  CHECK(std::isinf(f16[1]));
  CHECK(std::isinf(f16[2]));
  const std::vector<float> bf16 =
      td::ops::cast(td::ops::cast(big, DType::kBFloat16), DType::kFloat32).to_vector<float>();
  CHECK(bf16[2] == Approx(1e30f).epsilon(0.01));
}

TEST_CASE("a cast to bfloat16 is differentiable: the gradient comes back as float32",
          "[cpu][tensor]") {
  td::Variable w("w", td::Tensor::from_vector<float>({0.5f, -2.0f, 3.25f}), true);
  td::GradientTape tape;
  const td::Tensor low = td::ops::cast(w.value(), DType::kBFloat16);  // the compute copy
  const td::Tensor loss = td::ops::sum(
      td::ops::mul(td::ops::cast(low, DType::kFloat32), td::Tensor::from_vector<float>({1, 2, 3})));
  const std::vector<td::Tensor> grads = tape.gradient(loss, std::vector<td::Variable>{w});
  REQUIRE(grads[0].defined());
  CHECK(grads[0].dtype() == DType::kFloat32);
  CHECK(grads[0].to_vector<float>() == std::vector<float>{1, 2, 3});
}

namespace {

td::Tensor as(DType dtype, const std::vector<float>& values, const td::Shape& shape) {
  return td::ops::cast(td::Tensor::from_vector<float>(values).view_as(shape), dtype);
}

std::vector<float> floats(const td::Tensor& t) {
  return td::ops::cast(t, DType::kFloat32).to_vector<float>();
}

// What the op gives when its float32 result is rounded once to `dtype`.
std::vector<float> rounded(const td::Tensor& float32_result, DType dtype) {
  return floats(td::ops::cast(float32_result, dtype));
}

}  // namespace

TEST_CASE("elementwise ops on bfloat16 and float16 compute in float32 and round once",
          "[cpu][tensor]") {
  const std::vector<float> av{0.3f, -1.7f, 2.5f, 0.01f, -0.6f, 3.3f};
  const std::vector<float> bv{1.1f, 0.4f, -2.2f, 0.7f, 5.0f, -0.05f};
  for (const DType half : {DType::kBFloat16, DType::kFloat16}) {
    INFO(half);
    const td::Tensor a = as(half, av, {2, 3});
    const td::Tensor b = as(half, bv, {2, 3});
    // The float32 reference takes the same (already rounded) inputs.
    const td::Tensor a32 = td::ops::cast(a, DType::kFloat32);
    const td::Tensor b32 = td::ops::cast(b, DType::kFloat32);
    const td::Tensor row = td::ops::cast(td::Tensor::from_vector<float>({1.0f, -2.0f, 0.5f}), half);
    const td::Tensor row32 = td::ops::cast(row, DType::kFloat32);

    CHECK(td::ops::add(a, b).dtype() == half);
    CHECK(floats(td::ops::add(a, b)) == rounded(td::ops::add(a32, b32), half));
    CHECK(floats(td::ops::sub(a, b)) == rounded(td::ops::sub(a32, b32), half));
    CHECK(floats(td::ops::mul(a, b)) == rounded(td::ops::mul(a32, b32), half));
    CHECK(floats(td::ops::div(a, b)) == rounded(td::ops::div(a32, b32), half));
    CHECK(floats(td::ops::add(a, row)) == rounded(td::ops::add(a32, row32), half));  // broadcast
    CHECK(floats(td::ops::maximum(a, b)) == rounded(td::ops::maximum(a32, b32), half));
    CHECK(floats(td::ops::mul(a, 3.0)) == rounded(td::ops::mul(a32, 3.0), half));
    CHECK(floats(td::ops::relu(a)) == rounded(td::ops::relu(a32), half));
    CHECK(floats(td::ops::exp(a)) == rounded(td::ops::exp(a32), half));
    CHECK(floats(td::ops::tanh(a)) == rounded(td::ops::tanh(a32), half));
    CHECK(floats(td::ops::sigmoid(a)) == rounded(td::ops::sigmoid(a32), half));
    CHECK(floats(td::ops::gelu(a, false)) == rounded(td::ops::gelu(a32, false), half));
    CHECK(td::ops::equal(a, a).to_vector<bool>() == std::vector<bool>(6, true));
    CHECK(td::ops::equal(a, b).to_vector<bool>() == std::vector<bool>(6, false));
  }
}

TEST_CASE("sums of bfloat16 and float16 accumulate in float32 or wider", "[cpu][tensor]") {
  for (const DType half : {DType::kBFloat16, DType::kFloat16}) {
    INFO(half);
    // 4,096 ones: a bfloat16 running sum would stop at 256 (256 + 1 rounds back to 256) and a
    // float16 one at 2,048.
    const td::Tensor ones = td::ops::cast(td::Tensor::ones({4096}), half);
    CHECK(td::ops::sum(ones).dtype() == half);
    CHECK(floats(td::ops::sum(ones)) == std::vector<float>{4096.0f});
    CHECK(floats(td::ops::mean(ones)) == std::vector<float>{1.0f});
    // Along an axis, both layouts (rows, and columns with inner > 1).
    const td::Tensor m = td::ops::cast(td::Tensor::ones({512, 8}), half);
    CHECK(floats(td::ops::sum(m, 0)) == std::vector<float>(8, 512.0f));
    CHECK(floats(td::ops::sum(m, 1)) == std::vector<float>(512, 8.0f));
    const td::Tensor x = as(half, {0.5f, -3.0f, 7.25f, 7.25f, 1.0f, -8.0f}, {2, 3});
    CHECK(floats(td::ops::max(x, 1)) == std::vector<float>{7.25f, 7.25f});
    CHECK(td::ops::argmax(x, 1).to_vector<int64_t>() == std::vector<int64_t>{2, 0});
    CHECK(floats(td::ops::max(x, 0)) == std::vector<float>{7.25f, 1.0f, 7.25f});
    CHECK(floats(td::ops::sum_to(x, td::Shape{3})) == std::vector<float>{7.75f, -2.0f, -0.75f});
  }
}

TEST_CASE("gradients flow through bfloat16 elementwise ops and reductions", "[cpu][tensor]") {
  // loss = sum(relu(w16 * x16) + w16): d/dw = x where w * x > 0, plus 1; exact in bfloat16.
  td::Variable w("w", td::Tensor::from_vector<float>({0.5f, -2.0f, 3.0f, 1.0f}), true);
  const td::Tensor x =
      td::ops::cast(td::Tensor::from_vector<float>({2.0f, 4.0f, -1.0f, 0.25f}), DType::kBFloat16);
  td::GradientTape tape;
  const td::Tensor w16 = td::ops::cast(w.value(), DType::kBFloat16);
  const td::Tensor loss = td::ops::cast(
      td::ops::sum(td::ops::add(td::ops::relu(td::ops::mul(w16, x)), w16)), DType::kFloat32);
  const std::vector<td::Tensor> grads = tape.gradient(loss, std::vector<td::Variable>{w});
  REQUIRE(grads[0].defined());
  CHECK(grads[0].dtype() == DType::kFloat32);
  CHECK(grads[0].to_vector<float>() == std::vector<float>{3.0f, 1.0f, 1.0f, 1.25f});
}

TEST_CASE("what does not take 16-bit tensors yet names the dtype", "[cpu][tensor]") {
  const td::Tensor a = td::ops::cast(td::Tensor::ones({4, 4}), DType::kBFloat16);
  // Variables are float32 masters: an optimizer does not update 16-bit ones.
  const td::Variable v("v", a, true);
  td::optim::SGD sgd;
  CHECK_THROWS_WITH(sgd.apply_gradients({a}, {v}), Catch::Contains("bfloat16"));
  CHECK_THROWS_WITH(td::ops::one_hot(td::Tensor::from_vector<int64_t>({1}), 4, DType::kFloat16),
                    Catch::Contains("float16"));
}

namespace {

// |got - want| within `relative` of the largest |want| (plus a tiny absolute floor), elementwise.
void check_close(const td::Tensor& got, const td::Tensor& want, float relative) {
  const std::vector<float> g = floats(got), w = floats(want);
  REQUIRE(g.size() == w.size());
  float scale = 0.0f;
  for (float v : w) scale = std::max(scale, std::fabs(v));
  size_t bad = 0;
  for (size_t i = 0; i < g.size(); ++i)
    if (!(std::fabs(g[i] - w[i]) <= relative * scale + 1e-6f)) ++bad;
  INFO("elements outside " << relative << " x " << scale << ": " << bad << " of " << g.size());
  CHECK(bad == 0);
}

}  // namespace

TEST_CASE("bfloat16 and float16 matmul and dense sum in float32: within the dtype's rounding",
          "[cpu][tensor]") {
  td::Generator gen(7);
  // Odd sizes, and a kernel 512 wide (on AVX2 widened straight into a padded stride).
  const int64_t sizes[][3] = {{33, 70, 45}, {16, 40, 512}};
  for (const auto& [m, k, n] : sizes) {
    for (const DType half : {DType::kBFloat16, DType::kFloat16}) {
      INFO(half << ", [" << m << ", " << k << "] x [" << k << ", " << n << "]");
      // Inputs rounded to the 16-bit type first; the float32 reference multiplies those values, so
      // the only differences left are the output's rounding (2^-8 relative for bfloat16, 2^-11
      // for float16) and the order of the float32 sums.
      const float ulp = half == DType::kBFloat16 ? 1.0f / 128 : 1.0f / 1024;
      const td::Tensor x = td::ops::cast(td::Tensor::uniform({m, k}, gen, -1, 1), half);
      const td::Tensor w = td::ops::cast(td::Tensor::uniform({k, n}, gen, -1, 1), half);
      const td::Tensor b = td::ops::cast(td::Tensor::uniform({n}, gen, -1, 1), half);
      const auto f32 = [](const td::Tensor& t) { return td::ops::cast(t, DType::kFloat32); };

      for (const bool ta : {false, true}) {
        for (const bool tb : {false, true}) {
          INFO("transpose_a " << ta << ", transpose_b " << tb);
          const td::Tensor a = ta ? td::ops::transpose(x) : x;  // stored transposed
          const td::Tensor bm = tb ? td::ops::transpose(w) : w;
          const td::Tensor got = td::ops::matmul(a, bm, ta, tb);
          CHECK(got.dtype() == half);
          CHECK(got.shape() == td::Shape{m, n});
          check_close(got, td::ops::matmul(f32(a), f32(bm), ta, tb), ulp);
        }
      }
      const td::Tensor y = td::ops::dense(x, w, b, td::ops::FusedActivation::kRelu);
      CHECK(y.dtype() == half);
      check_close(y, td::ops::dense(f32(x), f32(w), f32(b), td::ops::FusedActivation::kRelu), ulp);

      // Gradients: the dense's backward runs two 16-bit GEMMs and a float32-accumulated bias sum.
      td::Variable wv("w", f32(w), true), bv("b", f32(b), true);
      td::Tensor loss16, loss32;
      std::vector<td::Tensor> g16, g32;
      {
        td::GradientTape tape;
        const td::Tensor out =
            td::ops::dense(x, td::ops::cast(wv.value(), half), td::ops::cast(bv.value(), half),
                           td::ops::FusedActivation::kRelu);
        loss16 = td::ops::sum(td::ops::cast(out, DType::kFloat32));
        g16 = tape.gradient(loss16, std::vector<td::Variable>{wv, bv});
      }
      {
        td::GradientTape tape;
        const td::Tensor out =
            td::ops::dense(f32(x), wv.value(), bv.value(), td::ops::FusedActivation::kRelu);
        loss32 = td::ops::sum(out);
        g32 = tape.gradient(loss32, std::vector<td::Variable>{wv, bv});
      }
      REQUIRE(g16[0].defined());
      REQUIRE(g16[1].defined());
      CHECK(g16[0].dtype() == DType::kFloat32);
      // A unit the ReLU lets through in one precision and not the other changes its column by a
      // whole row of x: rare with these inputs, so the gradients agree to a few ulps.
      check_close(g16[0], g32[0], 4 * ulp);
      check_close(g16[1], g32[1], 4 * ulp);
    }
  }
}

TEST_CASE(
    "bfloat16 and float16 conv2d sum in float32: forward and gradients within the dtype's "
    "rounding",
    "[cpu][tensor]") {
  td::Generator gen(9);
  for (const DType half : {DType::kBFloat16, DType::kFloat16}) {
    INFO(half);
    const float ulp = half == DType::kBFloat16 ? 1.0f / 128 : 1.0f / 1024;
    const auto f32 = [](const td::Tensor& t) { return td::ops::cast(t, DType::kFloat32); };
    const td::Tensor x = td::ops::cast(td::Tensor::uniform({3, 9, 9, 4}, gen, -1, 1), half);
    td::Variable kernel(
        "k", f32(td::ops::cast(td::Tensor::uniform({3, 3, 4, 8}, gen, -1, 1), half)), true);
    td::Variable bias("b", f32(td::ops::cast(td::Tensor::uniform({8}, gen, -1, 1), half)), true);
    td::Variable input("x", f32(x), true);
    for (const auto padding : {td::ops::Padding::kSame, td::ops::Padding::kValid}) {
      INFO("padding " << (padding == td::ops::Padding::kSame ? "SAME" : "VALID"));
      std::vector<td::Tensor> g16, g32;
      td::Tensor y16, y32;
      {
        td::GradientTape tape;
        y16 = td::ops::conv2d(
            td::ops::cast(input.value(), half), td::ops::cast(kernel.value(), half),
            td::ops::cast(bias.value(), half), {2, 1}, padding, td::ops::FusedActivation::kRelu);
        g16 = tape.gradient(td::ops::sum(f32(y16)), std::vector<td::Variable>{input, kernel, bias});
      }
      {
        td::GradientTape tape;
        y32 = td::ops::conv2d(input.value(), kernel.value(), bias.value(), {2, 1}, padding,
                              td::ops::FusedActivation::kRelu);
        g32 = tape.gradient(td::ops::sum(y32), std::vector<td::Variable>{input, kernel, bias});
      }
      CHECK(y16.dtype() == half);
      check_close(y16, y32, ulp);
      for (size_t i = 0; i < 3; ++i) {
        INFO("gradient " << i);
        REQUIRE(g16[i].defined());
        CHECK(g16[i].dtype() == DType::kFloat32);
        check_close(g16[i], g32[i], 4 * ulp);
      }
    }
  }
}

TEST_CASE("bfloat16 and float16 max pooling: the float32 result exactly, forward and backward",
          "[cpu][tensor]") {
  td::Generator gen(13);
  for (const DType half : {DType::kBFloat16, DType::kFloat16}) {
    INFO(half);
    const auto f32 = [](const td::Tensor& t) { return td::ops::cast(t, DType::kFloat32); };
    td::Variable x("x", f32(td::ops::cast(td::Tensor::uniform({2, 7, 6, 5}, gen, -4, 4), half)),
                   true);
    const td::Tensor upstream = td::ops::cast(td::Tensor::uniform({120}, gen, -1, 1), half);
    for (const auto padding : {td::ops::Padding::kSame, td::ops::Padding::kValid}) {
      td::Tensor y16, y32;
      std::vector<td::Tensor> g16, g32;
      {
        td::GradientTape tape;
        y16 = td::ops::max_pool2d(td::ops::cast(x.value(), half), {2, 2}, {2, 2}, padding);
        const td::Tensor up = upstream.slice(0, y16.numel()).view_as(y16.shape());
        g16 = tape.gradient(td::ops::sum(f32(td::ops::mul(y16, up))), std::vector<td::Variable>{x});
      }
      {
        td::GradientTape tape;
        y32 = td::ops::max_pool2d(x.value(), {2, 2}, {2, 2}, padding);
        const td::Tensor up = f32(upstream.slice(0, y32.numel())).view_as(y32.shape());
        g32 = tape.gradient(td::ops::sum(td::ops::mul(y32, up)), std::vector<td::Variable>{x});
      }
      CHECK(y16.dtype() == half);
      CHECK(floats(y16) == y32.to_vector<float>());
      // Each input gets at most one window's upstream value (windows do not overlap): exact.
      CHECK(g16[0].to_vector<float>() == g32[0].to_vector<float>());
    }
  }
}
