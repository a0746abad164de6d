// bfloat16 and float16 tensors as storage: made, filled, read back, cast both ways (rounding to
// nearest even, exactly back to float32), differentiated through a cast; an op that does not
// compute in them yet, a checkpoint and a collective name the dtype instead of misreading it.
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

TEST_CASE("what does not take 16-bit tensors yet names the dtype", "[cpu][tensor]") {
  const td::Tensor a = td::ops::cast(td::Tensor::ones({4}), DType::kBFloat16);
  CHECK_THROWS_WITH(td::ops::add(a, a), Catch::Contains("bfloat16"));
  CHECK_THROWS_WITH(td::ops::equal(a, a), Catch::Contains("bfloat16"));
  const td::Tensor h = td::ops::cast(td::Tensor::ones({4}), DType::kFloat16);
  CHECK_THROWS_WITH(td::ops::sum(h), Catch::Contains("float16"));
}
