// Dtype policies (Keras's mixed precision names and rules): variables stay float32 masters, a
// layer casts its floating inputs and its variables to the compute dtype, gradients come back
// float32, losses compute in float32; per-layer policies override the global one; a model
// trains under mixed_bfloat16.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <vector>

#include "tandem/tandem.h"

namespace td = tandem;
namespace nn = tandem::nn;
using td::DType;

namespace {

/// Sets the global policy for the scope (layers made inside take it).
class GlobalPolicy {
 public:
  explicit GlobalPolicy(const char* name) : saved_(nn::global_policy()) {
    nn::set_global_policy(name);
  }
  ~GlobalPolicy() { nn::set_global_policy(saved_); }
  GlobalPolicy(const GlobalPolicy&) = delete;
  GlobalPolicy& operator=(const GlobalPolicy&) = delete;

 private:
  nn::Policy saved_;
};

}  // namespace

TEST_CASE("dtype policies: Keras's names, their variable and compute dtypes", "[cpu][nn]") {
  CHECK(nn::global_policy().name() == "float32");
  const nn::Policy mixed("mixed_bfloat16");
  CHECK(mixed.variable_dtype() == DType::kFloat32);
  CHECK(mixed.compute_dtype() == DType::kBFloat16);
  CHECK(mixed.is_mixed());
  CHECK(nn::Policy("mixed_float16").compute_dtype() == DType::kFloat16);
  CHECK(nn::Policy("float64").compute_dtype() == DType::kFloat64);
  CHECK_FALSE(nn::Policy("float32").is_mixed());
  CHECK_THROWS_WITH(nn::Policy("mixed_bf16"), Catch::Contains("\"mixed_bf16\""));
  CHECK_THROWS_WITH(nn::Policy::of(DType::kBFloat16), Catch::Contains("mixed_bfloat16"));
}

TEST_CASE(
    "under mixed_bfloat16 a Dense keeps float32 variables, computes in bfloat16, and its "
    "gradients come back float32",
    "[cpu][nn]") {
  nn::Dense mixed_layer(8, nn::Activation::kRelu);
  {
    GlobalPolicy policy("mixed_bfloat16");
    mixed_layer = nn::Dense(8, nn::Activation::kRelu);
  }
  nn::Dense float_layer(8, nn::Activation::kRelu);  // made after: float32 again
  CHECK(mixed_layer.dtype_policy().name() == "mixed_bfloat16");
  CHECK(float_layer.dtype_policy().name() == "float32");

  td::Generator gen(3);
  const td::Tensor x = td::Tensor::uniform({16, 5}, gen, -1, 1);
  mixed_layer.build({5});
  float_layer.build({5});
  float_layer.kernel().assign(mixed_layer.kernel().value());
  CHECK(mixed_layer.kernel().value().dtype() == DType::kFloat32);

  td::GradientTape tape;
  const td::Tensor y = mixed_layer(x);  // the float32 input is cast to bfloat16
  CHECK(y.dtype() == DType::kBFloat16);
  const td::Tensor loss = td::ops::sum(td::ops::cast(y, DType::kFloat32));
  const auto grads = tape.gradient(loss, mixed_layer.trainable_variables());
  REQUIRE(grads.size() == 2);
  CHECK(grads[0].dtype() == DType::kFloat32);
  CHECK(grads[1].dtype() == DType::kFloat32);

  // The same layer in float32: outputs agree to bfloat16's precision.
  const std::vector<float> y16 = td::ops::cast(y, DType::kFloat32).to_vector<float>();
  const std::vector<float> y32 = float_layer(x).to_vector<float>();
  REQUIRE(y16.size() == y32.size());
  for (size_t i = 0; i < y16.size(); ++i)
    CHECK(std::fabs(y16[i] - y32[i]) <= 0.02f * (1.0f + std::fabs(y32[i])));
}

TEST_CASE("a per-layer float32 policy inside a mixed model computes in float32", "[cpu][nn]") {
  GlobalPolicy policy("mixed_bfloat16");
  nn::Dense head(3);
  head.set_dtype_policy("float32");  // Keras: Dense(3, dtype="float32") for the output layer
  nn::Sequential model({nn::Dense(6, nn::Activation::kRelu), head});
  model.build({4});
  const td::Tensor out = model(td::Tensor::ones({2, 4}));
  CHECK(out.dtype() == DType::kFloat32);
  CHECK(model.children()[0].dtype_policy().name() == "mixed_bfloat16");
  CHECK_THROWS_WITH(head.set_dtype_policy("mixed_bfloat16"), Catch::Contains("after build"));
}

TEST_CASE(
    "a CNN runs forward and backward under mixed_bfloat16 with float32 loss and "
    "gradients",
    "[cpu][nn]") {
  GlobalPolicy policy("mixed_bfloat16");
  nn::Sequential model({nn::Conv2D(4, 3, 1, nn::Padding::kSame, nn::Activation::kRelu),
                        nn::MaxPool2D(2), nn::Flatten(), nn::Dropout(0.25), nn::Dense(3)});
  model.build({6, 6, 1});
  td::Generator gen(5);
  const td::Tensor x = td::Tensor::uniform({4, 6, 6, 1}, gen, 0, 1);
  const td::Tensor labels = td::Tensor::from_vector<int64_t>({0, 1, 2, 1});
  td::losses::SparseCategoricalCrossentropy loss_fn({.from_logits = true});
  td::GradientTape tape;
  const td::Tensor logits = model(x, /*training=*/true);
  CHECK(logits.dtype() == DType::kBFloat16);
  const td::Tensor loss = loss_fn(labels, logits);
  CHECK(loss.dtype() == DType::kFloat32);  // losses compute in float32
  const auto grads = tape.gradient(loss, model.trainable_variables());
  REQUIRE(grads.size() == 4);
  for (const td::Tensor& g : grads) {
    REQUIRE(g.defined());
    CHECK(g.dtype() == DType::kFloat32);
    for (float v : g.to_vector<float>()) CHECK(std::isfinite(v));
  }
}

TEST_CASE("an MLP learns the quadrants under mixed_bfloat16 as it does in float32",
          "[cpu][nn][optim]") {
  GlobalPolicy policy("mixed_bfloat16");
  td::Generator gen(11);
  std::vector<float> xs;
  std::vector<int64_t> ys;
  while (ys.size() < 1024) {
    const double a = 2 * gen.next_double() - 1, b = 2 * gen.next_double() - 1;
    if (std::abs(a) < 0.05 || std::abs(b) < 0.05) continue;
    xs.push_back(static_cast<float>(a));
    xs.push_back(static_cast<float>(b));
    ys.push_back((a > 0 ? 1 : 0) + (b > 0 ? 2 : 0));
  }
  const td::Tensor x = td::Tensor::from_vector(xs, {1024, 2});
  const td::Tensor y = td::Tensor::from_vector(ys);
  nn::Sequential model({nn::Dense(32, nn::Activation::kRelu), nn::Dense(4)});
  model.set_seed(3);
  model.build({2});
  td::optim::Adam optimizer({.learning_rate = 0.02});
  td::losses::SparseCategoricalCrossentropy loss_fn({.from_logits = true});
  for (int epoch = 0; epoch < 15; ++epoch) {
    for (int64_t begin = 0; begin < 1024; begin += 64) {
      td::GradientTape tape;
      const td::Tensor loss =
          loss_fn(y.slice(begin, begin + 64), model(x.slice(begin, begin + 64), true));
      optimizer.apply_gradients(tape.gradient(loss, model.trainable_variables()),
                                model.trainable_variables());
    }
  }
  for (const td::Variable& v : model.trainable_variables())
    CHECK(v.value().dtype() == DType::kFloat32);  // the masters stay float32
  td::metrics::SparseCategoricalAccuracy accuracy("accuracy");
  accuracy.update_state(y, model(x));
  CHECK(accuracy.result() >= 0.98);
}
