// Data-parallel invariance, the core correctness property of the distribute layer: the same
// model trained on the same global batches ends with the same weights whether a step runs as
// 1 x 64, 2 x 32 or 4 x 16 CPU replicas.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <memory>

#include "support/compare.h"
#include "tandem/tandem.h"

namespace td = tandem;

namespace {

constexpr int64_t kGlobalBatch = 64;
constexpr int64_t kSteps = 20;
constexpr int64_t kFeatures = 8;
constexpr int64_t kClasses = 4;

enum class OptimizerKind { kSgd, kAdam };

struct Trained {
  std::vector<std::vector<float>> initial;  // every trainable variable before training
  std::vector<std::vector<float>> weights;  // replica 0's copy of every trainable variable
  bool replicas_identical = true;           // every replica's copies bitwise equal to replica 0's
};

/// Trains a small MLP for kSteps steps of kGlobalBatch examples split over `replicas`.
Trained train(int replicas, OptimizerKind kind) {
  // The same data for every run: features ~ N(0, 1), labels from a fixed linear rule.
  td::Generator data_generator(/*seed=*/2024);
  const td::Tensor features =
      td::Tensor::normal({kSteps * kGlobalBatch, kFeatures}, data_generator);
  std::vector<int64_t> label_values(static_cast<size_t>(kSteps * kGlobalBatch));
  const float* f = features.data<float>();
  for (size_t i = 0; i < label_values.size(); ++i) {
    const float score = f[i * kFeatures] + 0.5f * f[i * kFeatures + 1] - f[i * kFeatures + 2];
    label_values[i] = score < -0.7f ? 0 : score < 0.0f ? 1 : score < 0.7f ? 2 : 3;
  }
  const td::Tensor labels = td::Tensor::from_vector(label_values);

  auto strategy = td::MirroredStrategy::cpu(replicas);
  td::nn::Sequential model({td::nn::Dense(16, td::nn::Activation::kRelu), td::nn::Dense(kClasses)});
  std::unique_ptr<td::optim::Optimizer> optimizer;
  {
    auto scope = strategy.scope();
    model.set_seed(7);
    model.build({kFeatures});
    if (kind == OptimizerKind::kSgd) {
      optimizer = std::make_unique<td::optim::SGD>(
          td::optim::SGD::Options{.learning_rate = 0.1, .momentum = 0.9});
    } else {
      optimizer =
          std::make_unique<td::optim::Adam>(td::optim::Adam::Options{.learning_rate = 0.01});
    }
  }
  const std::vector<td::Variable> variables = model.trainable_variables();
  Trained out;
  for (const td::Variable& v : variables) out.initial.push_back(v.copy(0).to_vector<float>());

  auto step = [&](td::ReplicaContext& ctx, const td::Tensor& x, const td::Tensor& y) {
    td::GradientTape tape;
    const td::Tensor logits = model(x, /*training=*/true);
    const td::Tensor per_example =
        td::losses::sparse_categorical_crossentropy(y, logits, /*from_logits=*/true);
    const td::Tensor loss = td::compute_average_loss(per_example, kGlobalBatch);
    const std::vector<td::Tensor> grads = tape.gradient(loss, variables);
    optimizer->apply_gradients(ctx, grads, variables);
    return loss;
  };

  const int64_t per_replica = kGlobalBatch / replicas;
  for (int64_t s = 0; s < kSteps; ++s) {
    std::vector<td::Tensor> xs, ys;
    for (int r = 0; r < replicas; ++r) {
      const int64_t begin = s * kGlobalBatch + r * per_replica;
      xs.push_back(features.slice(begin, begin + per_replica));
      ys.push_back(labels.slice(begin, begin + per_replica));
    }
    strategy.run(step, td::PerReplica<td::Tensor>(xs), td::PerReplica<td::Tensor>(ys));
  }

  for (const td::Variable& v : variables) {
    out.weights.push_back(v.copy(0).to_vector<float>());
    for (int r = 1; r < v.num_copies(); ++r)
      out.replicas_identical =
          out.replicas_identical && v.copy(r).to_vector<float>() == out.weights.back();
  }
  REQUIRE(variables.front().num_copies() == replicas);
  return out;
}

/// max |a - b| over the tensor, relative to max |a|.
using tandem::testing::relative_difference;

void check_invariance(OptimizerKind kind) {
  const Trained one = train(1, kind);
  for (int replicas : {2, 4}) {
    const Trained many = train(replicas, kind);
    REQUIRE(many.replicas_identical);
    REQUIRE(many.weights.size() == one.weights.size());
    for (size_t v = 0; v < one.weights.size(); ++v) {
      const double difference = relative_difference(one.weights[v], many.weights[v]);
      INFO(replicas << " replicas, variable " << v << ": relative difference " << difference);
      CHECK(difference <= 1e-5);
    }
    // Training moved every variable, so agreeing is not trivial.
    for (size_t v = 0; v < one.weights.size(); ++v)
      REQUIRE(relative_difference(one.initial[v], one.weights[v]) > 1e-3);
  }
}

}  // namespace

TEST_CASE("data-parallel invariance", "[cpu][distribute]") {
  SECTION("SGD with momentum: 1x64 == 2x32 == 4x16") { check_invariance(OptimizerKind::kSgd); }
  SECTION("Adam: 1x64 == 2x32 == 4x16") { check_invariance(OptimizerKind::kAdam); }
}
