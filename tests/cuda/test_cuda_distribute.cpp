// [cuda] tests of distribution on GPUs: MirroredStrategy over logical replicas sharing one GPU
// (collectives through device memory, ordered by events), the data-parallel invariance on GPU
// replicas, input staging through pinned memory on a copy stream, the allocator in steady state
// and its memory limit. Without a GPU each test WARNs why it was skipped and passes.
#include <sys/wait.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "support/compare.h"
#include "support/require_gpu.h"
#include "tandem/distribute/internal/strategy_access.h"
#include "tandem/tandem.h"
#include "tandem/tensor/device_runtime.h"
#if TANDEM_WITH_NCCL
#include "tandem/collectives/internal/nccl_communicator.h"
#endif

namespace {

using namespace tandem;
namespace fs = std::filesystem;

/// `replicas` logical replicas on cuda:0.
MirroredStrategy logical_replicas(int replicas) {
  return MirroredStrategy(std::vector<Device>(static_cast<size_t>(replicas), Device::cuda(0)));
}

using tandem::testing::relative_difference;

}  // namespace

TEST_CASE("logical GPU replicas: all_reduce, all_gather and broadcast have closed forms",
          "[cuda][distribute]") {
  TANDEM_REQUIRE_GPU();
  for (int replicas : {2, 3, 4}) {
    auto strategy = logical_replicas(replicas);
    for (int64_t n : {int64_t{1}, int64_t{1000}, int64_t{1'000'003}}) {
      INFO(replicas << " replicas, " << n << " elements");
      // Replica r holds r + 1 + i/n at element i (a different value at every element).
      std::vector<std::vector<float>> sums(static_cast<size_t>(replicas));
      std::vector<std::vector<float>> maxima(static_cast<size_t>(replicas));
      std::vector<std::vector<float>> means(static_cast<size_t>(replicas));
      std::vector<std::vector<float>> gathered(static_cast<size_t>(replicas));
      std::vector<std::vector<float>> broadcast(static_cast<size_t>(replicas));
      strategy.run([&](ReplicaContext& ctx) {
        const int r = ctx.replica_id_in_sync_group();
        REQUIRE(ctx.device() == Device::cuda(0));
        std::vector<float> values(static_cast<size_t>(n));
        for (int64_t i = 0; i < n; ++i)
          values[static_cast<size_t>(i)] = static_cast<float>(r + 1) + static_cast<float>(i) / n;
        const Tensor mine = Tensor::from_vector(values).to(ctx.device());
        const auto id = static_cast<size_t>(r);
        sums[id] = ctx.all_reduce(ReduceOp::kSum, mine).to_vector<float>();
        maxima[id] = ctx.all_reduce(ReduceOp::kMax, mine).to_vector<float>();
        means[id] = ctx.all_reduce(ReduceOp::kMean, mine).to_vector<float>();
        const Tensor first_rows = mine.slice(0, std::min<int64_t>(n, r + 1));  // uneven pieces
        gathered[id] = ctx.all_gather(first_rows).to_vector<float>();
        broadcast[id] = ctx.broadcast(mine, replicas - 1).to_vector<float>();
      });
      for (int r = 0; r < replicas; ++r) {
        const auto id = static_cast<size_t>(r);
        REQUIRE(sums[id].size() == static_cast<size_t>(n));
        bool sums_ok = true, max_ok = true, mean_ok = true, broadcast_ok = true;
        for (int64_t i = 0; i < n; ++i) {
          const float frac = static_cast<float>(i) / n;
          // The sum in replica order, in float32, as the kernel adds.
          float sum = 0.0f + (1.0f + frac);
          for (int k = 1; k < replicas; ++k) sum = sum + (static_cast<float>(k + 1) + frac);
          const auto e = static_cast<size_t>(i);
          sums_ok = sums_ok && sums[id][e] == sum;
          max_ok = max_ok && maxima[id][e] == static_cast<float>(replicas) + frac;
          mean_ok = mean_ok && means[id][e] == sum / static_cast<float>(replicas);
          broadcast_ok = broadcast_ok && broadcast[id][e] == static_cast<float>(replicas) + frac;
        }
        CHECK(sums_ok);
        CHECK(max_ok);
        CHECK(mean_ok);
        CHECK(broadcast_ok);
        std::vector<float> expected_gather;
        for (int k = 0; k < replicas; ++k)
          for (int64_t i = 0; i < std::min<int64_t>(n, k + 1); ++i)
            expected_gather.push_back(static_cast<float>(k + 1) + static_cast<float>(i) / n);
        CHECK(gathered[id] == expected_gather);
      }
    }
  }
}

TEST_CASE("logical GPU replicas: flat reduce_scatter gives all_reduce's bits on each range",
          "[cuda][distribute]") {
  TANDEM_REQUIRE_GPU();
  for (int replicas : {2, 3}) {
    auto strategy = logical_replicas(replicas);
    for (int64_t n : {int64_t{37}, int64_t{100'003}}) {
      // Replica 0 owns nothing; the others split the buffer unevenly.
      std::vector<int64_t> offsets(static_cast<size_t>(replicas) + 1, n);
      offsets[0] = 0;
      for (int k = 1; k < replicas; ++k)
        offsets[static_cast<size_t>(k)] = k == 1 ? 0 : n * k / (replicas + 2);
      for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
        INFO(replicas << " replicas, " << n << " elements, " << dtype);
        std::vector<std::string> failures(static_cast<size_t>(replicas));
        strategy.run([&](ReplicaContext& ctx) {
          const int r = ctx.replica_id_in_sync_group();
          const auto me = static_cast<size_t>(r);
          // Values of mixed magnitudes: their sums depend on the order of the additions.
          std::vector<float> values(static_cast<size_t>(n));
          for (int64_t i = 0; i < n; ++i)
            values[static_cast<size_t>(i)] =
                std::ldexp(1.0f + 0.37f * static_cast<float>((i * 7 + r * 13) % 11),
                           static_cast<int>((i * 5 + r * 3) % 17) - 8);
          const Tensor input = ops::cast(Tensor::from_vector(values), dtype).to(ctx.device());
          collectives::Communicator& comm = ctx.communicator();
          std::vector<Tensor> in = {input};
          std::vector<Tensor> out = {Tensor::empty_like(input)};
          comm.all_reduce(in, out, ReduceOp::kSum)->wait();
          Tensor range;
          comm.reduce_scatter(input, range, offsets)->wait();
          const size_t element = dtype_size(dtype);
          const Tensor whole = out[0].to(Device::cpu());
          const Tensor mine = range.to(Device::cpu());
          if (mine.numel() != offsets[me + 1] - offsets[me] ||
              std::memcmp(mine.raw_data(),
                          static_cast<const char*>(whole.raw_data()) +
                              static_cast<size_t>(offsets[me]) * element,
                          mine.nbytes()) != 0)
            failures[me] += "reduce_scatter ";
          Tensor buffer = Tensor::zeros({n}, dtype, ctx.device());
          buffer.view_as({range.numel()}, static_cast<size_t>(offsets[me]) * element)
              .copy_from(range);
          comm.all_gather(buffer, offsets)->wait();
          const Tensor gathered = buffer.to(Device::cpu());
          if (std::memcmp(gathered.raw_data(), whole.raw_data(), whole.nbytes()) != 0)
            failures[me] += "all_gather ";
        });
        for (const std::string& f : failures) CHECK(f.empty());
      }
    }
  }
}

TEST_CASE("logical GPU replicas: mismatched calls raise on every replica", "[cuda][distribute]") {
  TANDEM_REQUIRE_GPU();
  auto strategy = logical_replicas(2);
  CHECK_THROWS_WITH(
      strategy.run([&](ReplicaContext& ctx) {
        const int64_t n = ctx.replica_id_in_sync_group() == 0 ? 10 : 11;
        ctx.all_reduce(ReduceOp::kSum, Tensor::ones({n}, DType::kFloat32, ctx.device()));
      }),
      Catch::Contains("all_reduce") && Catch::Contains("[10]") && Catch::Contains("[11]"));
  // The strategy is usable afterwards.
  std::vector<float> after(2);
  strategy.run([&](ReplicaContext& ctx) {
    after[static_cast<size_t>(ctx.replica_id_in_sync_group())] =
        ctx.all_reduce(ReduceOp::kSum, Tensor::ones({3}, DType::kFloat32, ctx.device()))
            .to_vector<float>()[0];
  });
  CHECK(after == std::vector<float>{2.0f, 2.0f});
}

namespace {

struct Trained {
  std::vector<std::vector<float>> weights;
  std::vector<std::vector<float>> initial;
  bool replicas_identical = true;
  uint64_t bucketed_steps = 0;  // replica 0's steps whose gradients went out in buckets
};

nn::Sequential mlp() {
  return nn::Sequential({nn::Dense(32, nn::Activation::kRelu), nn::Dense(4)});
}

/// 12 steps of a model (an MLP by default) on global batches of 64 from a distributed dataset,
/// Adam (with optimizer-state sharding at `shard_stage`).
Trained train(Strategy& strategy, const std::function<nn::Sequential()>& make_model = mlp,
              int shard_stage = 0) {
  Generator g(2024);
  const int64_t steps = 12, batch = 64;
  const Tensor features = Tensor::normal({steps * batch, 8}, g);
  std::vector<int64_t> labels(static_cast<size_t>(steps * batch));
  const float* f = features.data<float>();
  for (size_t i = 0; i < labels.size(); ++i) {
    const float score = f[i * 8] + 0.5f * f[i * 8 + 1] - f[i * 8 + 2];
    labels[i] = score < -0.7f ? 0 : score < 0.0f ? 1 : score < 0.7f ? 2 : 3;
  }
  auto data = strategy.distribute_dataset(
      data::from_tensor_slices({features, Tensor::from_vector(labels)}).batch(batch));
  nn::Sequential model = make_model();
  std::unique_ptr<optim::Adam> optimizer;
  {
    auto scope = strategy.scope();
    model.set_seed(5);
    model.build({8});
    optimizer = std::make_unique<optim::Adam>(
        optim::Adam::Options{.learning_rate = 0.01, .shard_optimizer_state = shard_stage});
    optimizer->build(model.trainable_variables());
  }
  const std::vector<Variable> variables = model.trainable_variables();
  Trained out;
  for (const Variable& v : variables) out.initial.push_back(v.copy(0).to_vector<float>());
  auto step = [&](ReplicaContext& ctx, const data::Batch& b) {
    REQUIRE(b.features().device() == ctx.device());  // the dataset placed it
    GradientTape tape;
    const Tensor loss = compute_average_loss(
        losses::sparse_categorical_crossentropy(b.labels(), model(b.features(), true), true),
        batch);
    optimizer->apply_gradients(ctx, tape.gradient(loss, variables), variables);
    if (ctx.replica_id_in_sync_group() == 0) out.bucketed_steps = ctx.bucketed_steps();
    return loss;
  };
  for (const auto& b : data) strategy.run(step, b);
  for (const Variable& v : variables) {
    out.weights.push_back(v.copy(0).to_vector<float>());
    for (int r = 1; r < v.num_copies(); ++r)
      out.replicas_identical =
          out.replicas_identical && v.copy(r).to_vector<float>() == out.weights.back();
  }
  return out;
}

}  // namespace

TEST_CASE("data-parallel invariance on GPU replicas: 1x64 on the CPU == 1x64 == 2x32 == 4x16",
          "[cuda][distribute]") {
  TANDEM_REQUIRE_GPU();
  auto cpu = MirroredStrategy::cpu(1);
  const Trained reference = train(cpu);
  for (int replicas : {1, 2, 4}) {
    auto strategy = logical_replicas(replicas);
    const Trained gpu = train(strategy);
    CHECK(gpu.replicas_identical);
    for (size_t v = 0; v < reference.weights.size(); ++v) {
      const double difference = relative_difference(reference.weights[v], gpu.weights[v]);
      INFO(replicas << " GPU replica(s), variable " << v << ": " << difference);
      CHECK(difference <= 1e-5);
      CHECK(relative_difference(reference.initial[v], reference.weights[v]) > 1e-3);
    }
  }
}

TEST_CASE(
    "batch norm (plain, and synchronized over GPU replicas) and layer norm train as on the CPU",
    "[cuda][distribute][batch_norm]") {
  TANDEM_REQUIRE_GPU();
  const auto normalized = [](bool synchronized) {
    return [synchronized] {
      return nn::Sequential({nn::Dense(16, nn::Activation::kNone, /*use_bias=*/false),
                             nn::BatchNormalization({.synchronized = synchronized}),
                             nn::ActivationLayer(nn::Activation::kRelu), nn::LayerNormalization(),
                             nn::Dense(4)});
    };
  };
  // The CPU's one-op batch norm against the GPU's composed ops; N synchronized GPU replicas
  // against one replica with the whole batch.
  auto cpu = MirroredStrategy::cpu(1);
  const Trained reference = train(cpu, normalized(false));
  for (const auto& [replicas, synchronized] : {std::pair{1, false}, {2, true}, {4, true}}) {
    auto strategy = logical_replicas(replicas);
    const Trained gpu = train(strategy, normalized(synchronized));
    CHECK(gpu.replicas_identical);
    for (size_t v = 0; v < reference.weights.size(); ++v) {
      const double difference = relative_difference(reference.weights[v], gpu.weights[v]);
      INFO(replicas << " GPU replica(s), synchronized " << synchronized << ", variable " << v
                    << ": " << difference);
      CHECK(difference <= 1e-4);
      CHECK(relative_difference(reference.initial[v], reference.weights[v]) > 1e-3);
    }
  }
}

TEST_CASE("gradient buckets on logical GPU replicas: the weights of the unbucketed all-reduce",
          "[cuda][distribute][buckets]") {
  TANDEM_REQUIRE_GPU();
  // Replicas sharing a GPU pack each bucket on their own stream and reduce it on their own
  // thread while the rest of the backward pass is queued; the sums are those of the
  // all-reduce after the backward pass, element for element.
  for (int replicas : {2, 4}) {
    INFO(replicas << " logical GPU replicas");
    auto plain_strategy = logical_replicas(replicas);
    plain_strategy.set_communication_options({.bytes_per_pack = 0, .first_bytes_per_pack = 0});
    const Trained plain = train(plain_strategy);
    auto bucketed_strategy = logical_replicas(replicas);
    // 8x32 and 32x4 kernels: 1 KiB buckets give several buckets a step.
    bucketed_strategy.set_communication_options(
        {.bytes_per_pack = 1024, .first_bytes_per_pack = 1});
    const Trained bucketed = train(bucketed_strategy);
    CHECK(plain.bucketed_steps == 0);
    CHECK(bucketed.bucketed_steps == 11);  // laid out at step 1, used at steps 2..12
    CHECK(plain.replicas_identical);
    CHECK(bucketed.replicas_identical);
    REQUIRE(bucketed.weights.size() == plain.weights.size());
    for (size_t v = 0; v < plain.weights.size(); ++v) {
      INFO("variable " << v);
      CHECK(bucketed.weights[v] == plain.weights[v]);
    }
  }
}

TEST_CASE("optimizer-state sharding on logical GPU replicas: stages 1 and 2 give stage 0's bits",
          "[cuda][distribute][optim]") {
  TANDEM_REQUIRE_GPU();
  // Slots on their owner's device alone, the gradients reduce-scattered to their owners and the
  // updated parts all-gathered (the buckets GPU strategies start with stand by).
  for (int replicas : {2, 4}) {
    auto unsharded_strategy = logical_replicas(replicas);
    const Trained unsharded = train(unsharded_strategy);
    for (int stage : {1, 2}) {
      INFO(replicas << " logical GPU replicas, stage " << stage);
      auto strategy = logical_replicas(replicas);
      const Trained sharded = train(strategy, mlp, stage);
      CHECK(sharded.replicas_identical);
      REQUIRE(sharded.weights.size() == unsharded.weights.size());
      for (size_t v = 0; v < unsharded.weights.size(); ++v) {
        INFO("variable " << v);
        CHECK(sharded.weights[v] == unsharded.weights[v]);
      }
    }
  }
}

TEST_CASE("input staging: batches copied on the copy stream match the host data", "[cuda][data]") {
  TANDEM_REQUIRE_GPU();
  // Many steps whose compute takes longer than the next batch's copy: a staging buffer or a
  // destination block reused too early would show up as a wrong sum.
  const int64_t steps = 60, batch = 512, width = 1024;
  Generator g(99);
  const Tensor features = Tensor::uniform({steps * batch, width}, g);
  std::vector<double> expected;
  for (int64_t s = 0; s < steps; ++s)
    expected.push_back(
        ops::sum(ops::cast(features.slice(s * batch, (s + 1) * batch), DType::kFloat64))
            .item<double>());
  auto strategy = logical_replicas(2);
  auto data = strategy.distribute_dataset(data::from_tensor_slices({features}).batch(batch));
  const Tensor weights = Tensor::ones({width, width}, DType::kFloat32, Device::cuda(0));
  std::vector<double> got;
  for (const auto& b : data) {
    PerReplica<Tensor> sums = strategy.run(
        [&](ReplicaContext& ctx, const data::Batch& piece) {
          REQUIRE(piece.features().device() == ctx.device());
          // Work that keeps the stream busy while the next copy is queued.
          Tensor busy = piece.features();
          for (int i = 0; i < 4; ++i) busy = ops::matmul(busy, weights);
          (void)busy;
          return ops::sum(ops::cast(piece.features(), DType::kFloat64));
        },
        b);
    got.push_back(strategy.reduce(ReduceOp::kSum, sums).item<double>());
  }
  REQUIRE(got.size() == expected.size());
  for (size_t s = 0; s < got.size(); ++s) {
    INFO("step " << s);
    CHECK(got[s] == Approx(expected[s]).epsilon(1e-9));
  }
}

TEST_CASE("a training step on 2 logical GPU replicas performs no new cudaMalloc",
          "[cuda][distribute]") {
  TANDEM_REQUIRE_GPU();
  auto strategy = logical_replicas(2);
  nn::Sequential model({nn::Dense(64, nn::Activation::kRelu), nn::Dense(10)});
  std::unique_ptr<optim::Adam> optimizer;
  {
    auto scope = strategy.scope();
    model.build({32});
    optimizer = std::make_unique<optim::Adam>();
    optimizer->build(model.trainable_variables());
  }
  Generator g(3);
  const Tensor x = Tensor::normal({64, 32}, g);
  std::vector<int64_t> y(64);
  for (size_t i = 0; i < y.size(); ++i) y[i] = static_cast<int64_t>(i % 10);
  auto data = strategy.distribute_dataset(
      data::from_tensor_slices({x, Tensor::from_vector(y)}).batch(32).repeat());
  const std::vector<Variable> variables = model.trainable_variables();
  auto step = [&](ReplicaContext& ctx, const data::Batch& b) {
    GradientTape tape;
    const Tensor loss = compute_average_loss(
        losses::sparse_categorical_crossentropy(b.labels(), model(b.features(), true), true), 32);
    optimizer->apply_gradients(ctx, tape.gradient(loss, variables), variables);
    return loss;
  };
  std::vector<data::Batch> pieces;
  auto run_steps = [&](int n) {
    for (int i = 0; i < n; ++i) {
      REQUIRE(data.next(pieces));
      strategy.reduce(ReduceOp::kSum, strategy.run(step, PerReplica<data::Batch>(pieces)))
          .item<float>();
    }
  };
  run_steps(3);  // warm-up: every size is cached on every stream
  const AllocatorStats before = allocator_for(Device::cuda(0)).stats();
  run_steps(5);
  const AllocatorStats after = allocator_for(Device::cuda(0)).stats();
  CHECK(after.system_allocs == before.system_allocs);
  CHECK(after.cache_hits > before.cache_hits);
}

TEST_CASE("GPU out of memory names the device, the request and what is held", "[cuda]") {
  TANDEM_REQUIRE_GPU();
  const Tensor held = Tensor::zeros({1024, 1024}, DType::kFloat32, Device::cuda(0));
  // 2^42 floats = 16 TiB: more than any GPU has.
  CHECK_THROWS_WITH(Tensor::empty({int64_t{1} << 42}, DType::kFloat32, Device::cuda(0)),
                    Catch::Contains("cuda:0: out of memory") &&
                        Catch::Contains("17592186044416 bytes") &&
                        Catch::Contains("in live tensors"));
  // The allocator still works.
  CHECK(ops::sum(held).item<float>() == 0.0f);
}

TEST_CASE("TANDEM_GPU_MEMORY_LIMIT_MB caps the allocator (child process)", "[cuda]") {
  TANDEM_REQUIRE_GPU();
  const std::string exe = fs::read_symlink("/proc/self/exe").string();
  const fs::path log = fs::temp_directory_path() / ("tandem_gpu_limit_" + std::to_string(getpid()));
  const std::string command = "TANDEM_GPU_MEMORY_LIMIT_MB=64 '" + exe +
                              "' 'GPU memory limit: the child' > '" + log.string() + "' 2>&1";
  const int status = std::system(command.c_str());
  std::ifstream in(log);
  std::stringstream text;
  text << in.rdbuf();
  fs::remove(log);
  INFO(text.str());
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  CHECK(text.str().find("All tests passed") != std::string::npos);
}

TEST_CASE("GPU memory limit: the child", "[.child]") {
  if (std::getenv("TANDEM_GPU_MEMORY_LIMIT_MB") == nullptr || cuda_device_count() == 0) return;
  // 32 MiB fits under 64 MiB, twice does too; a third 32 MiB block would not.
  const Tensor a = Tensor::empty({8 * 1024 * 1024}, DType::kFloat32, Device::cuda(0));
  const Tensor b = Tensor::empty({8 * 1024 * 1024 - 1024}, DType::kFloat32, Device::cuda(0));
  CHECK_THROWS_WITH(
      Tensor::empty({8 * 1024 * 1024}, DType::kFloat32, Device::cuda(0)),
      Catch::Contains("cuda:0: out of memory") && Catch::Contains("TANDEM_GPU_MEMORY_LIMIT_MB=64"));
  CHECK(allocator_for(Device::cuda(0)).stats().bytes_in_use <= 64u * 1024 * 1024);
}

TEST_CASE("the default MirroredStrategy takes every visible GPU", "[cuda][distribute]") {
  TANDEM_REQUIRE_GPU();
  if (std::getenv("TANDEM_CPU_REPLICAS") != nullptr) {
    WARN("skipped: TANDEM_CPU_REPLICAS is set");
    return;
  }
  MirroredStrategy strategy;
  REQUIRE(strategy.num_replicas_in_sync() == cuda_device_count());
  for (int i = 0; i < strategy.num_replicas_in_sync(); ++i)
    CHECK(strategy.devices()[static_cast<size_t>(i)] == Device::cuda(i));
}

#if TANDEM_WITH_NCCL
TEST_CASE("nccl: a group over the local GPUs gives closed forms", "[cuda][nccl]") {
  TANDEM_REQUIRE_GPU();
  const int gpus = cuda_device_count();
  std::vector<Device> devices;
  for (int i = 0; i < gpus; ++i) devices.push_back(Device::cuda(i));
  auto group = collectives::NcclClique::create(devices);
  REQUIRE(group->size() == gpus);
  std::vector<std::thread> threads;
  std::vector<std::string> failures(static_cast<size_t>(gpus));
  for (int r = 0; r < gpus; ++r) {
    threads.emplace_back([&, r] {
      try {
        collectives::Communicator& comm = group->communicator(r);
        const Device d = Device::cuda(r);
        const int64_t n = 1'000'003;
        std::vector<float> values(static_cast<size_t>(n));
        for (int64_t i = 0; i < n; ++i)
          values[static_cast<size_t>(i)] = static_cast<float>(r + 1) + static_cast<float>(i % 7);
        std::vector<Tensor> sum = {Tensor::from_vector(values).to(d)};
        comm.all_reduce(sum, ReduceOp::kSum)->wait();
        std::vector<Tensor> max = {Tensor::from_vector(values).to(d)};
        comm.all_reduce(max, ReduceOp::kMax)->wait();
        std::vector<Tensor> root_value = {Tensor::full({5}, r + 10.0, DType::kFloat32, d)};
        comm.broadcast(root_value, gpus - 1)->wait();
        std::vector<Tensor> gathered;
        comm.all_gather(gathered, Tensor::full({r + 1}, r, DType::kFloat32, d))->wait();
        Tensor scattered;
        comm.reduce_scatter(scattered, Tensor::ones({2 * gpus}, DType::kFloat32, d))->wait();
        const std::vector<float> s = sum[0].to_vector<float>();
        const std::vector<float> m = max[0].to_vector<float>();
        const float replicas_sum = static_cast<float>(gpus * (gpus + 1) / 2);
        for (int64_t i = 0; i < n; i += 9973) {
          const float k = static_cast<float>(i % 7);
          if (s[static_cast<size_t>(i)] != replicas_sum + gpus * k) failures[r] += "sum ";
          if (m[static_cast<size_t>(i)] != static_cast<float>(gpus) + k) failures[r] += "max ";
        }
        if (root_value[0].to_vector<float>() != std::vector<float>(5, gpus - 1 + 10.0f))
          failures[r] += "broadcast ";
        for (int k = 0; k < gpus; ++k)
          if (gathered[static_cast<size_t>(k)].to_vector<float>() !=
              std::vector<float>(static_cast<size_t>(k + 1), static_cast<float>(k)))
            failures[r] += "all_gather ";
        if (scattered.to_vector<float>() != std::vector<float>(2, static_cast<float>(gpus)))
          failures[r] += "reduce_scatter ";
        // Flat ranges (rank 0's empty, the others uneven): each rank's range of the sum is
        // the all-reduce's, and the all-gather of the ranges rebuilds the whole sum.
        std::vector<int64_t> offsets(static_cast<size_t>(gpus) + 1, n);
        offsets[0] = 0;
        for (int k = 1; k < gpus; ++k)
          offsets[static_cast<size_t>(k)] = k == 1 ? 0 : n * k / (gpus + 1);
        const auto me = static_cast<size_t>(r);
        Tensor range;
        comm.reduce_scatter(Tensor::from_vector(values).to(d), range, offsets)->wait();
        if (range.to_vector<float>() !=
            std::vector<float>(s.begin() + offsets[me], s.begin() + offsets[me + 1]))
          failures[r] += "flat reduce_scatter ";
        Tensor buffer = Tensor::zeros({n}, DType::kFloat32, d);
        buffer.view_as({range.numel()}, static_cast<size_t>(offsets[me]) * sizeof(float))
            .copy_from(range);
        comm.all_gather(buffer, offsets)->wait();
        if (buffer.to_vector<float>() != s) failures[r] += "flat all_gather ";
      } catch (const std::exception& e) {
        failures[r] += e.what();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (int r = 0; r < gpus; ++r) {
    INFO("rank " << r);
    CHECK(failures[static_cast<size_t>(r)].empty());
  }
  CHECK(group->communicator(0).stats().all_reduce == 2);
  CHECK(group->communicator(0).stats().reduce_scatter == 2);
  CHECK(group->communicator(0).stats().all_gather == 2);
}

TEST_CASE("nccl: two ranks on one GPU are refused by name", "[cuda][nccl]") {
  TANDEM_REQUIRE_GPU();
  CHECK_THROWS_WITH(collectives::NcclClique::create({Device::cuda(0), Device::cuda(0)}),
                    Catch::Contains("both on cuda:0") && Catch::Contains("in_process"));
}

TEST_CASE("nccl: after an abort every call raises naming the cause", "[cuda][nccl]") {
  TANDEM_REQUIRE_GPU();
  auto group = collectives::NcclClique::create({Device::cuda(0)});
  group->abort("test: a peer died");
  std::vector<Tensor> t = {Tensor::ones({4}, DType::kFloat32, Device::cuda(0))};
  CHECK_THROWS_WITH(group->communicator(0).all_reduce(t, ReduceOp::kSum),
                    Catch::Contains("aborted") && Catch::Contains("a peer died"));
}

TEST_CASE("MirroredStrategy over every GPU (NCCL) trains like one replica", "[cuda][nccl]") {
  TANDEM_REQUIRE_GPU();
  if (cuda_device_count() < 2) {
    WARN("skipped: needs 2 GPUs, this machine has " << cuda_device_count());
    return;
  }
  auto cpu = MirroredStrategy::cpu(1);
  const Trained reference = train(cpu);
  MirroredStrategy gpus({Device::cuda(0), Device::cuda(1)});
  REQUIRE(tandem::detail::StrategyAccess::communicator(gpus, 0).name() == "nccl");
  const Trained trained = train(gpus);
  CHECK(trained.replicas_identical);
  for (size_t v = 0; v < reference.weights.size(); ++v)
    CHECK(relative_difference(reference.weights[v], trained.weights[v]) <= 1e-5);
}

#if TANDEM_WITH_MPI
TEST_CASE("MultiWorkerMirroredStrategy on a GPU: one NCCL communicator, trains like one replica",
          "[cuda][nccl]") {
  // One process (worker 0 of 1, MPI singleton): the spanning NCCL communicator has one rank.
  // With mpirun and a GPU per process, the same code spans every worker's GPUs.
  TANDEM_REQUIRE_GPU();
  auto cpu = MirroredStrategy::cpu(1);
  const Trained reference = train(cpu);
  MultiWorkerMirroredStrategy worker({Device::cuda(0)});
  REQUIRE(worker.num_workers() == 1);
  REQUIRE(tandem::detail::StrategyAccess::communicator(worker, 0).name() == "nccl");
  const Trained trained = train(worker);
  for (size_t v = 0; v < reference.weights.size(); ++v)
    CHECK(relative_difference(reference.weights[v], trained.weights[v]) <= 1e-5);
}
#endif
#endif
