// [cuda] tests of checkpoints of GPU-resident state: an asynchronous save() of a model and Adam
// trained on 2 logical GPU replicas holds the step at save() although training goes on at once,
// and the file restores bit for bit onto GPU replicas and onto the CPU. Without a GPU each test
// WARNs why it was skipped and passes.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "support/compare.h"
#include "support/require_gpu.h"
#include "tandem/tandem.h"

namespace {

using namespace tandem;
namespace fs = std::filesystem;

/// A model, Adam and a step counter built under `strategy`, with one checkpoint of all three.
struct Job {
  explicit Job(Strategy& strategy) {
    auto scope = strategy.scope();
    model.set_seed(11);
    model.build({8});
    optimizer = std::make_unique<optim::Adam>(optim::Adam::Options{.learning_rate = 0.01});
    optimizer->build(model.trainable_variables());
  }
  Checkpoint checkpoint() {
    return Checkpoint({{"model", &model}, {"optimizer", optimizer.get()}, {"step", &step}});
  }
  /// The model's weights and Adam's slots, replica 0's copy, on the host.
  std::vector<std::vector<float>> state() const {
    std::vector<std::vector<float>> out;
    for (const Variable& v : model.weights()) out.push_back(v.copy(0).to_vector<float>());
    for (const auto& [name, v] : optimizer->slot_variables())
      out.push_back(v.copy(0).to_vector<float>());
    return out;
  }
  nn::Sequential model{nn::Dense(32, nn::Activation::kRelu), nn::Dense(4)};
  std::unique_ptr<optim::Adam> optimizer;
  int64_t step = 0;
};

/// `steps` Adam steps of `job` on global batches of 64 under `strategy`.
void train(Strategy& strategy, Job& job, int steps, uint64_t seed) {
  Generator g(seed);
  const int64_t batch = 64;
  const Tensor features = Tensor::normal({steps * batch, 8}, g);
  std::vector<int64_t> labels(static_cast<size_t>(steps * batch));
  for (size_t i = 0; i < labels.size(); ++i) labels[i] = static_cast<int64_t>(i % 4);
  auto data = strategy.distribute_dataset(
      data::from_tensor_slices({features, Tensor::from_vector(labels)}).batch(batch));
  const std::vector<Variable> variables = job.model.trainable_variables();
  for (const auto& b : data) {
    strategy.run(
        [&](ReplicaContext& ctx, const data::Batch& replica_batch) {
          GradientTape tape;
          const Tensor loss = compute_average_loss(
              losses::sparse_categorical_crossentropy(
                  replica_batch.labels(), job.model(replica_batch.features(), true), true),
              batch);
          job.optimizer->apply_gradients(ctx, tape.gradient(loss, variables), variables);
          return loss;
        },
        b);
    ++job.step;
  }
}

}  // namespace

TEST_CASE("asynchronous save of GPU replicas: the step at save() restores on GPU and CPU",
          "[cuda][checkpoint]") {
  TANDEM_REQUIRE_GPU();
  const fs::path dir =
      fs::temp_directory_path() / ("tandem-cuda-ckpt-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  MirroredStrategy gpus({Device::cuda(0), Device::cuda(0)});
  Job job(gpus);
  train(gpus, job, 3, 1);
  const std::vector<std::vector<float>> saved = job.state();
  {
    CheckpointManager manager(job.checkpoint(), dir.string(), {.async_save = true});
    REQUIRE(manager.save().has_value());
    train(gpus, job, 3, 2);  // the weights change while the file is written
    manager.wait();
  }
  REQUIRE(job.state() != saved);
  const std::string path = (dir / "ckpt-3.h5").string();
  REQUIRE(fs::exists(path));

  SECTION("onto 2 logical GPU replicas") {
    MirroredStrategy other({Device::cuda(0), Device::cuda(0)});
    Job restored(other);
    CheckpointManager(restored.checkpoint(), dir.string()).restore(path);
    CHECK(restored.step == 3);
    CHECK(restored.optimizer->iterations() == 3);
    CHECK(restored.state() == saved);
    for (const Variable& v : restored.model.weights())
      CHECK(v.copy(1).to_vector<float>() == v.copy(0).to_vector<float>());
    // Training resumes where the saved job was: 3 more steps give the first job's weights.
    train(other, restored, 3, 2);
    const auto resumed = restored.state(), original = job.state();
    REQUIRE(resumed.size() == original.size());
    for (size_t i = 0; i < resumed.size(); ++i)
      CHECK(tandem::testing::relative_difference(resumed[i], original[i]) <= 1e-6);
  }
  SECTION("onto the CPU") {
    MirroredStrategy cpu({Device::cpu()});
    Job restored(cpu);
    CheckpointManager(restored.checkpoint(), dir.string()).restore(path);
    CHECK(restored.step == 3);
    CHECK(restored.state() == saved);
  }
  fs::remove_all(dir);
}
