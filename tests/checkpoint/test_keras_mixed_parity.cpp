// Mixed precision against Keras 3 (tests/interop/keras_mixed_mlp.py, when TensorFlow and Keras 3
// are installed; skipped otherwise): the sample MLP under mixed_bfloat16, from Keras's own initial
// weights (read by load_weights), trained 100 steps on the same batches with Adam, gives Keras's
// losses within bfloat16's tolerance.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "checkpoint_test_util.h"
#include "interop_test_util.h"

namespace td = tandem;
namespace nn = tandem::nn;
using namespace tandem::checkpoint_testing;

TEST_CASE(
    "the sample MLP under mixed_bfloat16 trains as Keras 3 does: 100 steps, losses within "
    "bfloat16's tolerance",
    "[cpu][checkpoint][interop][slow]") {
  const std::string data_dir = fashion_mnist_or_skip("train-images-idx3-ubyte.gz");
  if (data_dir.empty()) return;
  const std::string python = tensorflow_python_or_skip();
  if (python.empty()) return;
  constexpr int kSteps = 100;
  constexpr int64_t kBatch = 64;
  TempDir dir;
  const std::string log = dir.file("keras_mixed_mlp.log");
  const int status = shell(python + " " + kInteropDir + "/keras_mixed_mlp.py " + dir.str() +
                           " --data-dir " + data_dir + " >" + log + " 2>&1");
  INFO("keras_mixed_mlp.py output:\n" << read_text(log));
  if (status == 77) {
    WARN("keras_mixed_mlp.py could not import TensorFlow and Keras 3; skipped");
    return;
  }
  REQUIRE(status == 0);
  const std::string bytes = read_text(dir.file("losses.f32"));
  REQUIRE(bytes.size() == kSteps * sizeof(float));
  std::vector<float> keras_losses(kSteps);
  std::memcpy(keras_losses.data(), bytes.data(), bytes.size());

  const nn::Policy saved = nn::global_policy();
  nn::set_global_policy("mixed_bfloat16");
  nn::Sequential model = sample_mlp();  // its layers take the policy when they are made
  nn::set_global_policy(saved);
  td::load_weights(model, dir.file("initial.weights.h5"));
  td::optim::Adam adam({.learning_rate = 1e-3});
  const td::losses::SparseCategoricalCrossentropy loss_fn({.from_logits = true});
  td::data::Iterator batches =
      td::data::fashion_mnist(td::data::Split::kTrain, data_dir).batch(kBatch).iterator();
  double first_ten = 0.0, all = 0.0, mine_late = 0.0, theirs_late = 0.0;
  for (int s = 0; s < kSteps; ++s) {
    td::data::Element batch;
    REQUIRE(batches.next(batch));
    td::GradientTape tape;
    const td::Tensor loss = loss_fn(batch[1], model(batch[0], /*training=*/true));
    adam.apply_gradients(tape.gradient(loss, model.trainable_variables()),
                         model.trainable_variables());
    const double mine = loss.item<double>(), theirs = keras_losses[static_cast<size_t>(s)];
    const double difference = std::fabs(mine - theirs) / std::fabs(theirs);
    if (s < 10) first_ten = std::max(first_ten, difference);
    all = std::max(all, difference);
    if (s >= kSteps / 2) {
      mine_late += mine;
      theirs_late += theirs;
    }
  }
  INFO("largest relative difference: first 10 steps "
       << first_ten << ", all " << all << "; mean loss of the last 50 steps: Tandem "
       << mine_late / 50 << ", Keras " << theirs_late / 50);
  // From the same weights, the first steps differ only by the order of float32 sums inside
  // each bfloat16 rounding (measured: 1.6e-3 at most). The two runs then drift apart as each
  // update's bfloat16 roundings differ (5.0e-3 .. 5e-2 per step), while the training itself
  // stays the same: the mean loss of the second half agrees to 1.3e-3.
  CHECK(first_ten <= 5e-3);
  CHECK(all <= 0.1);
  CHECK(std::fabs(mine_late - theirs_late) / theirs_late <= 0.01);
  CHECK(keras_losses[0] > 2.0);  // an untrained 10-class model: about log(10)
}
