// Optimizer-state sharding (shard_optimizer_state 1 and 2): each replica holds and updates only
// its own variables' slots (and at stage 2 receives only their summed gradients), and training
// is bitwise the training of every replica holding everything, with accumulation, a loss scale
// and clipping; checkpoints keep whole variables and restore at any replica count and stage.
#include <omp.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "checkpoint/checkpoint_test_util.h"
#include "tandem/tandem.h"

namespace td = tandem;
namespace optim = td::optim;
namespace nn = td::nn;

namespace {

constexpr int64_t kGlobalBatch = 24;  // 12, 8 or 6 per replica on 2, 3 or 4 replicas
constexpr int64_t kSide = 6;          // images of kSide x kSide x 1 for the CNN
constexpr int64_t kClasses = 4;

// kWide's 300 x 300 kernel is two blocks of the parameter layout (ParameterLayout::kBlock
// elements each): sharded, its state is split between two replicas.
enum class ModelKind { kMlp, kWide, kCnn };

struct Setup {
  ModelKind model = ModelKind::kMlp;
  int replicas = 2;
  int stage = 0;
  int accumulation = 1;
  bool clip = false;
  bool loss_scale = false;
  bool adamw = false;
  bool buckets = false;  // gradient buckets reduced during the backward pass (512-byte buckets)
  td::GradientCompression compression = td::GradientCompression::kNone;
};

/// One training job: a model, Adam (or AdamW) with the setup's options, optionally wrapped in
/// a loss scale, on `replicas` CPU replicas.
struct Job {
  explicit Job(const Setup& s) : setup(s), strategy(td::MirroredStrategy::cpu(s.replicas)) {
    strategy.set_communication_options({.bytes_per_pack = s.buckets ? 512 : 0,
                                        .first_bytes_per_pack = 256,
                                        .gradient_compression = s.compression});
    auto scope = strategy.scope();
    if (s.model == ModelKind::kMlp) {
      model = std::make_unique<nn::Sequential>(std::initializer_list<nn::Module>{
          nn::Dense(16, nn::Activation::kRelu), nn::Dense(12, nn::Activation::kRelu),
          nn::Dense(kClasses)});
      model->set_seed(7);
      model->build({8});
    } else if (s.model == ModelKind::kWide) {
      model = std::make_unique<nn::Sequential>(std::initializer_list<nn::Module>{
          nn::Dense(300, nn::Activation::kRelu), nn::Dense(300, nn::Activation::kRelu),
          nn::Dense(kClasses)});
      model->set_seed(7);
      model->build({8});
    } else {
      model = std::make_unique<nn::Sequential>(std::initializer_list<nn::Module>{
          nn::Conv2D(4, 3, 1, nn::Padding::kSame, nn::Activation::kNone, /*use_bias=*/false),
          nn::BatchNormalization({.synchronized = true}),
          nn::ActivationLayer(nn::Activation::kRelu), nn::Flatten(), nn::Dense(kClasses)});
      model->set_seed(7);
      model->build({kSide, kSide, 1});
    }
    const std::optional<double> clip = s.clip ? std::optional<double>(0.05) : std::nullopt;
    if (s.adamw) {
      inner = std::make_unique<optim::AdamW>(
          optim::AdamW::Options{.learning_rate = 0.01,
                                .weight_decay = 0.1,
                                .global_clipnorm = clip,
                                .gradient_accumulation_steps = s.accumulation,
                                .shard_optimizer_state = s.stage});
      inner->exclude_from_weight_decay({}, {"bias"});
    } else {
      inner = std::make_unique<optim::Adam>(
          optim::Adam::Options{.learning_rate = 0.01,
                               .global_clipnorm = clip,
                               .gradient_accumulation_steps = s.accumulation,
                               .shard_optimizer_state = s.stage});
    }
    if (s.loss_scale)
      loss_scale = std::make_unique<optim::LossScaleOptimizer>(
          *inner, optim::LossScaleOptions{.initial_scale = 1024.0, .dynamic_growth_steps = 3});
    inner->build(model->trainable_variables());
  }

  optim::Optimizer& optimizer() { return loss_scale ? *loss_scale : *inner; }

  td::Checkpoint checkpoint() {
    return td::Checkpoint({{"model", model.get()}, {"optimizer", &optimizer()}});
  }

  /// Steps [first, first + count) of the fixed data, each of kGlobalBatch examples split over
  /// the replicas. On step `overflow` (if any) replica 1's gradient of the last variable is
  /// infinite: a loss scale skips that update.
  void train(int64_t first, int64_t count, int64_t overflow = -1) {
    const std::vector<td::Variable> variables = model->trainable_variables();
    const int64_t per_replica = kGlobalBatch / setup.replicas;
    int64_t current = 0;
    auto step = [&](td::ReplicaContext& ctx, const td::Tensor& x, const td::Tensor& y) {
      td::GradientTape tape;
      const td::Tensor logits = (*model)(x, /*training=*/true);
      td::Tensor loss = td::compute_average_loss(
          td::losses::sparse_categorical_crossentropy(y, logits, /*from_logits=*/true),
          kGlobalBatch);
      const bool overflows = current == overflow && ctx.replica_id_in_sync_group() == 1;
      // With buckets the gradients must be the tape's own (the buckets packed them): the
      // overflow comes from the loss and reaches every variable.
      if (overflows && setup.buckets)
        loss = loss * td::Tensor::scalar(INFINITY, td::DType::kFloat32);
      std::vector<td::Tensor> grads = tape.gradient(optimizer().scale_loss(loss), variables);
      // Otherwise it reaches one variable only (the last, owned by the last replica when
      // sharded): every replica must still skip the update.
      if (overflows && !setup.buckets)
        grads.back() = grads.back() * td::Tensor::scalar(INFINITY, td::DType::kFloat32);
      optimizer().apply_gradients(ctx, grads, variables);
      if (ctx.replica_id_in_sync_group() == 0) {
        reduce_scatters = ctx.communicator().stats().reduce_scatter;
        bucketed_steps = ctx.bucketed_steps();
      }
      return loss;
    };
    for (int64_t s = first; s < first + count; ++s) {
      current = s;
      const Data batch = data(s);
      std::vector<td::Tensor> xs, ys;
      for (int r = 0; r < setup.replicas; ++r) {
        xs.push_back(batch.x.slice(r * per_replica, (r + 1) * per_replica));
        ys.push_back(batch.y.slice(r * per_replica, (r + 1) * per_replica));
      }
      strategy.run(step, td::PerReplica<td::Tensor>(xs), td::PerReplica<td::Tensor>(ys));
    }
  }

  struct Data {
    td::Tensor x, y;
  };
  Data data(int64_t step) const {
    td::Generator g(static_cast<uint64_t>(1000 + step));
    const td::Shape shape = setup.model == ModelKind::kCnn
                                ? td::Shape({kGlobalBatch, kSide, kSide, 1})
                                : td::Shape({kGlobalBatch, 8});
    const td::Tensor x = td::Tensor::normal(shape, g);
    std::vector<int64_t> labels(static_cast<size_t>(kGlobalBatch));
    const float* f = x.data<float>();
    const int64_t row = x.numel() / kGlobalBatch;
    for (size_t i = 0; i < labels.size(); ++i) {
      const float score = f[i * row] + 0.5f * f[i * row + 1] - f[i * row + 2];
      labels[i] = score < -0.7f ? 0 : score < 0.0f ? 1 : score < 0.7f ? 2 : 3;
    }
    return {x, td::Tensor::from_vector(labels)};
  }

  /// The model's variables (every replica's copy, which must agree) and the optimizer's slots
  /// and counter, as bytes by name.
  std::map<std::string, std::string> state() const {
    std::map<std::string, std::string> out;
    auto bytes = [](const td::Tensor& t) {
      const td::Tensor host = t.to(td::Device::cpu());
      return std::string(static_cast<const char*>(host.raw_data()), host.nbytes());
    };
    for (const td::Variable& v : model->weights()) {
      out[v.name()] = bytes(v.copy(0));
      for (int r = 1; r < v.num_copies(); ++r)
        CHECK(bytes(v.copy(r)) == out[v.name()]);  // the replicas agree
    }
    // Each slot whole: a slot split among replicas assembled from its parts.
    std::map<std::string, td::Tensor> slots;
    for (const optim::Optimizer::SlotPlacement& p : inner->slot_placements()) {
      REQUIRE(p.slot.defined());
      auto it = slots.find(p.name);
      if (it == slots.end())
        it = slots.emplace(p.name, td::Tensor::zeros(p.variable.copy(0).shape())).first;
      const td::Tensor part = p.slot.copy(0).to(td::Device::cpu());
      std::memcpy(static_cast<char*>(it->second.raw_data()) + p.begin * sizeof(float),
                  part.raw_data(), part.nbytes());
    }
    for (const auto& [name, slot] : slots) out[name] = bytes(slot);
    out["iterations"] = std::to_string(inner->iterations());
    if (loss_scale) out["loss_scale"] = std::to_string(loss_scale->loss_scale());
    return out;
  }

  Setup setup;
  td::MirroredStrategy strategy;
  uint64_t reduce_scatters = 0;  // replica 0's reduce_scatter calls after the last step
  uint64_t bucketed_steps = 0;   // replica 0's steps whose gradients came from the buckets
  std::unique_ptr<nn::Sequential> model;
  std::unique_ptr<optim::Optimizer> inner;
  std::unique_ptr<optim::LossScaleOptimizer> loss_scale;
};

/// Names of the entries of `a` and `b` that differ (empty: bitwise equal).
std::vector<std::string> differences(const std::map<std::string, std::string>& a,
                                     const std::map<std::string, std::string>& b) {
  std::vector<std::string> out;
  for (const auto& [name, value] : a) {
    const auto it = b.find(name);
    if (it == b.end() || it->second != value) out.push_back(name);
  }
  for (const auto& [name, value] : b)
    if (!a.contains(name)) out.push_back(name);
  return out;
}

}  // namespace

TEST_CASE("ParameterLayout: contiguous ranges of about equal bytes, cut on block boundaries",
          "[cpu][optim]") {
  using Part = optim::ParameterLayout::Part;
  const auto owners = [](const optim::ParameterLayout& layout) {
    std::vector<int> out;
    for (size_t i = 0; i < layout.num_variables(); ++i) {
      REQUIRE(layout.parts(i).size() == 1);
      out.push_back(layout.parts(i).front().owner);
    }
    return out;
  };
  // Blocks of 100 elements of 1 byte: cut 1 wants byte 430 (440, the third variable's start,
  // is nearer than 400); cut 2 wants 860, as near 840 as 880: the lower one.
  const std::vector<int64_t> ones(6, 1);
  const optim::ParameterLayout layout({400, 40, 400, 40, 10, 400}, ones, 3, /*block=*/100);
  CHECK(layout.total_bytes() == 1290);
  CHECK(owners(layout) == std::vector<int>{0, 0, 1, 2, 2, 2});
  CHECK(layout.cut(1) == 440);
  CHECK(layout.cut(2) == 840);
  CHECK(layout.bytes_owned(0) + layout.bytes_owned(1) + layout.bytes_owned(2) == 1290);
  // A variable larger than a block is split on its blocks' boundaries: 1,000 float32 elements
  // in blocks of 100, halved at element 500.
  const optim::ParameterLayout halves({1000}, {4}, 2, /*block=*/100);
  CHECK(halves.parts(0) == std::vector<Part>{{.owner = 0, .begin = 0, .end = 500},
                                             {.owner = 1, .begin = 500, .end = 1000}});
  // 250 + 10 elements among 3: cuts at elements 100 and 200 of the first.
  const optim::ParameterLayout thirds({250, 10}, {4, 4}, 3, /*block=*/100);
  CHECK(thirds.parts(0) == std::vector<Part>{{.owner = 0, .begin = 0, .end = 100},
                                             {.owner = 1, .begin = 100, .end = 200},
                                             {.owner = 2, .begin = 200, .end = 250}});
  CHECK(thirds.parts(1) == std::vector<Part>{{.owner = 2, .begin = 0, .end = 10}});
  // A variable of at most a block is never split; more replicas than variables leave some
  // with nothing; one replica owns everything.
  const optim::ParameterLayout sparse({100, 100}, {1, 1}, 4);
  CHECK(owners(sparse) == std::vector<int>{1, 3});
  CHECK(sparse.bytes_owned(0) == 0);
  CHECK(sparse.bytes_owned(2) == 0);
  const optim::ParameterLayout one({5, 7}, {4, 4}, 1);
  CHECK(owners(one) == std::vector<int>{0, 0});
  // A variable of no elements has one empty part, of the replica whose range holds its start.
  const optim::ParameterLayout empty({0, 10}, {4, 4}, 2);
  CHECK(empty.parts(0) == std::vector<Part>{{.owner = 1, .begin = 0, .end = 0}});
  CHECK_THROWS_WITH(optim::ParameterLayout({1}, {4}, 0),
                    Catch::Contains("replicas must be >= 1, got 0"));
  CHECK_THROWS_WITH(optim::ParameterLayout({1}, {0}, 2),
                    Catch::Contains("variable 0 has elements of 0 bytes"));
}

TEST_CASE("shard_optimizer_state = 1: each replica holds its own variables' slots, one copy each",
          "[cpu][optim][distribute]") {
  Job job({.replicas = 4, .stage = 1});
  const std::vector<td::Variable> variables = job.model->trainable_variables();
  int64_t slot_bytes = 0;
  int64_t variable_bytes = 0;
  std::vector<int> owners;
  for (const td::Variable& v : variables) {
    const int owner = job.inner->owner_of(v);
    REQUIRE(owner >= 0);
    owners.push_back(owner);
    variable_bytes += static_cast<int64_t>(v.copy(0).nbytes());
    for (const std::string& kind : job.inner->slot_names()) {
      const td::Variable slot = job.inner->slot(v, kind);
      CHECK(slot.num_copies() == 1);  // held by its owner alone
      slot_bytes += static_cast<int64_t>(slot.copy(0).nbytes());
    }
  }
  // Two slots (m, v) per variable, each held once: half of what four replicas held in total.
  CHECK(slot_bytes == 2 * variable_bytes);
  // Owners are contiguous and every replica of the MLP (6 variables) owns some.
  CHECK(std::is_sorted(owners.begin(), owners.end()));
  CHECK(owners.front() == 0);
  CHECK(owners.back() == 3);
  // Both stages reduce-scatter the gradients to their owners: replicas of one process, each
  // variable's gradient to its owner (no packing), every step.
  const uint64_t per_step = variables.size();
  job.train(0, 2);
  CHECK(job.reduce_scatters == 2 * per_step);
  Job stage2({.replicas = 4, .stage = 2});
  stage2.train(0, 1);
  CHECK(stage2.reduce_scatters == per_step);
  CHECK_THROWS_WITH(optim::Adam(optim::Adam::Options{.shard_optimizer_state = 3}),
                    Catch::Contains("shard_optimizer_state must be 0") && Catch::Contains("got 3"));
}

TEST_CASE("shard_optimizer_state 1 and 2 train bitwise like every replica holding everything",
          "[cpu][optim][distribute]") {
  struct Case {
    const char* name;
    Setup setup;
  };
  const std::vector<Case> cases = {
      {"mlp, 2 replicas", {.replicas = 2}},
      {"mlp, 4 replicas, clipping", {.replicas = 4, .clip = true}},
      {"mlp, 3 replicas, AdamW, accumulation 2", {.replicas = 3, .accumulation = 2, .adamw = true}},
      {"mlp, 4 replicas, loss scale", {.replicas = 4, .loss_scale = true}},
      {"cnn with synchronized batch norm, 2 replicas, clipping, accumulation 3, loss scale",
       {.model = ModelKind::kCnn,
        .replicas = 2,
        .accumulation = 3,
        .clip = true,
        .loss_scale = true}},
      {"cnn with synchronized batch norm, 4 replicas", {.model = ModelKind::kCnn, .replicas = 4}},
      {"mlp, 3 replicas, gradient buckets, clipping, loss scale",
       {.replicas = 3, .clip = true, .loss_scale = true, .buckets = true}},
      {"mlp, 2 replicas, gradient buckets, accumulation 2",
       {.replicas = 2, .accumulation = 2, .buckets = true}},
      {"mlp, 4 replicas, bfloat16 gradient compression, clipping",
       {.replicas = 4, .clip = true, .compression = td::GradientCompression::kBFloat16}},
      {"wide mlp (a kernel split between replicas), 2 replicas, clipping",
       {.model = ModelKind::kWide, .replicas = 2, .clip = true}},
      {"wide mlp, 4 replicas, clipping, accumulation 2, loss scale",
       {.model = ModelKind::kWide,
        .replicas = 4,
        .accumulation = 2,
        .clip = true,
        .loss_scale = true}},
      {"wide mlp, 3 replicas, AdamW, gradient buckets",
       {.model = ModelKind::kWide, .replicas = 3, .adamw = true, .buckets = true}},
  };
  for (const Case& c : cases) {
    for (const int stage : {1, 2}) {
      DYNAMIC_SECTION(c.name << ", stage " << stage) {
        Setup unsharded = c.setup;
        Setup sharded = c.setup;
        sharded.stage = stage;
        Job a(unsharded);
        Job b(sharded);
        // Step 4 overflows on replica 1: with a loss scale, both skip it alike (at stage 2
        // replica 1 may hold none of the non-finite sums: the count is agreed).
        const int64_t overflow = c.setup.loss_scale ? 4 : -1;
        a.train(0, 9, overflow);
        b.train(0, 9, overflow);
        const auto sa = a.state();
        const auto sb = b.state();
        CHECK(differences(sa, sb).empty());
        CHECK(b.inner->iterations() > 0);
        if (c.setup.loss_scale) CHECK(b.loss_scale->skipped_updates() == 1);
        // Sharded, the gradients are reduce-scattered after the backward pass, not in buckets.
        if (c.setup.buckets) CHECK(a.bucketed_steps > 0);
        CHECK(b.bucketed_steps == 0);
      }
    }
  }
}

TEST_CASE(
    "a stage-2 run's checkpoint on 4 replicas restores at 1, 2 and 3 replicas, at every "
    "stage, and training continues bitwise",
    "[cpu][optim][distribute][checkpoint]") {
  const td::checkpoint_testing::TempDir dir;
  const std::string path = dir.file("ckpt.h5");
  Setup four{
      .model = ModelKind::kWide, .replicas = 4, .stage = 2, .clip = true, .loss_scale = true};
  Job writer(four);
  writer.train(0, 5);
  writer.checkpoint().write(path);
  // What an unsharded job of the same replicas continues to: the reference.
  Setup reference_setup = four;
  reference_setup.stage = 0;
  Job reference(reference_setup);
  reference.checkpoint().restore(path);
  const auto reference_state = reference.state();
  CHECK(differences(reference_state, writer.state()).empty());
  writer.train(5, 4);
  reference.train(5, 4);
  CHECK(differences(reference.state(), writer.state()).empty());
  for (const int replicas : {1, 2, 3}) {
    for (const int stage : {1, 2}) {
      DYNAMIC_SECTION(replicas << " replicas, stage " << stage) {
        Setup s = four;
        s.replicas = replicas;
        s.stage = stage;
        Job restored(s);
        restored.checkpoint().restore(path);
        // The same state as written, whatever the replica count and stage.
        const auto before = restored.state();
        CHECK(differences(before, reference_state).empty());
        // Continuing at the same replica count with and without sharding gives the same bits.
        Setup other = s;
        other.stage = 0;
        Job twin(other);
        twin.checkpoint().restore(path);
        restored.train(5, 4);
        twin.train(5, 4);
        CHECK(differences(restored.state(), twin.state()).empty());
        CHECK(restored.inner->iterations() == 9);
      }
    }
  }
}

TEST_CASE("a sharded optimizer's update outside strategy.run updates every replica's copies alike",
          "[cpu][optim][distribute]") {
  // Cross-replica context (strategy.extended.update): one gradient for every replica's copies.
  // The update runs on this thread: one OpenMP thread here, since ThreadSanitizer cannot see
  // the synchronization of OpenMP's teams (uninstrumented) and the wide kernel's sums would
  // start one.
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  std::vector<std::map<std::string, std::string>> states;
  for (const int stage : {0, 1, 2}) {
    Job job({.model = ModelKind::kWide, .replicas = 3, .stage = stage, .clip = true});
    const std::vector<td::Variable> variables = job.model->trainable_variables();
    std::vector<td::Tensor> grads;
    td::Generator g(5);
    for (const td::Variable& v : variables) grads.push_back(td::Tensor::normal(v.shape(), g));
    job.inner->apply_gradients(grads, variables);
    job.inner->apply_gradients(grads, variables);
    CHECK(job.inner->iterations() == 2);
    states.push_back(job.state());  // checks that every replica's copies agree
  }
  omp_set_num_threads(threads);
  CHECK(differences(states[0], states[1]).empty());
  CHECK(differences(states[0], states[2]).empty());
}

TEST_CASE("shard_optimizer_state refuses the plain apply_gradients inside strategy.run",
          "[cpu][optim][distribute]") {
  Job job({.replicas = 2, .stage = 1});
  const std::vector<td::Variable> variables = job.model->trainable_variables();
  auto step = [&](td::ReplicaContext& ctx, const td::Tensor& x) {
    td::GradientTape tape;
    const td::Tensor loss = td::ops::sum((*job.model)(x, true));
    const auto grads = ctx.all_reduce(td::ReduceOp::kSum, tape.gradient(loss, variables));
    job.inner->apply_gradients(grads, variables, {.skip_gradients_aggregation = true});
  };
  td::Generator g(3);
  const td::Tensor x = td::Tensor::normal({4, 8}, g);
  CHECK_THROWS_WITH(job.strategy.run(step, td::PerReplica<td::Tensor>({x, x})),
                    Catch::Contains("shard_optimizer_state = 1") &&
                        Catch::Contains("optimizer.apply_gradients(ctx, gradients, variables)"));
}
