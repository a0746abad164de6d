// The GPT of samples/shakespeare_gpt (gpt.h), small: built under a two-replica scope every
// weight's copies are identical (its nanoGPT initialisation reaches every copy), and three AdamW
// updates with clipping on two replicas equal those on one replica with the global batch.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>

#include "shakespeare_gpt/gpt.h"

namespace td = tandem;

namespace {

const samples::gpt::Config kConfig{
    .vocabulary = 11, .block = 8, .layers = 2, .heads = 2, .embed = 16, .dropout = 0.0};

/// Three updates on `replicas` replicas of the 4 sequences below; the weights after them.
std::vector<std::vector<float>> train(int replicas) {
  auto strategy = td::MirroredStrategy::cpu(replicas);
  td::nn::Module model = samples::gpt::make_gpt(kConfig);
  std::unique_ptr<td::optim::AdamW> adamw;
  {
    auto scope = strategy.scope();
    model.set_seed(3);
    model.build({kConfig.block});
    adamw = std::make_unique<td::optim::AdamW>(td::optim::AdamW::Options{
        .learning_rate = 0.01, .weight_decay = 0.1, .global_clipnorm = 1.0});
    adamw->exclude_from_weight_decay(samples::gpt::undecayed(model));
  }
  for (const td::Variable& v : model.weights())
    for (int c = 1; c < v.num_copies(); ++c) {
      INFO(v.name() << " copy " << c);
      REQUIRE(v.copy(c).to_vector<float>() == v.copy(0).to_vector<float>());
    }
  const std::vector<td::Variable> variables = model.trainable_variables();
  std::vector<int64_t> all;
  for (int64_t i = 0; i < 4 * 9; ++i) all.push_back((i * i * 3 + i + 1) % 11);
  const td::Tensor tokens = td::Tensor::from_vector(all, {4, 9});
  const int64_t per = 4 / replicas;
  std::vector<td::Tensor> xs, ys;
  for (int r = 0; r < replicas; ++r) {
    const td::Tensor part = tokens.slice(r * per, (r + 1) * per);
    xs.push_back(td::ops::slice(part, 1, 0, 8));
    ys.push_back(td::ops::slice(part, 1, 1, 9));
  }
  for (int step = 0; step < 3; ++step)
    strategy.run(
        [&](td::ReplicaContext& ctx, const td::Tensor& x, const td::Tensor& y) {
          td::GradientTape tape;
          const td::Tensor loss =
              td::compute_average_loss(samples::gpt::sequence_losses(model(x, true), y), 4);
          adamw->apply_gradients(ctx, tape.gradient(loss, variables), variables);
        },
        td::PerReplica<td::Tensor>(xs), td::PerReplica<td::Tensor>(ys));
  std::vector<std::vector<float>> out;
  for (const td::Variable& v : model.weights()) out.push_back(v.value().to_vector<float>());
  return out;
}

}  // namespace

TEST_CASE("the GPT sample's model: identical copies, and two replicas step as one",
          "[cpu][nn][distribute]") {
  const auto one = train(1), two = train(2);
  REQUIRE(one.size() == two.size());
  // Within 1e-4 of one update (learning rate 0.01): Adam divides each gradient by its own root
  // mean square, so an element whose gradient nearly cancels over the batch turns the sum's
  // rounding (one order on one replica, another on two) into a visible part of its update. A
  // lost or doubled replica's share would move the weights by whole updates.
  for (size_t v = 0; v < one.size(); ++v) {
    INFO("variable " << v);
    REQUIRE(one[v].size() == two[v].size());
    double largest = 0;
    for (size_t i = 0; i < one[v].size(); ++i)
      largest = std::max(largest, std::abs(static_cast<double>(one[v][i]) - two[v][i]));
    CHECK(largest <= 1e-6);
  }
}
