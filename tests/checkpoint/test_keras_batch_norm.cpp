// BatchNormalization against Keras 3 (tests/interop/keras_batch_norm.py, when TensorFlow and
// Keras 3 are installed; skipped otherwise): from Keras's initial weights (load_weights), 20 SGD
// steps on the same batches give Keras's weights and moving statistics, plain on one replica and
// synchronized on two (MirroredStrategy over two CPU devices in Keras), and the same outputs in
// training and inference mode. And where Tandem differs: unsynchronized, Keras 3 keeps the
// moving statistics as mirrored variables whose copies each replica updates alone and reads
// replica 0's outside the replicas (and saves it); Tandem reads and saves their mean (as
// tf.keras 2 did, with ON_READ / MEAN variables). Last, a small convolutional model with
// same-padded Conv2D, BatchNormalization, Activation, GlobalAveragePooling2D and
// LayerNormalization gives Keras's weights after 10 steps.
#include <cmath>
#include <cstring>
#include <memory>

#include "checkpoint_test_util.h"
#include "interop_test_util.h"
#include "support/compare.h"

namespace td = tandem;
namespace nn = tandem::nn;
using namespace tandem::checkpoint_testing;
using td::testing::relative_difference;

namespace {

constexpr int kSteps = 20;
constexpr int64_t kBatch = 32;

nn::Sequential model_with(bool synchronized) {
  return nn::Sequential({nn::Dense(8, nn::Activation::kNone, /*use_bias=*/false),
                         nn::BatchNormalization({.synchronized = synchronized}), nn::Dense(4)});
}

/// Every weight of `model` against those Keras saved to `path` (the same architecture).
void check_weights(const nn::Sequential& model, const std::string& path, double tolerance) {
  nn::Sequential keras = model_with(false);
  keras.build({6});
  td::load_weights(keras, path);
  const std::vector<td::Variable> mine = model.weights(), theirs = keras.weights();
  REQUIRE(mine.size() == theirs.size());
  for (size_t v = 0; v < mine.size(); ++v) {
    const double difference = relative_difference(theirs[v].value().to_vector<float>(),
                                                  mine[v].value().to_vector<float>());
    INFO(mine[v].name() << ": relative difference " << difference);
    CHECK(difference <= tolerance);
  }
}

}  // namespace

TEST_CASE(
    "BatchNormalization trains as Keras 3's: plain on one replica, synchronized on two, moving "
    "statistics and inference outputs",
    "[cpu][checkpoint][interop][batch_norm]") {
  const std::string python = tensorflow_python_or_skip();
  if (python.empty()) return;
  TempDir dir;
  const std::string log = dir.file("keras_batch_norm.log");
  const int status = shell(python + " " + kInteropDir + "/keras_batch_norm.py " + dir.str() + " >" +
                           log + " 2>&1");
  INFO("keras_batch_norm.py output:\n" << read_text(log));
  if (status == 77) {
    WARN("keras_batch_norm.py could not import TensorFlow and Keras 3; skipped");
    return;
  }
  REQUIRE(status == 0);
  const std::vector<float> x = read_values<float>(dir.file("x.f32"));
  const std::vector<int64_t> y = read_values<int64_t>(dir.file("y.i64"));
  REQUIRE(x.size() == static_cast<size_t>(kSteps * kBatch * 6));
  const td::Tensor features = td::Tensor::from_vector(x, td::Shape{kSteps * kBatch, 6});
  const td::Tensor labels = td::Tensor::from_vector(y);
  const td::losses::SparseCategoricalCrossentropy loss_fn({.from_logits = true});

  SECTION("plain, one replica") {
    nn::Sequential model = model_with(false);
    model.build({6});
    td::load_weights(model, dir.file("initial.weights.h5"));
    td::optim::SGD sgd({.learning_rate = 0.1});
    for (int s = 0; s < kSteps; ++s) {
      const td::Tensor xb = features.slice(s * kBatch, (s + 1) * kBatch);
      td::GradientTape tape;
      const td::Tensor logits = model(xb, /*training=*/true);
      if (s == 0)
        CHECK(relative_difference(read_values<float>(dir.file("plain_first.f32")),
                                  logits.to_vector<float>()) <= 1e-5);
      const td::Tensor loss = loss_fn(labels.slice(s * kBatch, (s + 1) * kBatch), logits);
      sgd.apply_gradients(tape.gradient(loss, model.trainable_variables()),
                          model.trainable_variables());
    }
    check_weights(model, dir.file("plain.weights.h5"), 1e-4);
    CHECK(relative_difference(read_values<float>(dir.file("plain_inference.f32")),
                              model(features.slice(0, kBatch), false).to_vector<float>()) <= 1e-4);
  }

  SECTION("synchronized, two replicas") {
    auto strategy = td::MirroredStrategy::cpu(2);
    nn::Sequential model = model_with(true);
    std::unique_ptr<td::optim::SGD> sgd;
    {
      auto scope = strategy.scope();
      model.build({6});
      sgd = std::make_unique<td::optim::SGD>(td::optim::SGD::Options{.learning_rate = 0.1});
    }
    td::load_weights(model, dir.file("initial.weights.h5"));
    const std::vector<td::Variable> variables = model.trainable_variables();
    for (int s = 0; s < kSteps; ++s) {
      std::vector<td::Tensor> xs, ys;
      for (int r = 0; r < 2; ++r) {
        const int64_t begin = s * kBatch + r * (kBatch / 2);
        xs.push_back(features.slice(begin, begin + kBatch / 2));
        ys.push_back(labels.slice(begin, begin + kBatch / 2));
      }
      strategy.run(
          [&](td::ReplicaContext& ctx, const td::Tensor& xr, const td::Tensor& yr) {
            td::GradientTape tape;
            const td::Tensor loss = td::compute_average_loss(
                td::losses::sparse_categorical_crossentropy(yr, model(xr, true), true), kBatch);
            sgd->apply_gradients(ctx, tape.gradient(loss, variables), variables);
          },
          td::PerReplica<td::Tensor>(xs), td::PerReplica<td::Tensor>(ys));
    }
    check_weights(model, dir.file("synchronized.weights.h5"), 1e-4);
  }

  SECTION("unsynchronized on two replicas: Keras reads replica 0's copy, Tandem the mean") {
    const std::vector<float> keras = read_values<float>(dir.file("unsynchronized.f32"));
    REQUIRE(keras.size() == 6);
    // Keras: copies [5.25, 10.25] and [10.25, 20.25]; read and saved: replica 0's.
    CHECK(std::vector<float>(keras.begin() + 4, keras.end()) ==
          std::vector<float>(keras.begin(), keras.begin() + 2));
    auto strategy = td::MirroredStrategy::cpu(2);
    nn::BatchNormalization bn({.momentum = 0.5});
    {
      auto scope = strategy.scope();
      bn.build({2});
    }
    strategy.run([&](td::ReplicaContext& ctx) {
      const float scale = static_cast<float>((ctx.replica_id_in_sync_group() + 1) * 10);
      const td::Tensor x = td::Tensor::from_vector(
          std::vector<float>{scale, 2 * scale, scale + 1, 2 * scale + 1}, td::Shape{2, 2});
      (void)bn(x, /*training=*/true);
    });
    const td::Variable moving_mean = bn.weights()[2];
    // The same copies as Keras's...
    CHECK(moving_mean.copy(0).to_vector<float>() ==
          std::vector<float>(keras.begin(), keras.begin() + 2));
    CHECK(moving_mean.copy(1).to_vector<float>() ==
          std::vector<float>(keras.begin() + 2, keras.begin() + 4));
    // ...read as their mean.
    CHECK(moving_mean.value().to_vector<float>() ==
          std::vector<float>{(keras[0] + keras[2]) / 2, (keras[1] + keras[3]) / 2});
  }

  SECTION("a convolution, batch norm, activation, average pooling, global pooling, layer norm") {
    auto cnn = [] {
      return nn::Sequential({nn::Conv2D(4, 3, 1, nn::Padding::kSame, nn::Activation::kNone, false),
                             nn::BatchNormalization(), nn::ActivationLayer(nn::Activation::kRelu),
                             nn::AvgPool2D(3, 2, nn::Padding::kSame), nn::GlobalAveragePooling2D(),
                             nn::LayerNormalization(), nn::Dense(3)});
    };
    nn::Sequential model = cnn();
    model.build({8, 8, 2});
    td::load_weights(model, dir.file("cnn_initial.weights.h5"));
    const td::Tensor images =
        td::Tensor::from_vector(read_values<float>(dir.file("cnn_x.f32")), td::Shape{160, 8, 8, 2});
    const td::Tensor classes = td::Tensor::from_vector(read_values<int64_t>(dir.file("cnn_y.i64")));
    td::optim::SGD sgd({.learning_rate = 0.1});
    for (int s = 0; s < 10; ++s) {
      td::GradientTape tape;
      const td::Tensor loss = loss_fn(classes.slice(s * 16, (s + 1) * 16),
                                      model(images.slice(s * 16, (s + 1) * 16), true));
      sgd.apply_gradients(tape.gradient(loss, model.trainable_variables()),
                          model.trainable_variables());
    }
    nn::Sequential keras = cnn();
    keras.build({8, 8, 2});
    td::load_weights(keras, dir.file("cnn_final.weights.h5"));
    const std::vector<td::Variable> mine = model.weights(), theirs = keras.weights();
    REQUIRE(mine.size() == theirs.size());
    for (size_t v = 0; v < mine.size(); ++v) {
      const double difference = relative_difference(theirs[v].value().to_vector<float>(),
                                                    mine[v].value().to_vector<float>());
      INFO(mine[v].name() << ": relative difference " << difference);
      CHECK(difference <= 1e-4);
    }
  }

  SECTION("an embedding, its gradient rows added where tokens repeat") {
    auto embedder = [] {
      return nn::Sequential({nn::Embedding(50, 4), nn::Flatten(), nn::Dense(3)});
    };
    nn::Sequential model = embedder();
    model.build({5});
    td::load_weights(model, dir.file("embed_initial.weights.h5"));
    const td::Tensor tokens =
        td::Tensor::from_vector(read_values<int32_t>(dir.file("embed_x.i32")), td::Shape{80, 5});
    const td::Tensor classes = td::Tensor::from_vector(read_values<int64_t>(dir.file("cnn_y.i64")));
    td::optim::SGD sgd({.learning_rate = 0.1});
    for (int s = 0; s < 10; ++s) {
      td::GradientTape tape;
      const td::Tensor loss =
          loss_fn(classes.slice(s * 8, (s + 1) * 8), model(tokens.slice(s * 8, (s + 1) * 8), true));
      sgd.apply_gradients(tape.gradient(loss, model.trainable_variables()),
                          model.trainable_variables());
    }
    nn::Sequential keras = embedder();
    keras.build({5});
    td::load_weights(keras, dir.file("embed_final.weights.h5"));
    const std::vector<td::Variable> mine = model.weights(), theirs = keras.weights();
    REQUIRE(mine.size() == theirs.size());
    REQUIRE(mine[0].name() == "embedding/embeddings");
    for (size_t v = 0; v < mine.size(); ++v) {
      const double difference = relative_difference(theirs[v].value().to_vector<float>(),
                                                    mine[v].value().to_vector<float>());
      INFO(mine[v].name() << ": relative difference " << difference);
      CHECK(difference <= 1e-5);
    }
  }
}
