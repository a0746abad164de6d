// LossScaleOptimizer: Keras 3's dynamic rule (x2 after N finite updates in a row, /2 and skip on
// a non-finite one, iterations() not counting skips), unscaling before clipping, and the
// decision taken on the gradients combined across replicas: an Inf on one replica skips the
// update on every replica, with 2 and 4 replicas, gradient buckets and accumulation.
#include <catch2/catch.hpp>
#include <cmath>
#include <limits>
#include <memory>
#include <vector>

#include "tandem/tandem.h"

namespace td = tandem;
namespace optim = tandem::optim;

namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

}  // namespace

TEST_CASE(
    "LossScaleOptimizer follows Keras 3's dynamic scale: x2 after N finite updates, /2 and "
    "a skipped update on a non-finite one",
    "[cpu][optim]") {
  td::Variable w("w", td::Tensor::from_vector<float>({1.0f, 2.0f}), true);
  optim::SGD sgd({.learning_rate = 1.0});
  optim::LossScaleOptimizer lso(sgd, {.initial_scale = 4.0, .dynamic_growth_steps = 3});
  CHECK(lso.loss_scale() == 4.0);
  CHECK(lso.scale_loss(td::Tensor::scalar(0.5)).item<double>() == 2.0);

  // Gradients of the scaled loss: g x scale. Finite ones are divided by the scale before SGD
  // (w -= g), exactly.
  const auto step = [&](float g0, float g1) {
    const double scale = lso.loss_scale();
    lso.apply_gradients({td::Tensor::from_vector<float>(
                            {g0 * static_cast<float>(scale), g1 * static_cast<float>(scale)})},
                        {w});
  };
  struct Expect {
    float g0;
    double scale_after;
    int64_t counter_after, iterations_after;
  };
  const std::vector<Expect> sequence = {
      {0.25f, 4, 1, 1}, {0.25f, 4, 2, 2}, {0.25f, 8, 0, 3},  // third finite update: x2
      {kInf, 4, 0, 3},                                       // skipped, halved
      {0.5f, 4, 1, 4},  {NAN, 2, 0, 4},   {NAN, 1, 0, 4},    // two skips in a row
      {0.5f, 1, 1, 5},  {0.5f, 1, 2, 6},  {0.5f, 2, 0, 7}};
  std::vector<float> expected = {1.0f, 2.0f};
  int index = 0;
  for (const Expect& e : sequence) {
    INFO("update " << index++);
    step(e.g0, 0.125f);
    if (std::isfinite(e.g0)) {
      expected[0] -= e.g0;
      expected[1] -= 0.125f;
    }
    CHECK(lso.loss_scale() == e.scale_after);
    CHECK(lso.step_counter() == e.counter_after);
    CHECK(sgd.iterations() == e.iterations_after);  // Keras 3: skipped updates do not count
    CHECK(w.value().to_vector<float>() == expected);
  }
  CHECK(lso.skipped_updates() == 3);
}

TEST_CASE("LossScaleOptimizer unscales before clipping, and a fixed scale skips nothing",
          "[cpu][optim]") {
  td::Variable w("w", td::Tensor::from_vector<float>({0.0f, 0.0f}), true);
  optim::SGD sgd({.learning_rate = 1.0, .global_clipnorm = 1.0});
  optim::LossScaleOptimizer lso(sgd, {.initial_scale = 1024.0, .dynamic = false});
  // The true gradient (3, 4) has norm 5: clipped to (0.6, 0.8). Clipping the scaled one would
  // give the same direction but the clip would see norm 5120.
  lso.apply_gradients({td::Tensor::from_vector<float>({3.0f * 1024, 4.0f * 1024})}, {w});
  const std::vector<float> after = w.value().to_vector<float>();
  CHECK(after[0] == Approx(-0.6f));
  CHECK(after[1] == Approx(-0.8f));
  CHECK(lso.loss_scale() == 1024.0);
  CHECK(lso.step_counter() == 0);
}

TEST_CASE("LossScaleOptimizer refuses bad options and a second wrapper", "[cpu][optim]") {
  optim::SGD sgd;
  CHECK_THROWS_WITH(optim::LossScaleOptimizer(sgd, {.initial_scale = 0}),
                    Catch::Contains("initial_scale"));
  CHECK_THROWS_WITH(optim::LossScaleOptimizer(sgd, {.dynamic_growth_steps = 0}),
                    Catch::Contains("dynamic_growth_steps"));
  optim::LossScaleOptimizer first(sgd);
  CHECK_THROWS_WITH(optim::LossScaleOptimizer(sgd),
                    Catch::Contains("\"sgd\" is already wrapped") &&
                        Catch::Contains("(\"loss_scale_optimizer\")"));
  CHECK_THROWS_WITH(first.set_state(-1.0, 0), Catch::Contains("loss scale"));
  CHECK_THROWS_WITH(first.set_state(8.0, 2000), Catch::Contains("step_counter 2000"));
}

TEST_CASE("LossScaleOptimizer is an Optimizer: one step function for both, the state the inner's",
          "[cpu][optim]") {
  td::Variable w("w", td::Tensor::from_vector<float>({1.0f, -2.0f}), true);
  optim::Adam adam({.learning_rate = 0.1});
  const td::Tensor loss = td::Tensor::scalar(3.0, td::DType::kFloat32);
  // A plain optimizer's scale_loss is the loss itself (Keras 3's base class).
  CHECK(adam.scale_loss(loss).item<float>() == 3.0f);
  CHECK(&adam.innermost() == &adam);
  {
    optim::LossScaleOptimizer lso(adam, {.initial_scale = 8.0});
    optim::Optimizer& optimizer = lso;
    CHECK(optimizer.name() == "loss_scale_optimizer");
    CHECK(&optimizer.innermost() == &adam);
    CHECK(optimizer.scale_loss(loss).item<float>() == 24.0f);
    // Every call reaches the inner optimizer: the update, the counter, the slots, the rate.
    optimizer.apply_gradients({td::Tensor::from_vector<float>({8.0f, -16.0f})}, {w});
    CHECK(optimizer.iterations() == 1);
    CHECK(adam.iterations() == 1);
    CHECK(&optimizer.iterations_variable() == &adam.iterations_variable());
    CHECK(optimizer.slot_names() == adam.slot_names());
    REQUIRE(optimizer.slot_variables().size() == 2);
    CHECK(optimizer.slot_variables()[0].second.id() == adam.slot(w, "m").id());
    CHECK(optimizer.slot(w, "v").id() == adam.slot(w, "v").id());
    CHECK(optimizer.current_learning_rate() == Approx(0.1));
    optimizer.set_learning_rate(0.05);
    CHECK(adam.current_learning_rate() == Approx(0.05));
    optimizer.set_iterations(7);
    CHECK(adam.iterations() == 7);
    // The update went through Adam with the unscaled gradient (1, -2): Adam's first step moves
    // each weight by the rate against the gradient's sign.
    const std::vector<float> after = w.value().to_vector<float>();
    CHECK(after[0] == Approx(1.0f - 0.1f).epsilon(1e-5));
    CHECK(after[1] == Approx(-2.0f + 0.1f).epsilon(1e-5));
    // A non-finite gradient: skipped (the counter stays), the scale halves.
    optimizer.apply_gradients({td::Tensor::from_vector<float>({INFINITY, 0.0f})}, {w});
    CHECK(adam.iterations() == 7);
    CHECK(lso.loss_scale() == 4.0);
  }
  // Once the wrapper is gone, Adam updates unwrapped (nothing is skipped or unscaled) and may be
  // wrapped again.
  td::Variable u("u", td::Tensor::from_vector<float>({0.0f}), true);
  optim::SGD sgd({.learning_rate = 1.0});
  { optim::LossScaleOptimizer lso(sgd, {.initial_scale = 4.0}); }
  sgd.apply_gradients({td::Tensor::from_vector<float>({2.0f})}, {u});
  CHECK(u.value().to_vector<float>() == std::vector<float>{-2.0f});
  optim::LossScaleOptimizer again(sgd, {.initial_scale = 4.0});
  again.apply_gradients({td::Tensor::from_vector<float>({4.0f})}, {u});
  CHECK(u.value().to_vector<float>() == std::vector<float>{-3.0f});
}

namespace {

constexpr int64_t kBatch = 24;
constexpr int64_t kFeatures = 6;

struct Run {
  std::vector<std::vector<std::vector<float>>> weights;  // after each step, replica 0's
  std::vector<double> scales;                            // after each step, replica 0's
  std::vector<int64_t> iterations;                       // after each step
  bool replicas_identical = true;                        // every copy, after every step
  bool finite = true;
};

/// `steps` steps of a 6 -> 16 -> 3 MLP with Adam on `replicas` CPU replicas; with `scaled`, under a
/// LossScaleOptimizer (initial 2^15). At step `bad_step`, replica `bad_replica`'s loss is
/// multiplied by Inf, so its gradients (only) are not finite.
Run train(int replicas, td::CommunicationOptions communication, int accumulation, bool scaled,
          int steps, int bad_step = -1, int bad_replica = 0) {
  auto strategy = td::MirroredStrategy::cpu(replicas);
  strategy.set_communication_options(communication);
  td::nn::Sequential model({td::nn::Dense(16, td::nn::Activation::kRelu), td::nn::Dense(3)});
  std::unique_ptr<optim::Adam> adam;
  std::unique_ptr<optim::LossScaleOptimizer> lso;
  {
    auto scope = strategy.scope();
    model.set_seed(5);
    model.build({kFeatures});
    adam = std::make_unique<optim::Adam>(
        optim::Adam::Options{.learning_rate = 0.01, .gradient_accumulation_steps = accumulation});
    if (scaled) lso = std::make_unique<optim::LossScaleOptimizer>(*adam);
  }
  const std::vector<td::Variable> variables = model.trainable_variables();
  td::Generator generator(17);
  const td::Tensor features = td::Tensor::normal({steps * kBatch, kFeatures}, generator);
  std::vector<int64_t> label_values(static_cast<size_t>(steps * kBatch));
  for (size_t i = 0; i < label_values.size(); ++i) label_values[i] = static_cast<int64_t>(i % 3);
  const td::Tensor labels = td::Tensor::from_vector(label_values);
  const int64_t per_replica = kBatch / replicas;
  Run out;
  for (int s = 0; s < steps; ++s) {
    std::vector<td::Tensor> xs, ys;
    for (int r = 0; r < replicas; ++r) {
      const int64_t begin = s * kBatch + r * per_replica;
      xs.push_back(features.slice(begin, begin + per_replica));
      ys.push_back(labels.slice(begin, begin + per_replica));
    }
    strategy.run(
        [&](td::ReplicaContext& ctx, const td::Tensor& x, const td::Tensor& y) {
          td::GradientTape tape;
          td::Tensor loss = td::compute_average_loss(
              td::losses::sparse_categorical_crossentropy(y, model(x, true), true), kBatch);
          if (s == bad_step && ctx.replica_id_in_sync_group() == bad_replica) loss = loss * kInf;
          if (lso) {
            lso->apply_gradients(ctx, tape.gradient(lso->scale_loss(loss), variables), variables);
          } else {
            adam->apply_gradients(ctx, tape.gradient(loss, variables), variables);
          }
        },
        td::PerReplica<td::Tensor>(xs), td::PerReplica<td::Tensor>(ys));
    std::vector<std::vector<float>> now;
    for (const td::Variable& v : variables) {
      now.push_back(v.copy(0).to_vector<float>());
      for (float value : now.back()) out.finite = out.finite && std::isfinite(value);
      for (int r = 1; r < v.num_copies(); ++r)
        out.replicas_identical =
            out.replicas_identical && v.copy(r).to_vector<float>() == now.back();
    }
    out.weights.push_back(now);
    out.scales.push_back(lso ? lso->dynamic_scale_variable().copy(0).item<double>() : 1.0);
    if (lso)
      for (int r = 1; r < replicas; ++r)
        out.replicas_identical =
            out.replicas_identical &&
            lso->dynamic_scale_variable().copy(r).item<double>() == out.scales.back();
    out.iterations.push_back(adam->iterations());
  }
  return out;
}

constexpr td::CommunicationOptions kNoBuckets{.bytes_per_pack = 0, .first_bytes_per_pack = 0};
constexpr td::CommunicationOptions kBuckets{.bytes_per_pack = 256, .first_bytes_per_pack = 1};

}  // namespace

TEST_CASE("a power-of-two loss scale trains bitwise as no scale does", "[cpu][optim][distribute]") {
  for (const int replicas : {1, 2}) {
    INFO(replicas << " replicas");
    const Run plain = train(replicas, kNoBuckets, 1, false, 4);
    const Run scaled = train(replicas, kBuckets, 1, true, 4);
    CHECK(scaled.weights == plain.weights);
    CHECK(scaled.iterations == plain.iterations);
    CHECK(scaled.scales.back() == 32768.0);
  }
}

TEST_CASE(
    "an Inf in one replica's gradient skips that update on every replica and halves the "
    "scale",
    "[cpu][optim][distribute]") {
  struct Setup {
    int replicas;
    td::CommunicationOptions communication;
    int accumulation;
    int bad_replica;
  };
  for (const Setup& setup :
       {Setup{2, kNoBuckets, 1, 1}, Setup{2, kBuckets, 1, 1}, Setup{4, kNoBuckets, 1, 3},
        Setup{4, kBuckets, 1, 2}, Setup{2, kBuckets, 3, 1}, Setup{4, kNoBuckets, 3, 0}}) {
    INFO(setup.replicas << " replicas, buckets " << (setup.communication.bytes_per_pack > 0)
                        << ", accumulation " << setup.accumulation << ", Inf on replica "
                        << setup.bad_replica);
    const int n = setup.accumulation;
    // With accumulation the Inf comes in the second micro-step of the second update.
    const int bad = n == 1 ? 2 : n + 1;
    const int steps = 3 * n + (n == 1 ? 2 : 0);
    const Run run =
        train(setup.replicas, setup.communication, n, true, steps, bad, setup.bad_replica);
    CHECK(run.replicas_identical);
    CHECK(run.finite);
    // The update the Inf fell into left every variable as it was before that update began.
    const int update_end = (bad / n + 1) * n - 1;  // the step that ends the bad update
    const int before = bad / n * n - 1;            // the step that ended the previous update
    CHECK(run.weights[update_end] == run.weights[before]);
    CHECK(run.scales[before] == 32768.0);
    CHECK(run.scales[update_end] == 16384.0);
    CHECK(run.iterations[update_end] == run.iterations[before]);  // not counted
    // Later updates apply again, at the halved scale.
    CHECK(run.weights.back() != run.weights[update_end]);
    CHECK(run.scales.back() == 16384.0);
    CHECK(run.iterations.back() == steps / n - 1);
  }
}
