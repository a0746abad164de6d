// exclude_from_weight_decay (Keras's): excluded variables, by handle or by a part of their name,
// take Adam's update; the others AdamW's; with one gradient, bit for bit against the two
// optimizers run separately.
#include <catch2/catch.hpp>

#include "tandem/tandem.h"

namespace td = tandem;
namespace optim = tandem::optim;

namespace {

td::Variable variable(const std::string& name, const std::vector<float>& values) {
  return td::make_variable(name, td::Tensor::from_vector(values));
}

}  // namespace

TEST_CASE("exclude_from_weight_decay: excluded variables step as Adam's, the rest as AdamW's",
          "[cpu][optim]") {
  const std::vector<float> start{0.5f, -1.5f, 2.0f}, grad{0.1f, -0.2f, 0.3f};
  const td::Tensor g = td::Tensor::from_vector(grad);
  optim::AdamW adamw({.learning_rate = 0.01, .weight_decay = 0.1});
  td::Variable kernel = variable("dense/kernel", start), bias = variable("dense/bias", start);
  td::Variable gain = variable("layer_norm/gamma", start);
  adamw.exclude_from_weight_decay({bias}, {"layer_norm"});
  CHECK(adamw.use_weight_decay(kernel));
  CHECK_FALSE(adamw.use_weight_decay(bias));
  CHECK_FALSE(adamw.use_weight_decay(gain));
  for (int step = 0; step < 3; ++step) adamw.apply_gradients({g, g, g}, {kernel, bias, gain});

  optim::AdamW decayed({.learning_rate = 0.01, .weight_decay = 0.1});
  optim::Adam plain({.learning_rate = 0.01});
  td::Variable a = variable("a", start), b = variable("b", start);
  for (int step = 0; step < 3; ++step) {
    decayed.apply_gradients({g}, {a});
    plain.apply_gradients({g}, {b});
  }
  CHECK(kernel.value().to_vector<float>() == a.value().to_vector<float>());
  CHECK(bias.value().to_vector<float>() == b.value().to_vector<float>());
  CHECK(gain.value().to_vector<float>() == b.value().to_vector<float>());
  CHECK(a.value().to_vector<float>() != b.value().to_vector<float>());  // decay did something
  CHECK_THROWS_WITH(adamw.exclude_from_weight_decay({}, {""}), Catch::Contains("empty name part"));
}
