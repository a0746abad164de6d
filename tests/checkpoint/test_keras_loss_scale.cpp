// LossScaleOptimizer against Keras 3's (tests/interop/keras_loss_scale.py, when TensorFlow and
// Keras 3 are installed; skipped otherwise): the same gradients of a scaled loss, finite and not,
// give the same scale, counter, iterations and weights after every update, bit for bit.
#include <cmath>
#include <sstream>

#include "checkpoint_test_util.h"
#include "interop_test_util.h"

namespace td = tandem;
namespace optim = tandem::optim;
using namespace tandem::checkpoint_testing;

TEST_CASE("LossScaleOptimizer follows Keras 3's scale trajectory and updates bit for bit",
          "[cpu][checkpoint][interop]") {
  const std::string python = tensorflow_python_or_skip();
  if (python.empty()) return;
  // 40 updates: growth every 3 finite ones, overflows (Inf, NaN) scattered, two in a row once.
  std::vector<std::string> values;
  for (int i = 0; i < 40; ++i) {
    if (i % 7 == 3 || i == 20) {
      values.push_back(i % 2 ? "nan" : "inf");
    } else {
      std::ostringstream v;
      v << 0.125 * ((i * 5) % 9 - 4);  // exact in float32: multiples of 1/8
      values.push_back(v.str());
    }
  }
  std::string list;
  for (const std::string& v : values) list += (list.empty() ? "" : ",") + v;

  TempDir dir;
  const std::string out = dir.file("keras.txt");
  const int status = shell(python + " " + kInteropDir + "/keras_loss_scale.py " + list + " 4 3 >" +
                           out + " 2>" + dir.file("keras.log"));
  INFO("keras_loss_scale.py stderr:\n" << read_text(dir.file("keras.log")));
  if (status == 77) {
    WARN("keras_loss_scale.py could not import Keras 3; skipped");
    return;
  }
  REQUIRE(status == 0);
  std::istringstream keras(read_text(out));

  td::Variable w("w", td::Tensor::from_vector<float>({1.0f, 2.0f}), true);
  optim::SGD sgd({.learning_rate = 1.0});
  optim::LossScaleOptimizer lso(sgd, {.initial_scale = 4.0, .dynamic_growth_steps = 3});
  for (size_t i = 0; i < values.size(); ++i) {
    INFO("update " << i << ", gradient " << values[i]);
    const float scale = static_cast<float>(lso.loss_scale());
    const float g = std::stof(values[i]);
    lso.apply_gradients({td::Tensor::from_vector<float>({g * scale, 0.125f * scale})}, {w});
    double keras_scale = 0, w0 = 0, w1 = 0;
    int64_t keras_counter = 0, keras_iterations = 0;
    REQUIRE(keras >> keras_scale >> keras_counter >> keras_iterations >> w0 >> w1);
    CHECK(lso.loss_scale() == keras_scale);
    CHECK(lso.step_counter() == keras_counter);
    CHECK(sgd.iterations() == keras_iterations);
    const std::vector<float> mine = w.value().to_vector<float>();
    CHECK(mine[0] == static_cast<float>(w0));
    CHECK(mine[1] == static_cast<float>(w1));
  }
}
