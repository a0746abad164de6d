// A LossScaleOptimizer tracked by a checkpoint: its scale and counter are written to
// /training_state/loss_scale/{scale, good_steps} next to the inner optimizer's slots, and a
// restore in the middle of a run gives every replica the same scale and counter, so the rest of
// the run (a growth of the scale included) is bitwise the uninterrupted one.
#include <cmath>
#include <limits>

#include "checkpoint_test_util.h"

namespace td = tandem;
namespace optim = tandem::optim;
using namespace tandem::checkpoint_testing;

namespace {

constexpr int kReplicas = 2;
constexpr int64_t kBatch = 8;

/// A model, Adam wrapped in a LossScaleOptimizer (scale 1024, x2 after 5 finite updates) and a
/// checkpoint of them, on 2 CPU replicas.
struct ScaledRun {
  td::MirroredStrategy strategy = td::MirroredStrategy::cpu(kReplicas);
  td::nn::Sequential model{{td::nn::Dense(5, td::nn::Activation::kRelu), td::nn::Dense(3)}};
  std::unique_ptr<optim::Adam> adam;
  std::unique_ptr<optim::LossScaleOptimizer> lso;

  /// `accumulation_steps` > 1: each train_step is a micro-step.
  explicit ScaledRun(int accumulation_steps = 1) {
    auto scope = strategy.scope();
    model.set_seed(2);
    model.build({4});
    adam = std::make_unique<optim::Adam>(optim::Adam::Options{
        .learning_rate = 0.05, .gradient_accumulation_steps = accumulation_steps});
    lso = std::make_unique<optim::LossScaleOptimizer>(
        *adam, optim::LossScaleOptions{.initial_scale = 1024.0, .dynamic_growth_steps = 5});
  }

  td::Checkpoint checkpoint() {
    return td::Checkpoint({{"model", &model}, {"optimizer", lso.get()}});
  }

  /// Step `step` (its data drawn from the step number); with `overflow`, replica 1's loss is
  /// multiplied by Inf.
  void train_step(int step, bool overflow = false) {
    td::Generator generator(100 + static_cast<uint64_t>(step));
    const td::Tensor x = td::Tensor::normal({kBatch, 4}, generator);
    const td::Tensor y = td::Tensor::from_vector<int64_t>({0, 1, 2, 0, 1, 2, 0, 1});
    const int64_t half = kBatch / kReplicas;
    const std::vector<td::Variable> variables = model.trainable_variables();
    strategy.run(
        [&](td::ReplicaContext& ctx, const td::Tensor& xs, const td::Tensor& ys) {
          td::GradientTape tape;
          td::Tensor loss = td::compute_average_loss(
              td::losses::sparse_categorical_crossentropy(ys, model(xs, true), true), kBatch);
          if (overflow && ctx.replica_id_in_sync_group() == 1)
            loss = loss * std::numeric_limits<double>::infinity();
          lso->apply_gradients(ctx, tape.gradient(lso->scale_loss(loss), variables), variables);
        },
        td::PerReplica<td::Tensor>({x.slice(0, half), x.slice(half, kBatch)}),
        td::PerReplica<td::Tensor>({y.slice(0, half), y.slice(half, kBatch)}));
  }

  /// Every replica copy of every weight, slot, the scale and the counter.
  std::vector<std::vector<float>> state() const {
    std::vector<std::vector<float>> out;
    std::vector<td::Variable> all = model.weights();
    for (const auto& [name, slot] : adam->slot_variables()) all.push_back(slot);
    for (const td::Variable& v : all)
      for (int r = 0; r < v.num_copies(); ++r) out.push_back(v.copy(r).to_vector<float>());
    for (int r = 0; r < kReplicas; ++r) {
      out.push_back({static_cast<float>(lso->dynamic_scale_variable().copy(r).item<double>()),
                     static_cast<float>(lso->step_counter_variable().copy(r).item<int64_t>())});
    }
    out.push_back({static_cast<float>(adam->iterations())});
    return out;
  }
};

}  // namespace

TEST_CASE("a loss scale and its counter are saved with the optimizer and resume exactly",
          "[cpu][checkpoint]") {
  TempDir dir;
  const std::string path = dir.file("ckpt-5.h5");
  ScaledRun straight;
  // 2 finite updates, an overflow (scale 1024 -> 512, skipped), 3 finite: counter 3.
  for (int s = 0; s < 6; ++s) straight.train_step(s, /*overflow=*/s == 2);
  CHECK(straight.lso->loss_scale() == 512.0);
  CHECK(straight.lso->step_counter() == 3);
  CHECK(straight.adam->iterations() == 5);
  straight.checkpoint().write(path);
  const std::string inspected = td::inspect_checkpoint(path);
  INFO(inspected);
  CHECK(inspected.find("loss_scale") != std::string::npos);
  CHECK(inspected.find("scale 512, good_steps 3") != std::string::npos);
  CHECK(td::verify_checkpoint(path).empty());

  // The rest: the counter reaches dynamic_growth_steps - 1 and the scale doubles.
  for (int s = 6; s < 10; ++s) straight.train_step(s);
  CHECK(straight.lso->loss_scale() == 1024.0);
  CHECK(straight.lso->step_counter() == 2);

  ScaledRun resumed;
  CHECK(resumed.lso->loss_scale() == 1024.0);  // before the restore: the initial scale
  resumed.checkpoint().restore(path);
  CHECK(resumed.lso->loss_scale() == 512.0);
  CHECK(resumed.lso->step_counter() == 3);
  for (int r = 0; r < kReplicas; ++r)
    CHECK(resumed.lso->dynamic_scale_variable().copy(r).item<double>() == 512.0);
  for (int s = 6; s < 10; ++s) resumed.train_step(s);
  CHECK(resumed.state() == straight.state());  // bitwise, every replica copy
}

TEST_CASE(
    "a checkpoint written without a loss scale restores into a loss-scaled run at the "
    "initial scale",
    "[cpu][checkpoint]") {
  TempDir dir;
  const std::string path = dir.file("ckpt-1.h5");
  ScaledRun plain;
  plain.train_step(0);
  td::Checkpoint({{"model", &plain.model}, {"optimizer", plain.adam.get()}}).write(path);
  CHECK(td::inspect_checkpoint(path).find("loss_scale") == std::string::npos);
  ScaledRun resumed;
  resumed.lso->set_state(64.0, 1);
  resumed.checkpoint().restore(path);
  CHECK(resumed.adam->iterations() == 1);
  CHECK(resumed.lso->loss_scale() == 64.0);  // left as it was
}

TEST_CASE(
    "an accumulation saved mid-way after an overflowing micro-step restores and skips its "
    "update",
    "[cpu][checkpoint]") {
  // With a dynamic loss scale an accumulator may hold Inf between micro-steps: the update then
  // skips. Such a checkpoint is sound (verify passes, a restore takes it) and the resumed run
  // is bitwise the uninterrupted one.
  TempDir dir;
  const std::string path = dir.file("ckpt-3.h5");
  ScaledRun straight(/*accumulation_steps=*/2);
  for (int s = 0; s < 3; ++s) straight.train_step(s, /*overflow=*/s == 2);
  REQUIRE(straight.adam->micro_step() == 1);
  bool non_finite = false;
  for (const auto& [name, accumulator] : straight.adam->accumulator_variables())
    for (int r = 0; r < accumulator.num_copies(); ++r)
      for (float value : accumulator.copy(r).to_vector<float>())
        non_finite = non_finite || !std::isfinite(value);
  REQUIRE(non_finite);
  straight.checkpoint().write(path);
  CHECK(td::verify_checkpoint(path).empty());

  ScaledRun resumed(/*accumulation_steps=*/2);
  resumed.checkpoint().restore(path);
  for (int s = 3; s < 6; ++s) {
    straight.train_step(s);
    resumed.train_step(s);
  }
  CHECK(straight.lso->loss_scale() == 512.0);  // the overflowing update was skipped
  CHECK(resumed.state() == straight.state());
}
