// Blocks of one's own against Keras 3, both ways (tests/interop/keras_blocks.py, when TensorFlow
// and Keras 3 are installed; skipped otherwise). The ResNet sample's residual block, twice in a
// Sequential (the second with a shortcut Sequential inside it), is the same model as a Keras
// Sequential holding a keras.layers.Layer with attributes conv1, bn1, conv2, bn2, shortcut:
// - Keras -> Tandem: load_weights reads Keras's initial weights from its Keras 3 .weights.h5
//   (a block's layers by name, its shortcut's by class) and from its legacy .h5 (a block's
//   trainable weights first, by position); 10 SGD steps with momentum from either give Keras's
//   weights, moving statistics and inference logits after the same steps.
// - Tandem -> Keras: Keras's model.load_weights reads Tandem's checkpoint of the trained model
//   and computes Tandem's inference logits.
#include <cstring>

#include "checkpoint_test_util.h"
#include "fashion_mnist_resnet/residual_block.h"
#include "interop_test_util.h"
#include "support/compare.h"

namespace td = tandem;
namespace nn = tandem::nn;
using namespace tandem::checkpoint_testing;
using td::testing::relative_difference;

namespace {

nn::Sequential block_model() {
  nn::Sequential model({nn::Conv2D(4, 3, 1, nn::Padding::kSame, nn::Activation::kNone, false),
                        nn::BatchNormalization(), nn::ActivationLayer(nn::Activation::kRelu),
                        samples::ResidualBlock(4, 1), samples::ResidualBlock(8, 2),
                        nn::GlobalAveragePooling2D(), nn::Dense(3)});
  model.build({8, 8, 2});
  return model;
}

}  // namespace

TEST_CASE("blocks of one's own load from Keras 3 and into Keras, and train as Keras's",
          "[cpu][checkpoint][interop][batch_norm]") {
  const std::string python = tensorflow_python_or_skip();
  if (python.empty()) return;
  TempDir dir;
  const std::string script = python + " " + kInteropDir + "/keras_blocks.py " + dir.str();
  const std::string log = dir.file("keras_blocks.log");
  const int status = shell(script + " >" + log + " 2>&1");
  INFO("keras_blocks.py output:\n" << read_text(log));
  if (status == 77) {
    WARN("keras_blocks.py could not import TensorFlow and Keras 3; skipped");
    return;
  }
  REQUIRE(status == 0);
  const td::Tensor images =
      td::Tensor::from_vector(read_values<float>(dir.file("x.f32")), td::Shape{80, 8, 8, 2});
  const td::Tensor labels = td::Tensor::from_vector(read_values<int64_t>(dir.file("y.i64")));
  const std::vector<float> keras_logits = read_values<float>(dir.file("final_logits.f32"));
  const td::losses::SparseCategoricalCrossentropy loss_fn({.from_logits = true});

  nn::Sequential keras_final = block_model();
  td::load_weights(keras_final, dir.file("final.weights.h5"));
  const std::vector<td::Variable> theirs = keras_final.weights();

  for (const std::string initial : {"initial.weights.h5", "initial_legacy.h5"}) {
    INFO("Keras's initial weights from " << initial);
    nn::Sequential model = block_model();
    td::load_weights(model, dir.file(initial));
    td::optim::SGD sgd({.learning_rate = 0.1, .momentum = 0.9});
    for (int s = 0; s < 10; ++s) {
      td::GradientTape tape;
      const td::Tensor loss = loss_fn(labels.slice(s * 8, (s + 1) * 8),
                                      model(images.slice(s * 8, (s + 1) * 8), /*training=*/true));
      sgd.apply_gradients(tape.gradient(loss, model.trainable_variables()),
                          model.trainable_variables());
    }
    const std::vector<td::Variable> mine = model.weights();
    REQUIRE(mine.size() == theirs.size());
    // The moving statistics are there: 5 batch norms' means and variances.
    REQUIRE(mine.size() == 1 + 4 + 2 * (1 + 4 + 1 + 4) + 1 + 4 + 2);
    for (size_t v = 0; v < mine.size(); ++v) {
      const double difference = relative_difference(theirs[v].value().to_vector<float>(),
                                                    mine[v].value().to_vector<float>());
      INFO(mine[v].name() << ": relative difference " << difference);
      CHECK(difference <= 1e-4);
    }
    const std::vector<float> logits = model(images, /*training=*/false).to_vector<float>();
    CHECK(relative_difference(keras_logits, logits) <= 1e-4);

    // Tandem -> Keras: the checkpoint of the trained model gives Keras Tandem's logits.
    TempDir checkpoints;
    td::CheckpointManager manager(td::Checkpoint({{"model", &model}, {"optimizer", &sgd}}),
                                  checkpoints.str());
    const std::string path = *manager.save();
    const int load_status = shell(script + " --load " + path + " >" + log + " 2>&1");
    INFO("keras_blocks.py --load output:\n" << read_text(log));
    REQUIRE(load_status == 0);
    CHECK(relative_difference(logits, read_values<float>(dir.file("loaded_logits.f32"))) <= 1e-5);
  }
}
