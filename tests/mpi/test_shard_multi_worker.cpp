// [mpi] Optimizer-state sharding across workers (shard_optimizer_state 1 and 2 under mpirun and
// TF_CONFIG workers): the layout spans every worker's replicas, each worker holds only its own
// replicas' slots, training is bitwise that of every replica holding everything, and
// CheckpointManager gathers the slots to the chief into the unsharded file, which restores at
// every stage.
#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "mpi/job.h"
#include "support/hdf5_datasets.h"
#include "tandem/tandem.h"

namespace td = tandem;
namespace optim = td::optim;
namespace nn = td::nn;

namespace {

using Access = td::detail::StrategyAccess;
using td::testing::datasets_of;

constexpr int64_t kGlobalBatch = 48;  // divides among 2, 4 and 8 replicas in sync
constexpr int64_t kSteps = 9;         // of fixed data; a job trains a range of them

struct Setup {
  bool sync_batch_norm = false;
  int accumulation = 1;
  bool clip = false;
  bool loss_scale = false;
  int stage = 0;
  bool buckets = false;  // gradient buckets of 512 bytes reduced during the backward pass
  bool build = true;  // optimizer.build() before training (else the first update makes the slots)
  bool wide = false;  // layers of 300: the 300 x 300 kernel's state is split between replicas
};

/// The fixed data: kSteps global batches of 8 features and 4 classes.
struct Data {
  td::Tensor x, y;
  Data() {
    td::Generator g(31);
    x = td::Tensor::normal({kSteps * kGlobalBatch, 8}, g);
    std::vector<int64_t> labels(static_cast<size_t>(kSteps * kGlobalBatch));
    const float* f = x.data<float>();
    for (size_t i = 0; i < labels.size(); ++i) {
      const float score = f[i * 8] + 0.5f * f[i * 8 + 1] - f[i * 8 + 2];
      labels[i] = score < -0.7f ? 0 : score < 0.0f ? 1 : score < 0.7f ? 2 : 3;
    }
    y = td::Tensor::from_vector(labels);
  }
};

/// One training job on the job's strategy: an MLP (or one with synchronized batch norm), Adam
/// with the setup's options, optionally inside a loss scale.
struct Job {
  explicit Job(const Setup& s) : setup(s), strategy(td::testing::job_strategy()) {
    saved = strategy.communication_options();
    // The strategy keeps the bucket layout of the model it trained last until its options
    // change: off, then this job's.
    strategy.set_communication_options({.bytes_per_pack = 0, .first_bytes_per_pack = 0});
    strategy.set_communication_options(
        {.bytes_per_pack = s.buckets ? 512 : 0, .first_bytes_per_pack = s.buckets ? 256 : 0});
    auto scope = strategy.scope();
    const int64_t first = s.wide ? 300 : 16, second = s.wide ? 300 : 12;
    model =
        s.sync_batch_norm
            ? std::make_unique<nn::Sequential>(std::initializer_list<nn::Module>{
                  nn::Dense(first, nn::Activation::kNone, /*use_bias=*/false),
                  nn::BatchNormalization({.synchronized = true}), nn::Dense(second), nn::Dense(4)})
            : std::make_unique<nn::Sequential>(std::initializer_list<nn::Module>{
                  nn::Dense(first, nn::Activation::kRelu), nn::Dense(second, nn::Activation::kRelu),
                  nn::Dense(4)});
    model->set_seed(7);
    model->build({8});
    inner = std::make_unique<optim::Adam>(
        optim::Adam::Options{.learning_rate = 0.01,
                             .global_clipnorm = s.clip ? std::optional<double>(0.05) : std::nullopt,
                             .gradient_accumulation_steps = s.accumulation,
                             .shard_optimizer_state = s.stage});
    if (s.loss_scale)
      loss_scale = std::make_unique<optim::LossScaleOptimizer>(
          *inner, optim::LossScaleOptions{.initial_scale = 1024.0, .dynamic_growth_steps = 3});
    if (s.build) inner->build(model->trainable_variables());
  }

  ~Job() { strategy.set_communication_options(saved); }
  Job(const Job&) = delete;
  Job& operator=(const Job&) = delete;

  optim::Optimizer& optimizer() { return loss_scale ? *loss_scale : *inner; }

  td::Checkpoint checkpoint() {
    return td::Checkpoint({{"model", model.get()}, {"optimizer", &optimizer()}});
  }

  /// Steps [first, first + count) of the fixed data, each global batch split among every
  /// worker's replicas. On step `overflow` (if any) replica 1's gradient of the last variable
  /// is infinite: a loss scale skips that update on every replica.
  void train(int64_t first, int64_t count, int64_t overflow = -1) {
    static const Data all;
    const td::Tensor x = all.x.slice(first * kGlobalBatch, (first + count) * kGlobalBatch);
    const td::Tensor y = all.y.slice(first * kGlobalBatch, (first + count) * kGlobalBatch);
    auto data =
        strategy.distribute_dataset(td::data::from_tensor_slices({x, y}).batch(kGlobalBatch),
                                    {.auto_shard_policy = td::data::AutoShardPolicy::kData});
    const std::vector<td::Variable> variables = model->trainable_variables();
    int64_t current = first;
    int64_t first_bucketed = -1;
    auto step = [&](td::ReplicaContext& ctx, const td::data::Batch& b) {
      td::GradientTape tape;
      td::Tensor loss = td::compute_average_loss(
          td::losses::sparse_categorical_crossentropy(b.labels(), (*model)(b.features(), true),
                                                      /*from_logits=*/true),
          kGlobalBatch);
      const bool overflows = current == overflow && ctx.replica_id_in_sync_group() == 1;
      // With buckets the gradients must be the tape's own (the buckets packed them): the
      // overflow then comes from the loss.
      if (overflows && setup.buckets)
        loss = loss * td::Tensor::scalar(INFINITY, td::DType::kFloat32);
      std::vector<td::Tensor> grads = tape.gradient(optimizer().scale_loss(loss), variables);
      if (overflows && !setup.buckets)
        grads.back() = grads.back() * td::Tensor::scalar(INFINITY, td::DType::kFloat32);
      optimizer().apply_gradients(ctx, grads, variables);
      if (ctx.local_replica_id() == 0) {
        reduces_to_owners = static_cast<optim::GradientSync&>(ctx).reduces_to_owners();
        transport = ctx.communicator().name();
        // The strategy's counter runs over its life: count from this loop's first step.
        if (first_bucketed < 0) first_bucketed = static_cast<int64_t>(ctx.bucketed_steps());
        bucketed_steps = ctx.bucketed_steps() - static_cast<uint64_t>(first_bucketed);
      }
      return loss;
    };
    int64_t ran = 0;
    for (const auto& b : data) {
      strategy.run(step, b);
      ++current;
      ++ran;
    }
    REQUIRE(ran == count);
  }

  /// This worker's view, as bytes by name: the model's variables (every local copy, which
  /// must agree), the slot parts it holds ("m/dense/kernel@0": from element 0), the counter and
  /// the loss scale. With `cut_like`, this job holds every slot and cuts each into the parts
  /// that job holds (to compare with it).
  std::map<std::string, std::string> state(const Job* cut_like = nullptr) const {
    std::map<std::string, std::string> out;
    auto bytes = [](const td::Tensor& t) {
      return std::string(static_cast<const char*>(t.raw_data()), t.nbytes());
    };
    for (const td::Variable& v : model->weights()) {
      out[v.name()] = bytes(v.copy(0));
      for (int r = 1; r < v.num_copies(); ++r) CHECK(bytes(v.copy(r)) == out[v.name()]);
    }
    const auto key = [](const optim::Optimizer::SlotPlacement& p) {
      return p.name + "@" + std::to_string(p.begin);
    };
    if (cut_like == nullptr) {
      for (const optim::Optimizer::SlotPlacement& p : inner->slot_placements())
        if (p.slot.defined()) out[key(p)] = bytes(p.slot.copy(0));
    } else {
      std::map<std::string, td::Variable> whole;
      for (const auto& [name, slot] : inner->slot_variables()) whole[name] = slot;
      for (const optim::Optimizer::SlotPlacement& p : cut_like->inner->slot_placements()) {
        if (!p.slot.defined()) continue;
        const td::Tensor& value = whole.at(p.name).copy(0);
        out[key(p)] = bytes(value.view_as(td::Shape{p.end - p.begin}, p.begin * sizeof(float)));
      }
    }
    out["iterations"] = std::to_string(inner->iterations());
    if (loss_scale) out["loss_scale"] = std::to_string(loss_scale->loss_scale());
    return out;
  }

  /// Slot elements this worker holds.
  int64_t held_slots() const {
    int64_t held = 0;
    for (const optim::Optimizer::SlotPlacement& p : inner->slot_placements())
      held += p.slot.defined() ? p.end - p.begin : 0;
    return held;
  }

  Setup setup;
  td::Strategy& strategy;
  td::CommunicationOptions saved;  // the strategy's, given back at the end
  uint64_t bucketed_steps = 0;     // local replica 0's steps after the first, in buckets
  bool reduces_to_owners = true;   // whether the job's transport reduce-scatters for real
  std::string transport;           // its communicator's name
  std::unique_ptr<nn::Sequential> model;
  std::unique_ptr<optim::Optimizer> inner;
  std::unique_ptr<optim::LossScaleOptimizer> loss_scale;
};

/// Entries of `sharded` that are missing from `whole` or differ from it.
std::vector<std::string> differences(const std::map<std::string, std::string>& whole,
                                     const std::map<std::string, std::string>& sharded) {
  std::vector<std::string> out;
  for (const auto& [name, value] : sharded) {
    const auto it = whole.find(name);
    if (it == whole.end() || it->second != value) out.push_back(name);
  }
  return out;
}

/// The sum over every worker of `value`.
int64_t sum_over_workers(td::Strategy& s, int64_t value) {
  return static_cast<int64_t>(
      Access::reduce_across_workers(s, td::ReduceOp::kSum,
                                    td::Tensor::scalar(static_cast<double>(value)))
          .item<double>());
}

}  // namespace

TEST_CASE(
    "multi-worker: optimizer-state sharding over every worker's replicas trains with the "
    "unsharded bits (stages 1 and 2, batch norm, accumulation, clipping, a loss scale)",
    "[mpi]") {
  td::Strategy& s = td::testing::job_strategy();
  const int in_sync = s.num_replicas_in_sync();
  struct Case {
    const char* name;
    Setup setup;
    int64_t overflow = -1;
  };
  const std::vector<Case> cases = {
      {"plain", {}},
      {"synchronized batch norm", {.sync_batch_norm = true}},
      {"accumulation of 2 and clipping", {.accumulation = 2, .clip = true}},
      {"loss scale (an overflow at step 2) and clipping", {.clip = true, .loss_scale = true}, 2},
      {"gradient buckets and a loss scale", {.loss_scale = true, .buckets = true}, 3},
      {"wide layers (a kernel's state split between replicas), clipping, a loss scale",
       {.clip = true, .loss_scale = true, .wide = true},
       4},
  };
  for (const Case& c : cases) {
    Job whole(c.setup);
    whole.train(0, 6, c.overflow);
    for (int stage : {1, 2}) {
      INFO(c.name << ", shard_optimizer_state " << stage << ", " << s.num_workers() << " workers x "
                  << s.num_local_replicas() << " replicas");
      Setup setup = c.setup;
      setup.stage = stage;
      Job sharded(setup);
      sharded.train(0, 6, c.overflow);
      CHECK(differences(whole.state(&sharded), sharded.state()).empty());
      // The unsharded job's buckets were used (the first step lays them out); sharded, the
      // gradients are reduce-scattered after the backward pass instead, or where the transport
      // would reduce-scatter by its whole all-reduce (Gloo, Open MPI beyond two workers),
      // summed as unsharded, buckets included.
      CHECK(whole.bucketed_steps == (setup.buckets ? 5u : 0u));
      CHECK(sharded.bucketed_steps == (sharded.reduces_to_owners ? 0u : whole.bucketed_steps));
      // Shared memory and Open MPI of two workers reduce-scatter for real; Gloo and Open MPI
      // beyond two workers do not.
      CHECK(sharded.reduces_to_owners ==
            (sharded.transport.starts_with("shm") ||
             (sharded.transport.starts_with("mpi") && s.num_workers() <= 2)));
      CHECK(sharded.state().contains("iterations"));
      // Each slot is held by exactly one worker, and a worker holds only its replicas' slots.
      const int64_t total = whole.held_slots();
      CHECK(sum_over_workers(s, sharded.held_slots()) == total);
      for (const optim::Optimizer::SlotPlacement& p : sharded.inner->slot_placements()) {
        INFO(p.name << " owned by replica " << p.owner);
        REQUIRE(p.owner >= 0);
        REQUIRE(p.owner < in_sync);
        CHECK(p.slot.defined() == (p.owner / s.num_local_replicas() == s.worker_index()));
      }
      if (c.overflow >= 0) CHECK(sharded.state().at("iterations") == "5");  // one skipped
      if (setup.accumulation > 1) continue;  // accumulators are whole on every replica
      // What the profiler reports: the job's replicas together hold the slots once.
      int64_t state_here = 0, whole_state = 0;
      for (int r = 0; r < s.num_local_replicas(); ++r) {
        const int global = s.worker_index() * s.num_local_replicas() + r;
        state_here += sharded.inner->memory_of(global).optimizer_state;
        whole_state = whole.inner->memory_of(global).optimizer_state;
      }
      CHECK(whole_state > 0);
      CHECK(sum_over_workers(s, state_here) == whole_state);
    }
  }
}

TEST_CASE(
    "multi-worker: a stage-2 checkpoint gathered to the chief is the unsharded one's bits and "
    "resumes at every stage as the unsharded job does",
    "[mpi]") {
  td::Strategy& s = td::testing::job_strategy();
  const std::string dir = td::testing::shared_temp_dir(s, "shard");
  const std::string whole_dir = dir + "/whole", sharded_dir = dir + "/sharded";
  const Setup base = {.sync_batch_norm = true, .clip = true, .loss_scale = true, .wide = true};
  Job whole(base);
  whole.train(0, 5, /*overflow=*/1);
  {
    td::CheckpointManager manager(whole.checkpoint(), whole_dir, {.strategy = &s});
    REQUIRE(manager.save(5).has_value());
  }
  Setup stage2 = base;
  stage2.stage = 2;
  stage2.build = false;  // the replicas' first update makes the slots, in the variables' order
  {
    Job sharded(stage2);
    sharded.train(0, 5, /*overflow=*/1);
    td::CheckpointManager manager(sharded.checkpoint(), sharded_dir, {.strategy = &s});
    REQUIRE(manager.save(5).has_value());
  }
  if (s.is_chief()) {
    const auto a = datasets_of(whole_dir + "/ckpt-5.h5");
    const auto b = datasets_of(sharded_dir + "/ckpt-5.h5");
    CHECK(a.contains("/optimizer_weights/m/dense/kernel:0"));
    CHECK(a.size() > 15);
    REQUIRE(a.size() == b.size());
    for (const auto& [name, bytes] : a) {
      INFO(name);
      REQUIRE(b.contains(name));
      CHECK(b.at(name) == bytes);
    }
  }
  // The unsharded job goes on; every stage restored from the sharded file follows it bitwise.
  whole.train(5, 4);
  for (int stage : {0, 1, 2}) {
    INFO("restored at shard_optimizer_state " << stage);
    Setup setup = base;
    setup.stage = stage;
    Job resumed(setup);
    td::CheckpointManager manager(resumed.checkpoint(), sharded_dir, {.strategy = &s});
    REQUIRE(manager.restore_or_initialize().has_value());
    resumed.train(5, 4);
    CHECK(differences(whole.state(&resumed), resumed.state()).empty());
  }
  // A checkpoint written without the workers gathering (Checkpoint::write) cannot hold the
  // slots another worker keeps: it says so instead of writing a partial file.
  if (s.num_workers() > 1) {
    Job sharded(stage2);
    sharded.train(0, 1);
    // An update outside strategy.run cannot reach the owners on other workers: every worker
    // refuses, whichever variables it owns.
    const std::vector<td::Variable> variables = sharded.model->trainable_variables();
    std::vector<td::Tensor> zeros;
    for (const td::Variable& v : variables) zeros.push_back(td::Tensor::zeros_like(v.copy(0)));
    CHECK_THROWS_WITH(
        sharded.inner->apply_gradients(zeros, variables),
        Catch::Contains("other workers hold") && Catch::Contains("inside strategy.run"));
    if (s.worker_index() == 0 && sharded.held_slots() < whole.held_slots()) {
      // The first slot not wholly here is named, a split one too (never written with zeros
      // where another worker's part belongs).
      std::map<std::string, bool> complete;
      for (const optim::Optimizer::SlotPlacement& p : sharded.inner->slot_placements())
        complete[p.name] = complete.emplace(p.name, true).first->second && p.slot.defined();
      std::string first;
      for (const auto& [name, slot] : sharded.inner->slot_variables())
        if (first.empty() && !complete.at(name)) first = name;
      INFO("the first slot not wholly on the chief: " << first);
      CHECK_THROWS_WITH(sharded.checkpoint().write(dir + "/partial.h5"),
                        Catch::Contains("\"" + first + "\" is held by another worker") &&
                            Catch::Contains("CheckpointManager"));
    }
  }
  Access::reduce_across_workers(s, td::ReduceOp::kSum, td::Tensor::scalar(1.0));
  if (s.is_chief()) std::filesystem::remove_all(dir);
}
