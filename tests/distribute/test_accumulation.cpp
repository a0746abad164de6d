// Gradient accumulation under distribution: N micro-batches of B per replica give the update of
// one batch of N x B; only the N-th micro-step communicates; N = 1 is the plain path, bit for bit.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <functional>
#include <memory>

#include "support/compare.h"
#include "tandem/tandem.h"

namespace td = tandem;
namespace optim = tandem::optim;

namespace {

constexpr int64_t kUpdateBatch = 64;  // examples per update
constexpr int64_t kUpdates = 6;
constexpr int64_t kFeatures = 8;
constexpr int64_t kClasses = 4;

enum class OptimizerKind { kSgd, kAdam, kAdamClipped };

struct Data {
  td::Tensor features, labels;
};

Data make_data() {
  td::Generator generator(/*seed=*/2025);
  Data d;
  d.features = td::Tensor::normal({kUpdates * kUpdateBatch, kFeatures}, generator);
  std::vector<int64_t> labels(static_cast<size_t>(kUpdates * kUpdateBatch));
  const float* f = d.features.data<float>();
  for (size_t i = 0; i < labels.size(); ++i) {
    const float score = f[i * kFeatures] + 0.5f * f[i * kFeatures + 1] - f[i * kFeatures + 2];
    labels[i] = score < -0.7f ? 0 : score < 0.0f ? 1 : score < 0.7f ? 2 : 3;
  }
  d.labels = td::Tensor::from_vector(labels);
  return d;
}

std::unique_ptr<optim::Optimizer> make_optimizer(OptimizerKind kind, int steps) {
  switch (kind) {
    case OptimizerKind::kSgd:
      return std::make_unique<optim::SGD>(optim::SGD::Options{
          .learning_rate = 0.1, .momentum = 0.9, .gradient_accumulation_steps = steps});
    case OptimizerKind::kAdam:
      return std::make_unique<optim::Adam>(
          optim::Adam::Options{.learning_rate = 0.01, .gradient_accumulation_steps = steps});
    case OptimizerKind::kAdamClipped:
      // A clip norm the mean gradient exceeds: clipping must act on the mean (after the
      // division by N), or N micro-batches would not equal one batch.
      return std::make_unique<optim::Adam>(optim::Adam::Options{
          .learning_rate = 0.01, .global_clipnorm = 0.05, .gradient_accumulation_steps = steps});
  }
  return nullptr;
}

struct Trained {
  std::vector<std::vector<float>> initial, weights;
  bool replicas_identical = true;
  std::vector<uint64_t> all_reduce_calls;  // replica 0's communicator counter after each run
  std::vector<int64_t> iterations;         // optimizer.iterations() after each micro-step
};

/// kUpdates updates of kUpdateBatch examples, each as `steps` micro-steps of
/// kUpdateBatch / steps examples split over `replicas`. Each replica divides its loss by the
/// micro-step's global batch.
Trained train(int replicas, int steps, OptimizerKind kind, const Data& data) {
  auto strategy = td::MirroredStrategy::cpu(replicas);
  td::nn::Sequential model({td::nn::Dense(16, td::nn::Activation::kRelu), td::nn::Dense(kClasses)});
  std::unique_ptr<optim::Optimizer> optimizer;
  {
    auto scope = strategy.scope();
    model.set_seed(7);
    model.build({kFeatures});
    optimizer = make_optimizer(kind, steps);
  }
  const std::vector<td::Variable> variables = model.trainable_variables();
  Trained out;
  for (const td::Variable& v : variables) out.initial.push_back(v.copy(0).to_vector<float>());

  const int64_t micro_batch = kUpdateBatch / steps;
  const int64_t per_replica = micro_batch / replicas;
  uint64_t calls = 0;
  auto step = [&](td::ReplicaContext& ctx, const td::Tensor& x, const td::Tensor& y) {
    td::GradientTape tape;
    const td::Tensor logits = model(x, /*training=*/true);
    const td::Tensor loss = td::compute_average_loss(
        td::losses::sparse_categorical_crossentropy(y, logits, /*from_logits=*/true), micro_batch);
    optimizer->apply_gradients(ctx, tape.gradient(loss, variables), variables);
    if (ctx.replica_id_in_sync_group() == 0) calls = ctx.communicator().stats().all_reduce;
    return loss;
  };
  for (int64_t s = 0; s < kUpdates * steps; ++s) {
    std::vector<td::Tensor> xs, ys;
    for (int r = 0; r < replicas; ++r) {
      const int64_t begin = s * micro_batch + r * per_replica;
      xs.push_back(data.features.slice(begin, begin + per_replica));
      ys.push_back(data.labels.slice(begin, begin + per_replica));
    }
    strategy.run(step, td::PerReplica<td::Tensor>(xs), td::PerReplica<td::Tensor>(ys));
    out.all_reduce_calls.push_back(calls);
    out.iterations.push_back(optimizer->iterations());
  }
  for (const td::Variable& v : variables) {
    out.weights.push_back(v.copy(0).to_vector<float>());
    for (int r = 1; r < v.num_copies(); ++r)
      out.replicas_identical =
          out.replicas_identical && v.copy(r).to_vector<float>() == out.weights.back();
  }
  return out;
}

using tandem::testing::relative_difference;

void check_equivalence(OptimizerKind kind) {
  const Data data = make_data();
  const Trained reference = train(1, 1, kind, data);  // one batch of 64 per update
  for (int replicas : {1, 2}) {
    const Trained accumulated = train(replicas, 4, kind, data);  // 4 micro-batches of 16
    REQUIRE(accumulated.replicas_identical);
    for (size_t v = 0; v < reference.weights.size(); ++v) {
      const double difference = relative_difference(reference.weights[v], accumulated.weights[v]);
      INFO(replicas << " replica(s), variable " << v << ": relative difference " << difference);
      CHECK(difference <= 1e-5);
      // Training moved the variable, so agreeing is not trivial.
      CHECK(relative_difference(reference.initial[v], reference.weights[v]) > 1e-3);
    }
  }
}

}  // namespace

TEST_CASE("accumulation: 4 micro-batches of 16 == one batch of 64, on 1 and 2 replicas",
          "[cpu][distribute][accumulation]") {
  SECTION("SGD with momentum") { check_equivalence(OptimizerKind::kSgd); }
  SECTION("Adam") { check_equivalence(OptimizerKind::kAdam); }
  SECTION("Adam with global_clipnorm (clipping acts on the mean)") {
    check_equivalence(OptimizerKind::kAdamClipped);
  }
}

TEST_CASE("accumulation: one all-reduce per N micro-steps, iterations count updates",
          "[cpu][distribute][accumulation]") {
  const Data data = make_data();
  for (int steps : {1, 2, 4, 8}) {
    INFO("N = " << steps);
    const Trained run = train(2, steps, OptimizerKind::kAdam, data);
    REQUIRE(run.all_reduce_calls.size() == static_cast<size_t>(kUpdates * steps));
    uint64_t previous = run.all_reduce_calls.front() - (steps == 1 ? 1 : 0);
    const uint64_t base = previous;
    for (size_t s = 0; s < run.all_reduce_calls.size(); ++s) {
      const bool boundary = (s + 1) % static_cast<size_t>(steps) == 0;
      INFO("micro-step " << s + 1);
      // Exactly one all-reduce on micro-step N, none on the others.
      CHECK(run.all_reduce_calls[s] - previous == (boundary ? 1u : 0u));
      CHECK(run.iterations[s] == static_cast<int64_t>((s + 1) / static_cast<size_t>(steps)));
      previous = run.all_reduce_calls[s];
    }
    CHECK(run.all_reduce_calls.back() - base == static_cast<uint64_t>(kUpdates));
  }
}

TEST_CASE("accumulation: N = 1 is the plain path, bit for bit", "[cpu][distribute][accumulation]") {
  // The optimizer with N = 1 against a loop that all-reduces by hand and applies the reduced
  // gradients with the cross-replica form: the same bits on every replica.
  const Data data = make_data();
  auto run = [&](bool by_hand) {
    auto strategy = td::MirroredStrategy::cpu(2);
    td::nn::Sequential model(
        {td::nn::Dense(16, td::nn::Activation::kRelu), td::nn::Dense(kClasses)});
    std::unique_ptr<optim::Optimizer> optimizer;
    {
      auto scope = strategy.scope();
      model.set_seed(7);
      model.build({kFeatures});
      optimizer = make_optimizer(OptimizerKind::kAdamClipped, 1);
    }
    CHECK(optimizer->accumulator_variables().empty());
    const std::vector<td::Variable> variables = model.trainable_variables();
    auto step = [&](td::ReplicaContext& ctx, const td::Tensor& x, const td::Tensor& y) {
      td::GradientTape tape;
      const td::Tensor loss = td::compute_average_loss(
          td::losses::sparse_categorical_crossentropy(y, model(x, true), true), kUpdateBatch);
      const std::vector<td::Tensor> grads = tape.gradient(loss, variables);
      if (by_hand) {
        optimizer->apply_gradients(ctx.all_reduce(td::ReduceOp::kSum, grads), variables,
                                   {.skip_gradients_aggregation = true});
      } else {
        optimizer->apply_gradients(ctx, grads, variables);
      }
      return loss;
    };
    for (int64_t s = 0; s < kUpdates; ++s) {
      const int64_t begin = s * kUpdateBatch;
      strategy.run(step,
                   td::PerReplica<td::Tensor>({data.features.slice(begin, begin + 32),
                                               data.features.slice(begin + 32, begin + 64)}),
                   td::PerReplica<td::Tensor>({data.labels.slice(begin, begin + 32),
                                               data.labels.slice(begin + 32, begin + 64)}));
      CHECK(optimizer->micro_step() == 0);
    }
    std::vector<std::vector<float>> out;
    for (const td::Variable& v : variables)
      for (int r = 0; r < v.num_copies(); ++r) out.push_back(v.copy(r).to_vector<float>());
    for (const auto& [name, slot] : optimizer->slot_variables())
      for (int r = 0; r < slot.num_copies(); ++r) out.push_back(slot.copy(r).to_vector<float>());
    CHECK(optimizer->iterations() == kUpdates);
    return out;
  };
  const auto plain = run(false);
  const auto by_hand = run(true);
  REQUIRE(plain.size() == by_hand.size());
  for (size_t i = 0; i < plain.size(); ++i) CHECK(plain[i] == by_hand[i]);
}

TEST_CASE("accumulation: learning-rate schedules see updates, not micro-steps",
          "[cpu][optim][accumulation]") {
  const optim::schedules::ExponentialDecay schedule(/*initial_learning_rate=*/0.1,
                                                    /*decay_steps=*/1, /*decay_rate=*/0.5,
                                                    /*staircase=*/true);
  optim::SGD sgd({.learning_rate = schedule, .gradient_accumulation_steps = 3});
  td::Variable w("w", td::Tensor::from_vector(std::vector<float>{1.0f}));
  const td::Tensor g = td::Tensor::from_vector(std::vector<float>{1.0f});
  std::vector<float> after;
  for (int call = 1; call <= 9; ++call) {
    sgd.apply_gradients({g}, {w});
    CHECK(sgd.iterations() == call / 3);
    CHECK(sgd.micro_step() == call % 3);
    CHECK(sgd.current_learning_rate() == Approx(0.1 * std::pow(0.5, call / 3)));
    after.push_back(w.value_untracked().item<float>());
  }
  // The weight moves only on calls 3, 6, 9, by the mean gradient (1) times 0.1, 0.05, 0.025.
  CHECK(after[0] == 1.0f);
  CHECK(after[1] == 1.0f);
  CHECK(after[2] == Approx(0.9f));
  CHECK(after[4] == Approx(0.9f));
  CHECK(after[5] == Approx(0.85f));
  CHECK(after[8] == Approx(0.825f));
}

TEST_CASE("accumulation: bad settings are refused with the value", "[cpu][optim][accumulation]") {
  CHECK_THROWS_WITH(optim::SGD({.gradient_accumulation_steps = 0}),
                    Catch::Contains("gradient_accumulation_steps must be >= 1, got 0"));
  CHECK_THROWS_WITH(optim::Adam({.gradient_accumulation_steps = -2}), Catch::Contains("got -2"));
  optim::Adam adam({.gradient_accumulation_steps = 4});
  CHECK_THAT(adam.config_json(), Catch::Contains("\"gradient_accumulation_steps\": 4"));
  CHECK_THROWS_WITH(adam.set_micro_step(4), Catch::Contains("micro_step must be in [0, "
                                                            "gradient_accumulation_steps = 4)"));
}
