// Batch norm across replicas. Synchronized: N replicas with per-replica batch b train exactly
// like one replica with batch N x b (outputs, weights and moving statistics after 20 steps),
// also when a partial batch leaves a replica empty. Unsynchronized: each replica's moving
// statistics follow its own slice; outside run they read as the replicas' mean.
#include <catch2/catch.hpp>
#include <memory>
#include <vector>

#include "support/compare.h"
#include "tandem/tandem.h"

namespace td = tandem;
namespace nn = tandem::nn;
using td::testing::relative_difference;

namespace {

constexpr int64_t kFeatures = 6;

struct Run {
  std::vector<std::vector<float>> weights;  // every variable, cross-replica reads
  std::vector<float> first_outputs;         // the first step's outputs, in global row order
  std::vector<std::vector<float>> statistic_copies;  // the moving mean's copy per replica
};

/// `steps` SGD steps of Dense(8, no bias) -> BatchNormalization -> Dense(4) on `replicas` CPU
/// replicas; step s takes rows [s * batch, s * batch + sizes[s]) of the data, split as evenly as
/// possible over the replicas (the last ones get fewer rows; possibly none).
Run train(int replicas, bool synchronized, const std::vector<int64_t>& sizes, int64_t batch) {
  td::Generator g(/*seed=*/5);
  const int64_t total = static_cast<int64_t>(sizes.size()) * batch;
  const td::Tensor features = td::Tensor::normal({total, kFeatures}, g);
  std::vector<int64_t> labels(static_cast<size_t>(total));
  for (size_t i = 0; i < labels.size(); ++i) labels[i] = static_cast<int64_t>((i * 5 + 1) % 4);
  const td::Tensor label_tensor = td::Tensor::from_vector(labels);
  auto strategy = td::MirroredStrategy::cpu(replicas);
  // No bias before the batch norm (which takes the mean out): its gradient would be rounding
  // noise around zero.
  nn::Sequential model({nn::Dense(8, nn::Activation::kNone, /*use_bias=*/false),
                        nn::BatchNormalization({.synchronized = synchronized}), nn::Dense(4)});
  std::unique_ptr<td::optim::SGD> sgd;
  {
    auto scope = strategy.scope();
    model.set_seed(11);
    model.build({kFeatures});
    sgd = std::make_unique<td::optim::SGD>(td::optim::SGD::Options{.learning_rate = 0.1});
  }
  const std::vector<td::Variable> variables = model.trainable_variables();
  Run out;
  for (size_t s = 0; s < sizes.size(); ++s) {
    const int64_t global = sizes[s];
    std::vector<td::Tensor> xs, ys;
    int64_t begin = static_cast<int64_t>(s) * batch;
    for (int r = 0; r < replicas; ++r) {
      const int64_t rows = global / replicas + (r < global % replicas ? 1 : 0);
      xs.push_back(features.slice(begin, begin + rows));
      ys.push_back(label_tensor.slice(begin, begin + rows));
      begin += rows;
    }
    std::vector<std::vector<float>> outputs(static_cast<size_t>(replicas));
    strategy.run(
        [&](td::ReplicaContext& ctx, const td::Tensor& x, const td::Tensor& y) {
          td::GradientTape tape;
          const td::Tensor logits = model(x, /*training=*/true);
          outputs[static_cast<size_t>(ctx.replica_id_in_sync_group())] = logits.to_vector<float>();
          const td::Tensor loss = td::compute_average_loss(
              td::losses::sparse_categorical_crossentropy(y, logits, /*from_logits=*/true), global);
          sgd->apply_gradients(ctx, tape.gradient(loss, variables), variables);
        },
        td::PerReplica<td::Tensor>(xs), td::PerReplica<td::Tensor>(ys));
    if (s == 0)
      for (const std::vector<float>& o : outputs)
        out.first_outputs.insert(out.first_outputs.end(), o.begin(), o.end());
  }
  for (const td::Variable& v : model.weights()) out.weights.push_back(v.value().to_vector<float>());
  const td::Variable moving_mean = model.children()[1].weights()[2];
  for (int r = 0; r < moving_mean.num_copies(); ++r)
    out.statistic_copies.push_back(moving_mean.copy(r).to_vector<float>());
  return out;
}

void check_same(const Run& reference, const Run& run) {
  CHECK(relative_difference(reference.first_outputs, run.first_outputs) <= 1e-5);
  REQUIRE(reference.weights.size() == run.weights.size());
  for (size_t v = 0; v < run.weights.size(); ++v) {
    const double difference = relative_difference(reference.weights[v], run.weights[v]);
    INFO("variable " << v << ": relative difference " << difference);
    CHECK(difference <= 1e-5);
  }
}

}  // namespace

TEST_CASE("synchronized batch norm: N replicas x b train like one replica x N*b",
          "[cpu][distribute][batch_norm]") {
  const std::vector<int64_t> sizes(20, 32);
  const Run one = train(1, /*synchronized=*/true, sizes, 32);
  for (int replicas : {2, 4}) {
    INFO(replicas << " replicas");
    const Run many = train(replicas, /*synchronized=*/true, sizes, 32);
    check_same(one, many);
    // Every replica normalized by the same statistics: their moving means agree.
    for (const std::vector<float>& copy : many.statistic_copies)
      CHECK(relative_difference(many.statistic_copies[0], copy) <= 1e-6);
  }
  // Plain batch norm on one replica is the same layer.
  check_same(one, train(1, /*synchronized=*/false, sizes, 32));
}

TEST_CASE("synchronized batch norm: a partial batch that leaves a replica empty",
          "[cpu][distribute][batch_norm]") {
  // Steps of 32 rows, then one of 3 over 4 replicas: 1, 1, 1 and 0 rows.
  std::vector<int64_t> sizes(5, 32);
  sizes.push_back(3);
  const Run one = train(1, true, sizes, 32);
  const Run four = train(4, true, sizes, 32);
  check_same(one, four);
}

TEST_CASE("unsynchronized batch norm: each replica's statistics, read outside run as their mean",
          "[cpu][distribute][batch_norm]") {
  const std::vector<int64_t> sizes(5, 32);
  const Run two = train(2, /*synchronized=*/false, sizes, 32);
  REQUIRE(two.statistic_copies.size() == 2);
  CHECK(two.statistic_copies[0] != two.statistic_copies[1]);
  // weights[3] is the moving mean (the Dense kernel, then gamma, beta, moving mean, ...).
  std::vector<float> mean(two.statistic_copies[0].size());
  for (size_t i = 0; i < mean.size(); ++i)
    mean[i] = (two.statistic_copies[0][i] + two.statistic_copies[1][i]) / 2.0f;
  CHECK(relative_difference(mean, two.weights[3]) <= 1e-6);
  // Not the global batch's statistics: unlike the synchronized layer, it differs from one
  // replica with the whole batch.
  const Run one = train(1, false, sizes, 32);
  CHECK(relative_difference(one.first_outputs, two.first_outputs) > 1e-3);
}
