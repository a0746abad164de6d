// Blocks of one's own: the ResNet sample's residual block, a user module (add_child / build_child),
// used twice in a Sequential: variable names unique across the model ("<block>/<layer>/<weight>"),
// weights in order, gradients through the skip connection, a nested Sequential's layers scoped
// by its name, checkpoints that restore the whole model, and synchronized batch norm inside the
// blocks on 2 replicas training like one replica with the global batch.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "fashion_mnist_resnet/residual_block.h"
#include "support/compare.h"
#include "tandem/tandem.h"

namespace td = tandem;
namespace nn = tandem::nn;
using td::testing::relative_difference;

namespace {

nn::Module residual_block(int64_t filters, int64_t stride, bool sync_bn = false) {
  return samples::ResidualBlock(filters, stride, sync_bn);
}

nn::Sequential small_resnet(bool sync_bn = false) {
  return nn::Sequential({nn::Conv2D(4, 3, 1, nn::Padding::kSame, nn::Activation::kNone, false),
                         residual_block(4, 1, sync_bn), residual_block(8, 2, sync_bn),
                         nn::GlobalAveragePooling2D(), nn::Dense(3)});
}

}  // namespace

TEST_CASE("a residual block of one's own: names, weights, gradients", "[cpu][nn][blocks]") {
  nn::Sequential model = small_resnet();
  model.set_seed(3);
  model.build({8, 8, 2});
  CHECK(model.output_shape() == td::Shape{3});
  std::vector<std::string> names;
  for (const td::Variable& v : model.weights()) names.push_back(v.name());
  CHECK(std::set<std::string>(names.begin(), names.end()).size() == names.size());
  CHECK(names.front() == "conv2d/kernel");
  // The sample's block names its layers as Keras attributes (add_child("conv1", ...)).
  CHECK(names[1] == "residual_block/conv1/kernel");
  CHECK(names[2] == "residual_block/bn1/gamma");
  CHECK(names[6] == "residual_block/conv2/kernel");
  // The second block's shortcut: a Sequential nested in the block, its layers under its name.
  CHECK(std::find(names.begin(), names.end(), "residual_block_1/shortcut/conv2d/kernel") !=
        names.end());
  CHECK(std::find(names.begin(), names.end(),
                  "residual_block_1/shortcut/batch_normalization/moving_variance") != names.end());
  CHECK(names.back() == "dense/bias");
  // Gradients reach every trainable variable, through the skip connections too.
  td::Generator g(4);
  const td::Tensor x = td::Tensor::normal({5, 8, 8, 2}, g);
  td::GradientTape tape;
  const td::Tensor loss = td::ops::mean(td::ops::square(model(x, true)));
  const std::vector<td::Tensor> grads = tape.gradient(loss, model.trainable_variables());
  for (size_t i = 0; i < grads.size(); ++i) {
    INFO(model.trainable_variables()[i].name());
    REQUIRE(grads[i].defined());
    double norm = 0;
    for (float v : grads[i].to_vector<float>()) norm += static_cast<double>(v) * v;
    CHECK(norm > 0);
  }
}

TEST_CASE(
    "a model of residual blocks: checkpoints restore it, synchronized batch norm inside "
    "blocks on 2 replicas trains like one replica",
    "[cpu][nn][blocks]") {
  td::Generator g(8);
  const td::Tensor images = td::Tensor::normal({64, 8, 8, 2}, g);
  std::vector<int64_t> labels(64);
  for (size_t i = 0; i < labels.size(); ++i) labels[i] = static_cast<int64_t>(i % 3);
  const td::Tensor classes = td::Tensor::from_vector(labels);
  auto train = [&](int replicas) {
    auto strategy = td::MirroredStrategy::cpu(replicas);
    nn::Sequential model = small_resnet(/*sync_bn=*/true);
    std::unique_ptr<td::optim::SGD> sgd;
    {
      auto scope = strategy.scope();
      model.set_seed(9);
      model.build({8, 8, 2});
      sgd = std::make_unique<td::optim::SGD>(td::optim::SGD::Options{.learning_rate = 0.05});
    }
    const std::vector<td::Variable> variables = model.trainable_variables();
    for (int s = 0; s < 4; ++s) {
      std::vector<td::Tensor> xs, ys;
      const int64_t per = 16 / replicas;
      for (int r = 0; r < replicas; ++r) {
        xs.push_back(images.slice(s * 16 + r * per, s * 16 + (r + 1) * per));
        ys.push_back(classes.slice(s * 16 + r * per, s * 16 + (r + 1) * per));
      }
      strategy.run(
          [&](td::ReplicaContext& ctx, const td::Tensor& x, const td::Tensor& y) {
            td::GradientTape tape;
            const td::Tensor loss = td::compute_average_loss(
                td::losses::sparse_categorical_crossentropy(y, model(x, true), true), 16);
            sgd->apply_gradients(ctx, tape.gradient(loss, variables), variables);
          },
          td::PerReplica<td::Tensor>(xs), td::PerReplica<td::Tensor>(ys));
    }
    return model;
  };
  const nn::Sequential one = train(1), two = train(2);
  const std::vector<td::Variable> a = one.weights(), b = two.weights();
  REQUIRE(a.size() == b.size());
  for (size_t v = 0; v < a.size(); ++v) {
    const double difference =
        relative_difference(a[v].value().to_vector<float>(), b[v].value().to_vector<float>());
    INFO(a[v].name() << ": relative difference " << difference);
    CHECK(difference <= 1e-5);
  }
  // A checkpoint of the trained model restores every block's variables into a fresh model.
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("tandem_blocks_" + std::to_string(::getpid()) + ".h5"))
                               .string();
  td::Checkpoint({{"model", const_cast<nn::Sequential*>(&one)}}).write(path);
  nn::Sequential fresh = small_resnet(true);
  fresh.build({8, 8, 2});
  td::Checkpoint({{"model", &fresh}}).restore(path);
  std::filesystem::remove(path);
  const std::vector<td::Variable> c = fresh.weights();
  for (size_t v = 0; v < a.size(); ++v)
    CHECK(a[v].value().to_vector<float>() == c[v].value().to_vector<float>());
}

TEST_CASE("Add sums its inputs left to right, and names what it refuses", "[cpu][nn][blocks]") {
  const nn::Add add;
  REQUIRE(add.name() == "add");
  REQUIRE(add.type_name() == "Add");
  const td::Tensor a = td::Tensor::from_vector(std::vector<float>{1e8f, 1.0f});
  const td::Tensor b = td::Tensor::from_vector(std::vector<float>{-1e8f, 2.0f});
  const td::Tensor c = td::Tensor::from_vector(std::vector<float>{1.0f, 3.0f});
  // (1e8 + -1e8) + 1 = 1, where 1e8 + (-1e8 + 1) would round to 0: the order is Keras's.
  CHECK(add({a, b, c}).to_vector<float>() == std::vector<float>{1.0f, 6.0f});
  // Gradients reach every input.
  const td::Variable v("v", a);
  td::GradientTape tape;
  const td::Tensor loss = td::ops::sum(add({v.value(), b, v.value()}));
  CHECK(tape.gradient(loss, {v})[0].to_vector<float>() == std::vector<float>{2.0f, 2.0f});
  REQUIRE_THROWS_WITH(add({a}), Catch::Contains("Add 'add'") && Catch::Contains("at least 2"));
  REQUIRE_THROWS_WITH(nn::Add("merge")({a, td::ops::cast(b, td::DType::kFloat64)}),
                      Catch::Contains("Add 'merge'") && Catch::Contains("float64"));
}
