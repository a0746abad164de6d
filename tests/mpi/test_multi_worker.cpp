// [mpi] MultiWorkerMirroredStrategy, run by CTest under `mpirun -np W` with
// TANDEM_TEST_LOCAL_REPLICAS = L CPU replicas per worker (see tests/CMakeLists.txt): the cluster
// spec, collectives with closed-form results over all W x L replicas, cross-worker
// strategy.reduce, the chief's initial values, and the data-parallel invariance against one
// replica in the same process. Every process runs every test case and must pass.
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "mpi/job.h"
#include "support/compare.h"
#include "tandem/core/internal/json.h"
#include "tandem/distribute/internal/strategy_access.h"
#include "tandem/io/internal/hdf5_file.h"
#include "tandem/tandem.h"

namespace td = tandem;

namespace {

using Access = td::detail::StrategyAccess;  // the strategy's internals, for the tests

using tandem::testing::local_replicas;
using tandem::testing::shared_temp_dir;

td::MultiWorkerMirroredStrategy& strategy() { return tandem::testing::job_strategy(); }

using tandem::testing::relative_difference;

}  // namespace

TEST_CASE("multi-worker: the cluster spec and the strategy agree with mpirun", "[mpi]") {
  const td::ClusterSpec cluster = td::ClusterResolver::from_environment();
  // Started by mpirun, or one by one from TF_CONFIG (tests/mpi/tf_config_workers.sh).
  REQUIRE((cluster.source == "open mpi" || cluster.source == "tf_config"));
  td::Strategy& s = strategy();
  CHECK(s.num_workers() == cluster.size);
  CHECK(s.worker_index() == cluster.rank);
  CHECK(s.num_local_replicas() == local_replicas());
  CHECK(s.num_replicas_in_sync() == cluster.size * local_replicas());
  CHECK(s.is_chief() == (cluster.rank == 0));
  CHECK(Access::communicator(s, 0).size() == s.num_replicas_in_sync());
  CHECK(Access::communicator(s, 0).rank() == cluster.rank * local_replicas());
  // Gradient buckets start on where a thread waiting on the workers' collectives sleeps (Gloo,
  // one replica per worker), and off where it polls (Open MPI, shared memory between the
  // workers of one machine) or spins (in-process replicas).
  const std::string transport = Access::communicator(s, 0).name();
  // TF_CONFIG workers on one machine meet in shared memory; on two (the veth test), or with
  // TANDEM_WORKER_TRANSPORT=tcp, through Gloo.
  if (const char* expected = std::getenv("TANDEM_TEST_EXPECT_TRANSPORT"))
    CHECK(transport == std::string(expected) + "+in_process");
  const bool sleeps = transport.starts_with("gloo") && local_replicas() == 1;
  CHECK(Access::communicator(s, 0).waits_without_polling() == sleeps);
  CHECK(s.communication_options().bytes_per_pack == (sleeps ? int64_t{25} << 20 : 0));
}

TEST_CASE("multi-worker: workers sharing a machine compute on cores of their own", "[mpi]") {
  // However they were started (mpirun binds them; TF_CONFIG workers bind themselves), the
  // workers of one machine do not share cores unless there are fewer cores than workers.
  td::Strategy& s = strategy();
  const std::vector<int> mine = td::process_cores();
  CHECK(td::hardware_cores() == static_cast<int>(mine.size()));
  const std::string text = td::kernel_identity() + "\n" + td::format_cores(mine);
  const std::vector<std::vector<char>> all =
      td::worker_group()->all_gather(std::vector<char>(text.begin(), text.end()), "cores");
  REQUIRE(static_cast<int>(all.size()) == s.num_workers());
  int here = 0;
  std::vector<int> used;
  for (const std::vector<char>& piece : all) {
    const std::string theirs(piece.begin(), piece.end());
    const size_t newline = theirs.find('\n');
    if (theirs.substr(0, newline) != td::kernel_identity()) continue;
    ++here;
    // "0-1,3": every core listed.
    std::string list = theirs.substr(newline + 1);
    for (size_t at = 0; at < list.size();) {
      const size_t end = std::min(list.find(',', at), list.size());
      const std::string range = list.substr(at, end - at);
      const size_t dash = range.find('-');
      const int first = std::stoi(range.substr(0, dash));
      const int last = dash == std::string::npos ? first : std::stoi(range.substr(dash + 1));
      for (int c = first; c <= last; ++c) used.push_back(c);
      at = end + 1;
    }
  }
  std::sort(used.begin(), used.end());
  const bool disjoint = std::adjacent_find(used.begin(), used.end()) == used.end();
  INFO(here << " workers here; cores " << td::format_cores(mine) << " of this worker");
  if (here > 1) CHECK((disjoint || mine.size() == 1));
}

TEST_CASE("multi-worker: collectives over every replica of every worker", "[mpi]") {
  td::Strategy& s = strategy();
  const int total = s.num_replicas_in_sync();
  // Up to 1020 floats (4080 bytes) the data rides on the arrival messages; 1021 and more take
  // MPI_Allreduce.
  for (int64_t n : {int64_t{1}, int64_t{1020}, int64_t{1021}, int64_t{300'001}}) {
    INFO(n << " elements, " << total << " replicas");
    const int locals = s.num_local_replicas();
    std::vector<std::string> failures(static_cast<size_t>(locals));
    s.run([&](td::ReplicaContext& ctx) {
      const int g = ctx.replica_id_in_sync_group();
      std::string& fail = failures[static_cast<size_t>(g % locals)];
      if (ctx.num_replicas_in_sync() != total) fail += "num_replicas_in_sync ";
      std::vector<float> values(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i)
        values[static_cast<size_t>(i)] = static_cast<float>(g + 1 + i % 5);
      const td::Tensor mine = td::Tensor::from_vector(values);
      const std::vector<float> sum = ctx.all_reduce(td::ReduceOp::kSum, mine).to_vector<float>();
      const std::vector<float> mean = ctx.all_reduce(td::ReduceOp::kMean, mine).to_vector<float>();
      const std::vector<float> max = ctx.all_reduce(td::ReduceOp::kMax, mine).to_vector<float>();
      const std::vector<float> from_last = ctx.broadcast(mine, total - 1).to_vector<float>();
      const float replicas_sum = static_cast<float>(total * (total + 1) / 2);
      for (int64_t i = 0; i < n; ++i) {
        const auto e = static_cast<size_t>(i);
        const float k = static_cast<float>(i % 5);
        if (sum[e] != replicas_sum + total * k) fail += "sum ";
        if (std::abs(mean[e] - (replicas_sum + total * k) / total) > 1e-5f) fail += "mean ";
        if (max[e] != static_cast<float>(total) + k) fail += "max ";
        if (from_last[e] != static_cast<float>(total) + k) fail += "broadcast ";
        if (!fail.empty()) break;
      }
      // Uneven pieces: replica g contributes g + 1 rows of value g.
      const td::Tensor piece = td::Tensor::full({g + 1, 2}, g);
      const std::vector<float> gathered = ctx.all_gather(piece).to_vector<float>();
      std::vector<float> expected;
      for (int k = 0; k < total; ++k)
        expected.insert(expected.end(), 2 * (k + 1), static_cast<float>(k));
      if (gathered != expected) fail += "all_gather ";
      ctx.communicator().barrier()->wait();
    });
    for (const std::string& f : failures) CHECK(f.empty());
  }
}

TEST_CASE("multi-worker: bfloat16 and float16 all-reduces add in float32, the same bits everywhere",
          "[mpi]") {
  // 2040 bfloat16 values (4080 bytes) ride on the arrival messages (MPI, Gloo); more take
  // MPI_Allreduce with Tandem's reduction function, Gloo's ring, shared memory's slots.
  td::Strategy& s = strategy();
  const int total = s.num_replicas_in_sync();
  for (td::DType dtype : {td::DType::kBFloat16, td::DType::kFloat16}) {
    for (int64_t n : {int64_t{64}, int64_t{2040}, int64_t{2041}, int64_t{300'001}}) {
      INFO(dtype << ", " << n << " elements, " << total << " replicas");
      const int locals = s.num_local_replicas();
      std::vector<std::string> failures(static_cast<size_t>(locals));
      std::vector<std::vector<float>> inexact(static_cast<size_t>(locals));
      s.run([&](td::ReplicaContext& ctx) {
        const int g = ctx.replica_id_in_sync_group();
        std::string& fail = failures[static_cast<size_t>(g % locals)];
        // Small integers: every sum is exact in 16 bits.
        std::vector<float> values(static_cast<size_t>(n)), fractions(static_cast<size_t>(n));
        for (int64_t i = 0; i < n; ++i) {
          values[static_cast<size_t>(i)] = static_cast<float>(g + 1 + i % 5);
          fractions[static_cast<size_t>(i)] =
              0.1f * static_cast<float>(i % 97 + 1) * static_cast<float>(g + 1) / 3.0f;
        }
        const td::Tensor mine = td::ops::cast(td::Tensor::from_vector(values), dtype);
        const std::vector<float> sum =
            td::ops::cast(ctx.all_reduce(td::ReduceOp::kSum, mine), td::DType::kFloat32)
                .to_vector<float>();
        const std::vector<float> max =
            td::ops::cast(ctx.all_reduce(td::ReduceOp::kMax, mine), td::DType::kFloat32)
                .to_vector<float>();
        const float replicas_sum = static_cast<float>(total * (total + 1) / 2);
        for (int64_t i = 0; i < n; ++i) {
          const auto e = static_cast<size_t>(i);
          const float k = static_cast<float>(i % 5);
          if (sum[e] != replicas_sum + total * k) fail += "sum ";
          if (max[e] != static_cast<float>(total) + k) fail += "max ";
          if (!fail.empty()) break;
        }
        // Rounded values: the result is within the 16-bit type's rounding of the float32 sum
        // (one rounding per transport step), and the same on every replica.
        const td::Tensor rounded = td::ops::cast(td::Tensor::from_vector(fractions), dtype);
        const std::vector<float> got =
            td::ops::cast(ctx.all_reduce(td::ReduceOp::kSum, rounded), td::DType::kFloat32)
                .to_vector<float>();
        const float unit = dtype == td::DType::kBFloat16 ? 1.0f / 128 : 1.0f / 1024;
        for (int64_t i = 0; i < n; ++i) {
          const float exact = 0.1f * static_cast<float>(i % 97 + 1) * replicas_sum / 3.0f;
          if (std::abs(got[static_cast<size_t>(i)] - exact) > unit * exact) {
            fail += "rounded sum ";
            break;
          }
        }
        inexact[static_cast<size_t>(g % locals)] = got;
        ctx.communicator().barrier()->wait();
      });
      for (const std::string& f : failures) CHECK(f.empty());
      const std::vector<float>& got = inexact[0];
      for (const std::vector<float>& local : inexact) CHECK(local == got);
      const std::vector<std::vector<char>> all = td::worker_group()->all_gather(
          std::vector<char>(reinterpret_cast<const char*>(got.data()),
                            reinterpret_cast<const char*>(got.data() + got.size())),
          "sums");
      for (const std::vector<char>& other : all) {
        REQUIRE(other.size() == got.size() * sizeof(float));
        CHECK(std::memcmp(other.data(), got.data(), other.size()) == 0);
      }
    }
  }
}

namespace {

/// memcmp's equality, also for zero bytes (where a pointer may be null).
bool same_bytes(const void* a, const void* b, size_t n) {
  return n == 0 || std::memcmp(a, b, n) == 0;
}

/// `n` values of `dtype` from `seed`, normal values scaled by powers of ten (1e-8 to 1e8; 1e-3
/// to 1e3 for the 16-bit types): the rounding of their sums depends on the order of the terms.
/// Integers: scaled by 1e-4 to 1e4 and truncated (many zeros; sums well within int32).
td::Tensor mixed_magnitudes(int64_t n, td::DType dtype, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal;
  const int widest = !td::is_floating(dtype) ? 4 : td::dtype_size(dtype) == 2 ? 3 : 8;
  std::uniform_int_distribution<int> exponent(-widest, widest);
  std::vector<double> values(static_cast<size_t>(n));
  for (double& v : values) v = normal(rng) * std::pow(10.0, exponent(rng));
  return td::ops::cast(td::Tensor::from_vector(values), dtype);
}

/// Ranges of `n` elements over `ranks` replicas: "even" shares; "skewed" (replica r's range
/// grows with r: none empty, no two alike, when n is large enough); "uneven" (replica 0 and,
/// from 3 replicas, replica 2 own nothing; the rest split at uneven points); "last"
/// (everything on the last replica: every other worker's ranges are empty).
std::vector<int64_t> flat_ranges(const std::string& kind, int64_t n, int ranks) {
  std::vector<int64_t> offsets(static_cast<size_t>(ranks) + 1, n);
  offsets[0] = 0;
  for (int r = 1; r < ranks; ++r) {
    int64_t& at = offsets[static_cast<size_t>(r)];
    if (kind == "even") at = n * r / ranks;
    if (kind == "skewed") at = n * (r * r) / (ranks * ranks);
    if (kind == "uneven") at = r == 1 ? 0 : r == 2 ? n / 7 : n * (r * r) / (ranks * ranks);
    if (kind == "last") at = 0;
  }
  if (kind == "uneven" && ranks >= 3) offsets[3] = offsets[2];
  return offsets;
}

}  // namespace

TEST_CASE("multi-worker: flat reduce_scatter gives all_reduce's bits, all_gather the whole buffer",
          "[mpi]") {
  // Through every transport's paths: small buffers that ride on the arrival messages (MPI,
  // Gloo), larger ones that take MPI_Allreduce or Gloo's ring (or, between two MPI workers,
  // sums and integer maxima, a true reduce-scatter), and ones of several shared-memory slots
  // (1 MiB each).
  td::Strategy& s = strategy();
  const int total = s.num_replicas_in_sync();
  const int locals = s.num_local_replicas();
  for (td::DType dtype :
       {td::DType::kFloat32, td::DType::kBFloat16, td::DType::kFloat64, td::DType::kInt32}) {
    for (td::ReduceOp op : {td::ReduceOp::kSum, td::ReduceOp::kMean, td::ReduceOp::kMax}) {
      if (dtype == td::DType::kFloat64 && op != td::ReduceOp::kSum) continue;
      for (int64_t n : {int64_t{5}, int64_t{3001}, int64_t{300'001}}) {
        for (const char* kind : {"even", "skewed", "uneven", "last"}) {
          const std::vector<int64_t> offsets = flat_ranges(kind, n, total);
          INFO(dtype << ", " << op << ", " << n << " elements, " << kind << " ranges over " << total
                     << " replicas");
          std::vector<std::string> failures(static_cast<size_t>(locals));
          s.run([&](td::ReplicaContext& ctx) {
            const int g = ctx.replica_id_in_sync_group();
            const auto r = static_cast<size_t>(g);
            std::string& fail = failures[static_cast<size_t>(g % locals)];
            td::collectives::Communicator& comm = ctx.communicator();
            const td::Tensor input = mixed_magnitudes(n, dtype, 77 + static_cast<uint64_t>(g));
            std::vector<td::Tensor> in = {input};
            std::vector<td::Tensor> out = {td::Tensor::empty_like(input)};
            comm.all_reduce(in, out, op)->wait();
            td::Tensor mine;
            comm.reduce_scatter(input, mine, offsets, op)->wait();
            const size_t element = td::dtype_size(dtype);
            const char* all = static_cast<const char*>(out[0].raw_data());
            if (mine.numel() != offsets[r + 1] - offsets[r]) {
              fail += "reduce_scatter's output has " + std::to_string(mine.numel()) + " elements; ";
            } else if (!same_bytes(mine.raw_data(), all + static_cast<size_t>(offsets[r]) * element,
                                   mine.nbytes())) {
              fail += "reduce_scatter differs from all_reduce's range; ";
            }
            td::Tensor buffer = td::Tensor::full({n}, -3.0 - g, dtype);
            if (mine.nbytes() > 0 && mine.numel() == offsets[r + 1] - offsets[r])
              std::memcpy(
                  static_cast<char*>(buffer.raw_data()) + static_cast<size_t>(offsets[r]) * element,
                  mine.raw_data(), mine.nbytes());
            comm.all_gather(buffer, offsets)->wait();
            if (!same_bytes(buffer.raw_data(), all, buffer.nbytes()))
              fail += "reduce_scatter + all_gather differs from all_reduce; ";
          });
          for (const std::string& f : failures) CHECK(f.empty());
        }
      }
    }
  }
}

TEST_CASE("multi-worker: strategy.reduce combines every worker's replicas", "[mpi]") {
  td::Strategy& s = strategy();
  const int total = s.num_replicas_in_sync();
  td::PerReplica<td::Tensor> values = s.run([](td::ReplicaContext& ctx) {
    return td::Tensor::full({3}, ctx.replica_id_in_sync_group() + 1.0);
  });
  CHECK(s.reduce(td::ReduceOp::kSum, values).to_vector<float>() ==
        std::vector<float>(3, static_cast<float>(total * (total + 1) / 2)));
  CHECK(s.reduce(td::ReduceOp::kMax, values).to_vector<float>() ==
        std::vector<float>(3, static_cast<float>(total)));
  // With an axis, kMean divides by every element of every worker: replica g has g + 1 rows.
  td::PerReplica<td::Tensor> rows = s.run([](td::ReplicaContext& ctx) {
    const int g = ctx.replica_id_in_sync_group();
    return td::Tensor::full({g + 1}, 1.0);
  });
  const double count = total * (total + 1) / 2.0;
  CHECK(s.reduce(td::ReduceOp::kSum, rows, 0).item<float>() == static_cast<float>(count));
  CHECK(s.reduce(td::ReduceOp::kMean, rows, 0).item<float>() == 1.0f);
  // gather: every replica's rows in global replica order.
  td::PerReplica<td::Tensor> labelled = s.run([](td::ReplicaContext& ctx) {
    const int g = ctx.replica_id_in_sync_group();
    return td::Tensor::full({g + 1}, g);
  });
  std::vector<float> expected;
  for (int k = 0; k < total; ++k) expected.insert(expected.end(), k + 1, static_cast<float>(k));
  CHECK(s.gather(labelled).to_vector<float>() == expected);
}

TEST_CASE("multi-worker: loss scaling divides by the job's replicas, as TensorFlow does", "[mpi]") {
  // Replica g holds the per-example losses [2g + 1, 2g + 2]. Under mpirun -np 2 with one replica
  // each that is [1, 2] | [3, 4], for which TensorFlow 2.21 gives 0.75 and 1.75 (the divisor is
  // 2 examples x 2 replicas) and a regularization loss of 4 scaled to 2.
  td::Strategy& s = strategy();
  const int total = s.num_replicas_in_sync();
  const int locals = s.num_local_replicas();
  struct Result {
    float average = 0, regularization = 0;
    std::string sum_over_batch_error;
  };
  std::vector<Result> results(static_cast<size_t>(locals));
  s.run([&](td::ReplicaContext& ctx) {
    const int g = ctx.replica_id_in_sync_group();
    Result& r = results[static_cast<size_t>(g % locals)];
    const td::Tensor per_example =
        td::Tensor::from_vector(std::vector<float>{2.0f * g + 1, 2.0f * g + 2});
    r.average = td::compute_average_loss(per_example).item<float>();
    r.regularization = td::scale_regularization_loss(td::Tensor::scalar(4.0)).item<float>();
    // A loss reduced over this replica's batch alone would be wrong by the job's replica count.
    td::losses::MeanSquaredError mse({.reduction = td::losses::Reduction::kSumOverBatchSize});
    try {
      (void)mse(td::Tensor::zeros({2, 1}), td::Tensor::ones({2, 1}));
    } catch (const td::Error& e) {
      r.sum_over_batch_error = e.what();
    }
    return 0;
  });
  for (int local = 0; local < locals; ++local) {
    const int g = s.worker_index() * locals + local;
    INFO("replica " << g << " of " << total);
    const Result& r = results[static_cast<size_t>(local)];
    CHECK(r.average == static_cast<float>((4.0 * g + 3) / (2.0 * total)));
    CHECK(r.regularization == static_cast<float>(4.0 / total));
    if (total == 2 && locals == 1) {
      CHECK(r.average == (g == 0 ? 0.75f : 1.75f));
      CHECK(r.regularization == 2.0f);
    }
    CHECK_THAT(r.sum_over_batch_error,
               Catch::Contains("kSumOverBatchSize inside a strategy.run of " +
                               std::to_string(total) + " replicas"));
  }
}

TEST_CASE("multi-worker: variables start from the chief's values", "[mpi]") {
  td::Strategy& s = strategy();
  td::nn::Sequential model({td::nn::Dense(4)});
  {
    auto scope = s.scope();
    model.set_seed(100 + static_cast<uint64_t>(s.worker_index()));  // differs per worker
    model.build({3});
  }
  td::nn::Sequential chief_model({td::nn::Dense(4)});
  chief_model.set_seed(100);
  chief_model.build({3});
  const std::vector<td::Variable> mine = model.trainable_variables();
  const std::vector<td::Variable> chief = chief_model.trainable_variables();
  for (size_t v = 0; v < mine.size(); ++v)
    for (int r = 0; r < mine[v].num_copies(); ++r)
      CHECK(mine[v].copy(r).to_vector<float>() == chief[v].value().to_vector<float>());
}

namespace {

struct Trained {
  std::vector<std::vector<float>> initial, weights;
  uint64_t bucketed_steps = 0;  // replica 0's steps after the first reduced in gradient buckets
};

/// 10 steps of global batch 64 from the same data; kData sharding across workers. With
/// `sync_batch_norm`, a synchronized BatchNormalization between the two Dense layers (the first
/// without bias).
Trained train(td::Strategy& s, bool sync_batch_norm = false) {
  td::Generator g(2024);
  const int64_t steps = 10, batch = 64;
  const td::Tensor features = td::Tensor::normal({steps * batch, 8}, g);
  std::vector<int64_t> labels(static_cast<size_t>(steps * batch));
  const float* f = features.data<float>();
  for (size_t i = 0; i < labels.size(); ++i) {
    const float score = f[i * 8] + 0.5f * f[i * 8 + 1] - f[i * 8 + 2];
    labels[i] = score < -0.7f ? 0 : score < 0.0f ? 1 : score < 0.7f ? 2 : 3;
  }
  auto data = s.distribute_dataset(
      td::data::from_tensor_slices({features, td::Tensor::from_vector(labels)}).batch(batch),
      {.auto_shard_policy = td::data::AutoShardPolicy::kData});
  td::nn::Sequential model =
      sync_batch_norm
          ? td::nn::Sequential({td::nn::Dense(16, td::nn::Activation::kNone, false),
                                td::nn::BatchNormalization({.synchronized = true}),
                                td::nn::Dense(4)})
          : td::nn::Sequential({td::nn::Dense(16, td::nn::Activation::kRelu), td::nn::Dense(4)});
  std::unique_ptr<td::optim::Adam> optimizer;
  {
    auto scope = s.scope();
    model.set_seed(5);
    model.build({8});
    optimizer = std::make_unique<td::optim::Adam>(td::optim::Adam::Options{.learning_rate = 0.01});
    optimizer->build(model.trainable_variables());
  }
  const std::vector<td::Variable> variables = model.trainable_variables();
  Trained out;
  for (const td::Variable& v : variables) out.initial.push_back(v.copy(0).to_vector<float>());
  int64_t first_bucketed = -1;
  auto step = [&](td::ReplicaContext& ctx, const td::data::Batch& b) {
    td::GradientTape tape;
    const td::Tensor loss = td::compute_average_loss(
        td::losses::sparse_categorical_crossentropy(b.labels(), model(b.features(), true), true),
        batch);
    optimizer->apply_gradients(ctx, tape.gradient(loss, variables), variables);
    if (ctx.local_replica_id() == 0) {
      // The strategy's counter runs over its life: count from this loop's first step.
      if (first_bucketed < 0) first_bucketed = static_cast<int64_t>(ctx.bucketed_steps());
      out.bucketed_steps = ctx.bucketed_steps() - static_cast<uint64_t>(first_bucketed);
    }
    return loss;
  };
  int64_t ran = 0;
  for (const auto& b : data) {
    s.run(step, b);
    ++ran;
  }
  REQUIRE(ran == steps);
  for (const td::Variable& v : model.weights()) out.weights.push_back(v.copy(0).to_vector<float>());
  return out;
}

}  // namespace

TEST_CASE("multi-worker: W workers x L replicas train like one replica on the same batches",
          "[mpi]") {
  auto one = td::MirroredStrategy::cpu(1);  // in this process alone
  const Trained reference = train(one);
  const Trained distributed = train(strategy());
  for (size_t v = 0; v < reference.weights.size(); ++v) {
    const double difference = relative_difference(reference.weights[v], distributed.weights[v]);
    INFO("variable " << v << ": relative difference " << difference);
    CHECK(difference <= 1e-5);
    CHECK(relative_difference(reference.initial[v], reference.weights[v]) > 1e-3);
  }
}

TEST_CASE(
    "multi-worker: synchronized batch norm over W workers x L replicas trains like one replica "
    "with the global batch",
    "[mpi]") {
  auto one = td::MirroredStrategy::cpu(1);  // in this process alone
  const Trained reference = train(one, /*sync_batch_norm=*/true);
  const Trained distributed = train(strategy(), /*sync_batch_norm=*/true);
  REQUIRE(reference.weights.size() ==
          7);  // kernel, gamma, beta, moving mean/variance, kernel, bias
  for (size_t v = 0; v < reference.weights.size(); ++v) {
    const double difference = relative_difference(reference.weights[v], distributed.weights[v]);
    INFO("variable " << v << ": relative difference " << difference);
    CHECK(difference <= 1e-5);
  }
}

TEST_CASE("multi-worker: gradient buckets give the weights of the unbucketed all-reduce", "[mpi]") {
  // Buckets of 64 and 256 bytes: the gradients of the 8 -> 16 -> 4 MLP go out in 3 buckets,
  // during the backward pass, through each worker's communication threads (in-process among
  // its replicas, then MPI or Gloo between the workers).
  td::Strategy& s = strategy();
  const td::CommunicationOptions saved = s.communication_options();
  s.set_communication_options({.bytes_per_pack = 0, .first_bytes_per_pack = 0});
  const Trained plain = train(s);
  s.set_communication_options({.bytes_per_pack = 256, .first_bytes_per_pack = 64});
  const Trained bucketed = train(s);
  s.set_communication_options(saved);
  CHECK(plain.bucketed_steps == 0);
  CHECK(bucketed.bucketed_steps == 9);  // 10 steps, the first lays the buckets out
  if (s.num_workers() == 2) {
    // Two workers add their two partial sums: one order whatever the message sizes.
    CHECK(bucketed.weights == plain.weights);
  } else {
    // Open MPI picks its all-reduce algorithm (and so the order of the additions between
    // workers) by message size, and buckets are smaller messages.
    for (size_t v = 0; v < plain.weights.size(); ++v)
      CHECK(relative_difference(plain.weights[v], bucketed.weights[v]) <= 1e-6);
  }
}

TEST_CASE(
    "multi-worker: gradients sent as bfloat16 or float16 give every worker the same bits, close "
    "to float32's",
    "[mpi]") {
  // In-process among a worker's replicas (float32 sums rounded once), then MPI, shared memory
  // or Gloo between the workers (float32 adds, rounded between the transport's steps).
  td::Strategy& s = strategy();
  const td::CommunicationOptions saved = s.communication_options();
  s.set_communication_options({.bytes_per_pack = 0, .first_bytes_per_pack = 0});
  const Trained plain = train(s);
  for (td::GradientCompression compression :
       {td::GradientCompression::kBFloat16, td::GradientCompression::kFloat16}) {
    for (int64_t bucket : {int64_t{0}, int64_t{256}}) {
      INFO(td::to_string(compression) << ", buckets of " << bucket << " bytes");
      s.set_communication_options({.bytes_per_pack = bucket,
                                   .first_bytes_per_pack = bucket > 0 ? 64 : 0,
                                   .gradient_compression = compression});
      const Trained compressed = train(s);
      CHECK(compressed.bucketed_steps == (bucket > 0 ? 9u : 0u));
      std::string mine;
      for (size_t v = 0; v < plain.weights.size(); ++v) {
        const double difference = relative_difference(plain.weights[v], compressed.weights[v]);
        INFO("variable " << v << ": relative difference " << difference);
        CHECK(difference <= (compression == td::GradientCompression::kBFloat16 ? 3e-2 : 1.5e-2));
        const std::vector<float>& values = compressed.weights[v];
        mine.append(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float));
      }
      CHECK(compressed.weights != plain.weights);  // the 16-bit rounding shows
      const std::vector<std::vector<char>> all =
          td::worker_group()->all_gather(std::vector<char>(mine.begin(), mine.end()), "weights");
      for (const std::vector<char>& other : all)
        CHECK(std::string(other.begin(), other.end()) == mine);
    }
  }
  s.set_communication_options(saved);
}

TEST_CASE("multi-worker: auto-shard policies across workers", "[mpi]") {
  td::Strategy& s = strategy();
  const int workers = s.num_workers();
  const int64_t n = 96;
  std::vector<float> ids(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) ids[static_cast<size_t>(i)] = static_cast<float>(i);
  for (const auto& [policy, copies] : std::vector<std::pair<td::data::AutoShardPolicy, int>>{
           {td::data::AutoShardPolicy::kData, 1},
           {td::data::AutoShardPolicy::kAuto, 1},
           {td::data::AutoShardPolicy::kOff, workers}}) {
    INFO("policy " << static_cast<int>(policy));
    auto data =
        s.distribute_dataset(td::data::from_tensor_slices({td::Tensor::from_vector(ids)}).batch(16),
                             {.auto_shard_policy = policy});
    // How often each id reached a replica of this worker, then summed over the workers.
    std::vector<float> seen(static_cast<size_t>(n), 0.0f);
    for (const auto& b : data)
      for (const td::data::Batch& piece : s.local_results(b))
        for (float id : piece[0].to_vector<float>()) seen[static_cast<size_t>(id)] += 1.0f;
    const std::vector<float> total =
        Access::reduce_across_workers(s, td::ReduceOp::kSum, td::Tensor::from_vector(seen))
            .to_vector<float>();
    CHECK(total == std::vector<float>(static_cast<size_t>(n), static_cast<float>(copies)));
    if (policy == td::data::AutoShardPolicy::kData) {
      // Every W-th element, from this worker's index.
      bool mine_only = true;
      for (int64_t i = 0; i < n; ++i)
        mine_only = mine_only &&
                    (seen[static_cast<size_t>(i)] == 1.0f) == (i % workers == s.worker_index());
      CHECK(mine_only);
    }
  }
  // kFile on a source without files: refused on every worker, naming the policy.
  CHECK_THROWS_WITH(
      s.distribute_dataset(td::data::from_tensor_slices({td::Tensor::from_vector(ids)}).batch(16),
                           {.auto_shard_policy = td::data::AutoShardPolicy::kFile}),
      Catch::Contains("kFile"));
}

TEST_CASE("multi-worker: uneven inputs end together, the worker that ran out feeds empty batches",
          "[mpi]") {
  td::Strategy& s = strategy();
  const int workers = s.num_workers();
  const int locals = s.num_local_replicas();
  // Worker w's pipeline holds 3 + w batches of 4 examples per replica.
  auto data = s.distribute_datasets_from_function([&](const td::data::InputContext& input) {
    const int64_t batches = 3 + input.input_pipeline_id();
    const int64_t rows = batches * locals * 4;
    std::vector<float> values(static_cast<size_t>(rows), 1.0f);
    return td::data::from_tensor_slices({td::Tensor::from_vector(values)}).batch(4);
  });
  for (int epoch = 0; epoch < 2; ++epoch) {
    int steps = 0, empty_steps = 0;
    std::vector<float> totals;
    for (const auto& b : data) {
      ++steps;
      if (b[0].batch_size() == 0) ++empty_steps;
      // A collective every step: a worker waiting at the last batch would time out here.
      td::PerReplica<td::Tensor> sums = s.run(
          [](td::ReplicaContext& ctx, const td::data::Batch& piece) {
            return ctx.all_reduce(td::ReduceOp::kSum, td::ops::sum(piece[0]));
          },
          b);
      totals.push_back(s.local_results(sums)[0].item<float>());
    }
    INFO("worker " << s.worker_index() << ", epoch " << epoch);
    CHECK(steps == 3 + workers - 1);  // as many steps as the longest pipeline
    CHECK(empty_steps == workers - 1 - s.worker_index());
    // Step k sums 4 examples of every replica whose worker still has a batch k.
    for (int k = 0; k < steps; ++k) {
      const int with_data = workers - std::max(0, k - 2);
      CHECK(totals[static_cast<size_t>(k)] == static_cast<float>(4 * locals * with_data));
    }
  }
}

namespace {

/// A small Adam run with dropout on distribute_dataset batches, checkpointed as a whole.
struct ResumableRun {
  explicit ResumableRun(td::Strategy& s, int accumulation_steps = 1)
      : strategy(s),
        data(s.distribute_dataset(make_data(),
                                  {.auto_shard_policy = td::data::AutoShardPolicy::kData})) {
    auto scope = s.scope();
    model = std::make_unique<td::nn::Sequential>(std::initializer_list<td::nn::Module>{
        td::nn::Dense(16, td::nn::Activation::kRelu), td::nn::Dropout(0.25), td::nn::Dense(4)});
    model->set_seed(11);
    model->build({8});
    optimizer = std::make_unique<td::optim::Adam>(td::optim::Adam::Options{
        .learning_rate = 0.01, .gradient_accumulation_steps = accumulation_steps});
    optimizer->build(model->trainable_variables());
  }
  static td::data::Dataset make_data() {
    td::Generator g(7);
    const td::Tensor x = td::Tensor::normal({512, 8}, g);
    std::vector<int64_t> y(512);
    for (size_t i = 0; i < y.size(); ++i) y[i] = static_cast<int64_t>(i % 4);
    return td::data::from_tensor_slices({x, td::Tensor::from_vector(y)})
        .shuffle(128, 3)
        .batch(32)
        .repeat();
  }
  td::Checkpoint checkpoint() {
    return td::Checkpoint({{"model", model.get()},
                           {"optimizer", optimizer.get()},
                           {"data", &data},
                           {"train_loss", &loss_metric}});
  }
  void train(int steps) {
    const std::vector<td::Variable> variables = model->trainable_variables();
    std::vector<td::data::Batch> pieces;
    for (int i = 0; i < steps; ++i) {
      REQUIRE(data.next(pieces));
      strategy.run(
          [&](td::ReplicaContext& ctx, const td::data::Batch& b) {
            td::GradientTape tape;
            const td::Tensor per_example = td::losses::sparse_categorical_crossentropy(
                b.labels(), (*model)(b.features(), true), true);
            const td::Tensor loss = td::compute_average_loss(per_example, 32);
            optimizer->apply_gradients(ctx, tape.gradient(loss, variables), variables);
            loss_metric.update_state(per_example);
          },
          td::PerReplica<td::data::Batch>(pieces));
    }
  }
  std::vector<std::vector<float>> weights() const {
    std::vector<std::vector<float>> out;
    for (const td::Variable& v : model->weights())
      for (int r = 0; r < v.num_copies(); ++r) out.push_back(v.copy(r).to_vector<float>());
    for (const auto& [name, slot] : optimizer->slot_variables())
      for (int r = 0; r < slot.num_copies(); ++r) out.push_back(slot.copy(r).to_vector<float>());
    return out;
  }
  td::Strategy& strategy;
  td::data::DistributedDataset data;
  td::metrics::Mean loss_metric{"train_loss"};  // made while the strategy lives: of the job
  std::unique_ptr<td::nn::Sequential> model;
  std::unique_ptr<td::optim::Adam> optimizer;
};

}  // namespace

TEST_CASE("multi-worker: a collective that differs between workers raises on every worker",
          "[mpi]") {
  td::Strategy& s = strategy();
  // The chief reduces 3 values, the others 2: without the check the MPI calls would pair up
  // wrongly; with it every worker raises, naming the others, and the job goes on.
  const td::Tensor mine = td::Tensor::ones({s.is_chief() ? 3 : 2});
  CHECK_THROWS_WITH(Access::reduce_across_workers(s, td::ReduceOp::kSum, mine),
                    Catch::Contains("made a different collective call than worker " +
                                    std::to_string(s.worker_index())));
  CHECK(Access::reduce_across_workers(s, td::ReduceOp::kSum, td::Tensor::scalar(1.0))
            .item<double>() == s.num_workers());
}

namespace {

/// One update of an 8 -> width -> 4 MLP with Adam(learning_rate), the loss divided by
/// `global_batch`; returns what the strategy raised ("" when nothing).
std::string train_once(td::Strategy& s, int64_t width, double learning_rate, int64_t global_batch) {
  td::nn::Sequential model({td::nn::Dense(width, td::nn::Activation::kRelu), td::nn::Dense(4)});
  std::unique_ptr<td::optim::Adam> optimizer;
  {
    auto scope = s.scope();
    model.build({8});
    optimizer =
        std::make_unique<td::optim::Adam>(td::optim::Adam::Options{.learning_rate = learning_rate});
  }
  const std::vector<td::Variable> variables = model.trainable_variables();
  try {
    s.run([&](td::ReplicaContext& ctx) {
      td::GradientTape tape;
      const td::Tensor x = td::Tensor::ones({2, 8});
      const td::Tensor y = td::Tensor::from_vector(std::vector<int64_t>{1, 2});
      const td::Tensor loss = td::compute_average_loss(
          td::losses::sparse_categorical_crossentropy(y, model(x, true), true), global_batch);
      optimizer->apply_gradients(ctx, tape.gradient(loss, variables), variables);
    });
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("multi-worker: workers training something else raise before the first update", "[mpi]") {
  // Another job's worker, or another version of the program: a hyper-parameter, a layer or the
  // global batch differs on worker 1. Every worker raises, naming the field and both values.
  td::Strategy& s = strategy();
  const int64_t batch = 2 * s.num_replicas_in_sync();
  const bool other = s.worker_index() == 1;
  CHECK(train_once(s, 16, 0.01, batch).empty());
  CHECK_THAT(train_once(s, 16, other ? 0.02 : 0.01, batch),
             Catch::Contains("the workers do not train the same thing: adam learning_rate is "
                             "0.01 on the chief (worker 0) and 0.02 on worker 1"));
  // A layer of another size: the variables' first values come from the chief, and the
  // broadcast that sends them names the variable.
  const std::string shape = other ? "[8, 17]" : "[8, 16]";
  CHECK_THROWS_WITH(train_once(s, other ? 17 : 16, 0.01, batch),
                    Catch::Contains("the initial value of variable \"dense/kernel\" " + shape) &&
                        Catch::Contains(" made a different collective call than worker " +
                                        std::to_string(s.worker_index())));
  CHECK_THAT(train_once(s, 16, 0.01, other ? batch + 1 : batch),
             Catch::Contains("global batch size (compute_average_loss) is " +
                             std::to_string(batch) + " on the chief (worker 0) and " +
                             std::to_string(batch + 1) + " on worker 1"));
  // Everyone raised alike: the strategy goes on.
  CHECK(train_once(s, 16, 0.01, batch).empty());
}

TEST_CASE("multi-worker: every worker follows the chief's save decisions and its outcome",
          "[mpi]") {
  td::Strategy& s = strategy();
  const std::string dir = shared_temp_dir(s);
  // The other workers keep their own (empty) directories, as on hosts without a shared one.
  const std::string own_dir = s.is_chief() ? dir
                                           : (std::filesystem::temp_directory_path() /
                                              ("tandem_mpi_own_" + std::to_string(::getpid())))
                                                 .string();
  ResumableRun run(s);
  run.train(2);
  {
    td::CheckpointManager first(run.checkpoint(), own_dir, {.strategy = &s});
    REQUIRE(first.save(2).has_value());
  }
  // A new manager: the chief finds ckpt-2 in its directory, the others find nothing, so only
  // the chief knows that step 4 is within the interval. Every worker must skip with it.
  td::CheckpointManager manager(run.checkpoint(), own_dir,
                                {.checkpoint_interval = 5, .strategy = &s});
  CHECK_FALSE(manager.save(4).has_value());
  CHECK(manager.save(7).has_value());
  if (s.is_chief()) CHECK(std::filesystem::exists(dir + "/ckpt-7.h5"));
  // The chief's write fails (its directory is gone): every worker raises.
  Access::reduce_across_workers(s, td::ReduceOp::kSum, td::Tensor::scalar(1.0));
  if (s.is_chief()) std::filesystem::remove_all(dir);
  if (s.is_chief()) {
    CHECK_THROWS(manager.save(20));
  } else {
    CHECK_THROWS_WITH(manager.save(20), Catch::Contains("the chief could not write") &&
                                            Catch::Contains("ckpt-20.h5"));
  }
  // The job goes on together after the failure.
  CHECK(Access::reduce_across_workers(s, td::ReduceOp::kSum, td::Tensor::scalar(1.0))
            .item<double>() == s.num_workers());
  std::filesystem::remove_all(own_dir);
}

TEST_CASE(
    "multi-worker: a checkpoint stores unsynchronized batch norm's moving statistics as their "
    "mean over every replica of every worker",
    "[mpi]") {
  td::Strategy& s = strategy();
  const std::string dir = shared_temp_dir(s);
  td::nn::BatchNormalization bn({.momentum = 0.5});
  {
    auto scope = s.scope();
    bn.build({2});
  }
  // Replica g normalizes rows {g + 1, 2g + 2} and {g + 2, 2g + 4}: its copy of the moving mean
  // becomes 0.5 x [g + 1.5, 2g + 3].
  s.run([&](td::ReplicaContext& ctx) {
    const auto g = static_cast<float>(ctx.replica_id_in_sync_group());
    (void)bn(td::Tensor::from_vector(std::vector<float>{g + 1, 2 * g + 2, g + 2, 2 * g + 4},
                                     td::Shape{2, 2}),
             /*training=*/true);
  });
  const int total = s.num_replicas_in_sync();
  std::vector<float> expected{0, 0};
  for (int g = 0; g < total; ++g) {
    expected[0] += 0.5f * (static_cast<float>(g) + 1.5f) / static_cast<float>(total);
    expected[1] += 0.5f * (2.0f * static_cast<float>(g) + 3.0f) / static_cast<float>(total);
  }
  td::Checkpoint checkpoint({{"model", &bn}});
  td::CheckpointManager manager(checkpoint, dir, {.strategy = &s});
  REQUIRE(manager.save(1).has_value());
  if (s.is_chief()) {
    td::nn::BatchNormalization restored({.momentum = 0.5});
    restored.build({2});
    td::Checkpoint({{"model", &restored}}).restore(dir + "/ckpt-1.h5");
    const std::vector<float> got = restored.weights()[2].value().to_vector<float>();
    CHECK(relative_difference(expected, got) <= 1e-6);
    std::filesystem::remove_all(dir);
  }
}

TEST_CASE("multi-worker: kFile and kAuto deal the files round-robin to the workers", "[mpi]") {
  td::Strategy& s = strategy();
  const int workers = s.num_workers();
  const std::string dir = shared_temp_dir(s);
  // workers + 1 files of 8 rows, row r of file f holding 100 f + r: worker 0 gets two files,
  // so the pipelines are uneven and end together through the end-of-data agreement.
  const int num_files = workers + 1;
  std::vector<std::string> files;
  for (int f = 0; f < num_files; ++f) {
    files.push_back(dir + "/part" + std::to_string(f) + ".h5");
    if (!s.is_chief()) continue;
    std::vector<float> rows;
    for (int r = 0; r < 8; ++r) rows.push_back(static_cast<float>(100 * f + r));
    td::h5::File file = td::h5::File::create(files.back());
    file.root().write_tensor("y", td::Tensor::from_vector(rows));
  }
  Access::reduce_across_workers(s, td::ReduceOp::kSum, td::Tensor::scalar(1.0));  // the files exist
  for (const td::data::AutoShardPolicy policy :
       {td::data::AutoShardPolicy::kFile, td::data::AutoShardPolicy::kAuto}) {
    INFO("policy " << static_cast<int>(policy));
    auto data = s.distribute_dataset(td::data::hdf5(files, {"y"}).batch(4 * workers),
                                     {.auto_shard_policy = policy});
    std::vector<float> seen(static_cast<size_t>(100 * num_files), 0.0f);
    bool only_my_files = true;
    for (const auto& b : data)
      for (const td::data::Batch& piece : s.local_results(b))
        for (float value : piece[0].to_vector<float>()) {
          seen[static_cast<size_t>(value)] += 1.0f;
          only_my_files =
              only_my_files && (static_cast<int>(value) / 100) % workers == s.worker_index();
        }
    CHECK(only_my_files);  // file f goes to worker f mod W
    const std::vector<float> total =
        Access::reduce_across_workers(s, td::ReduceOp::kSum, td::Tensor::from_vector(seen))
            .to_vector<float>();
    std::vector<float> once(seen.size(), 0.0f);  // every row of every file, once
    for (int f = 0; f < num_files; ++f)
      for (int r = 0; r < 8; ++r) once[static_cast<size_t>(100 * f + r)] = 1.0f;
    CHECK(total == once);
  }
  // Fewer files than workers: kFile is refused on every worker, naming both counts.
  const std::vector<std::string> one_short(files.begin(), files.begin() + workers - 1);
  CHECK_THROWS_WITH(s.distribute_dataset(td::data::hdf5(one_short, {"y"}).batch(4 * workers),
                                         {.auto_shard_policy = td::data::AutoShardPolicy::kFile}),
                    Catch::Contains(std::to_string(workers - 1) + " file(s) cannot be dealt to " +
                                    std::to_string(workers) + " workers"));
  // All done reading.
  Access::reduce_across_workers(s, td::ReduceOp::kSum, td::Tensor::scalar(1.0));
  if (s.is_chief()) std::filesystem::remove_all(dir);
}

TEST_CASE(
    "multi-worker: a checkpoint written by the chief alone resumes exactly, sent to the others",
    "[mpi]") {
  td::Strategy& s = strategy();
  const std::string dir = shared_temp_dir(s);
  ResumableRun straight(s);
  straight.train(12);
  const std::vector<std::vector<float>> expected = straight.weights();

  {
    ResumableRun first(s);
    first.train(6);
    td::CheckpointManager manager(first.checkpoint(), dir, {.max_to_keep = 2, .strategy = &s});
    const std::optional<std::string> saved = manager.save();
    REQUIRE(saved == dir + "/ckpt-6.h5");
  }
  // Every worker reached the save; the chief's file is complete before anyone reads it.
  Access::reduce_across_workers(s, td::ReduceOp::kSum, td::Tensor::scalar(1.0));
  size_t files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir))
    if (entry.path().extension() == ".h5") ++files;
  CHECK(files == 1);  // one writer

  // The other workers restore from an empty directory of their own: the chief sends the file
  // (hosts without a shared file system).
  const std::string own_dir = s.is_chief() ? dir
                                           : (std::filesystem::temp_directory_path() /
                                              ("tandem_mpi_empty_" + std::to_string(::getpid())))
                                                 .string();
  ResumableRun resumed(s);
  td::CheckpointManager manager(resumed.checkpoint(), own_dir, {.max_to_keep = 2, .strategy = &s});
  REQUIRE(manager.restore_or_initialize() == dir + "/ckpt-6.h5");
  if (!s.is_chief()) {
    CHECK(std::filesystem::is_empty(own_dir));
    std::filesystem::remove_all(own_dir);
  }
  resumed.train(6);
  const std::vector<std::vector<float>> got = resumed.weights();
  REQUIRE(got.size() == expected.size());
  for (size_t i = 0; i < got.size(); ++i) {
    INFO("tensor " << i);
    CHECK(got[i] == expected[i]);  // bitwise
  }
  // All done reading.
  Access::reduce_across_workers(s, td::ReduceOp::kSum, td::Tensor::scalar(1.0));
  if (s.is_chief()) std::filesystem::remove_all(dir);
}

TEST_CASE("multi-worker: metrics combine every worker's replicas, local_result() does not",
          "[mpi]") {
  td::Strategy& s = strategy();
  const int total = s.num_replicas_in_sync();
  td::metrics::Mean mean("mean");
  REQUIRE(mean.num_workers() == s.num_workers());
  // Global replica g adds g + 1 (twice, weight 1 each): the job's mean is (total + 1) / 2.
  s.run([&](td::ReplicaContext& ctx) {
    const float value = static_cast<float>(ctx.replica_id_in_sync_group() + 1);
    mean.update_state(td::Tensor::from_vector(std::vector<float>{value, value}));
  });
  CHECK(mean.result() == Approx((total + 1) / 2.0));
  CHECK(mean.combined_state().scalar("count") == 2.0 * total);
  const int first = s.worker_index() * s.num_local_replicas() + 1;  // this worker's values
  CHECK(mean.local_result() == Approx(first + (s.num_local_replicas() - 1) / 2.0));
  CHECK(mean.local_state().scalar("count") == 2.0 * s.num_local_replicas());
  // A restored (job-wide) state lands on the chief alone, so result() counts it once.
  mean.set_combined_state({{"total", {10.0}}, {"count", {4.0}}});
  CHECK(mean.result() == Approx(2.5));
  CHECK(mean.combined_state().scalar("count") == 4.0);
  // result() is a collective of the job: inside run, where several replica threads of a worker
  // would make it at once, it is refused, naming the rule.
  if (s.num_local_replicas() > 1)
    CHECK_THROWS_WITH(s.run([&](td::ReplicaContext&) { (void)mean.result(); }),
                      Catch::Contains("call it outside strategy.run, on every worker"));
}

TEST_CASE("multi-worker: max across workers keeps a NaN from any worker", "[mpi]") {
  td::Strategy& s = strategy();
  // The last worker's NaN must win on every worker (a non-finite flag is never lost).
  const double mine = s.worker_index() == s.num_workers() - 1 ? std::nan("") : 1.0;
  CHECK(std::isnan(Access::reduce_across_workers(s, td::ReduceOp::kMax, td::Tensor::scalar(mine))
                       .item<double>()));
  CHECK(Access::reduce_across_workers(s, td::ReduceOp::kMax,
                                      td::Tensor::scalar(static_cast<double>(s.worker_index())))
            .item<double>() == s.num_workers() - 1);
}

TEST_CASE(
    "multi-worker: a checkpoint keeps every worker's metric partials, accumulators and dropout "
    "streams",
    "[mpi]") {
  td::Strategy& s = strategy();
  const std::string dir = shared_temp_dir(s);
  // 4 micro-steps per update; the save after 6 steps is mid-accumulation (micro-step 2 of 4),
  // when every replica of every worker holds its own accumulator and metric partials.
  ResumableRun straight(s, 4);
  straight.train(12);
  const std::vector<std::vector<float>> expected = straight.weights();
  const double expected_loss = straight.loss_metric.result();
  {
    ResumableRun first(s, 4);
    first.train(6);
    td::CheckpointManager manager(first.checkpoint(), dir, {.max_to_keep = 2, .strategy = &s});
    REQUIRE(manager.save() == dir + "/ckpt-1.h5");  // global_step counts updates: 1
    const td::metrics::MetricState saved_state = first.loss_metric.combined_state();
    // The file is complete.
    Access::reduce_across_workers(s, td::ReduceOp::kSum, td::Tensor::scalar(1.0));
    if (s.is_chief()) {
      td::h5::File file = td::h5::File::open(dir + "/ckpt-1.h5");
      const td::h5::Group& root = file.root();
      CHECK(root.read_attr_int64("num_workers") == s.num_workers());
      CHECK(root.read_attr_int64("num_replicas") == s.num_replicas_in_sync());
      const td::h5::Group state = root.open_group("training_state");
      // One dropout row per replica of every worker, on stream 1 + its global id.
      const std::vector<uint64_t> rows = state.read_u64("rng/replica_state");
      REQUIRE(rows.size() == 4 * static_cast<size_t>(s.num_replicas_in_sync()));
      for (size_t g = 0; g < rows.size() / 4; ++g) CHECK(rows[g * 4 + 1] == g + 1);
      // The metric's count is every example of every worker: 6 steps x 32.
      CHECK(state.read_tensor("metrics/train_loss/count").to_vector<double>()[0] == 6.0 * 32);
      CHECK(state.read_tensor("metrics/train_loss/total").to_vector<double>()[0] ==
            Approx(saved_state.scalar("total")).epsilon(1e-12));
      CHECK(state.read_tensor("grad_accum/micro_step").to_vector<int64_t>()[0] == 2);
    }
  }
  Access::reduce_across_workers(s, td::ReduceOp::kSum, td::Tensor::scalar(1.0));

  ResumableRun resumed(s, 4);
  td::CheckpointManager manager(resumed.checkpoint(), dir, {.max_to_keep = 2, .strategy = &s});
  REQUIRE(manager.restore_or_initialize() == dir + "/ckpt-1.h5");
  CHECK(resumed.optimizer->micro_step() == 2);
  resumed.train(6);
  const std::vector<std::vector<float>> got = resumed.weights();
  REQUIRE(got.size() == expected.size());
  for (size_t i = 0; i < got.size(); ++i) {
    // Accumulators are summed in another order after the restore: not bitwise.
    const double difference = relative_difference(expected[i], got[i]);
    INFO("tensor " << i << ": relative difference " << difference);
    CHECK(difference <= 1e-5);
  }
  // The weights differ by rounding (above), so the later losses do too.
  CHECK(resumed.loss_metric.result() == Approx(expected_loss).epsilon(1e-6));
  CHECK(resumed.loss_metric.combined_state().scalar("count") == 12.0 * 32);
  // All done reading.
  Access::reduce_across_workers(s, td::ReduceOp::kSum, td::Tensor::scalar(1.0));
  if (s.is_chief()) std::filesystem::remove_all(dir);
}

// ---- faults (run by their own CTest entries; see tests/CMakeLists.txt) ------------------------

TEST_CASE("multi-worker: workers with different replica counts are refused by every worker",
          "[.uneven]") {
  // Started with a different TANDEM_TEST_LOCAL_REPLICAS per worker (mpirun's MPMD form).
  std::vector<td::Device> devices;
  for (int i = 0; i < local_replicas(); ++i) devices.push_back(td::Device::cpu(i));
  CHECK_THROWS_WITH(td::MultiWorkerMirroredStrategy(devices),
                    Catch::Contains("every worker needs the same number of local replicas") &&
                        Catch::Contains("has " + std::to_string(local_replicas())) &&
                        Catch::Contains("between 1 and 2"));
}

#include <chrono>
#include <csignal>
#include <iostream>
#include <thread>

TEST_CASE("multi-worker fault: a stuck or dead worker", "[.fault]") {
  const char* fault = std::getenv("TANDEM_TEST_FAULT");
  REQUIRE(fault != nullptr);
  td::Strategy& s = strategy();
  const std::string kind = fault;
  try {
    s.run([&](td::ReplicaContext& ctx) {
      if (s.worker_index() == 1) {
        if (kind == "kill") std::raise(SIGKILL);  // dies before the collective
        // Stuck: never arrives in time (mpirun ends it; TF_CONFIG tests give a shorter sleep).
        const char* stuck = std::getenv("TANDEM_TEST_STUCK_SECONDS");
        std::this_thread::sleep_for(std::chrono::seconds(stuck ? std::atoi(stuck) : 60));
      }
      ctx.all_reduce(td::ReduceOp::kSum, td::Tensor::ones({1000}));
    });
  } catch (const std::exception& e) {
    std::cout << "worker " << s.worker_index() << " raised: " << e.what() << std::endl;
    std::_Exit(3);  // non-zero: mpirun ends the job (and the stuck worker)
  }
  FAIL("the collective with a missing worker returned");
}

TEST_CASE("multi-worker fault: a worker stuck while the others' gradient buckets are in flight",
          "[.bucketfault]") {
  // Buckets of 1 KiB: the first step lays them out, the second reduces them during the
  // backward pass. At step 3 worker 1 stops before its backward pass; the others' buckets
  // are then in flight (on their communication threads) with no peer to meet.
  td::Strategy& s = strategy();
  s.set_communication_options({.bytes_per_pack = 1024, .first_bytes_per_pack = 1024});
  td::nn::Sequential model({td::nn::Dense(64, td::nn::Activation::kRelu), td::nn::Dense(4)});
  std::unique_ptr<td::optim::SGD> optimizer;
  {
    auto scope = s.scope();
    model.build({8});
    optimizer = std::make_unique<td::optim::SGD>(td::optim::SGD::Options{.learning_rate = 0.1});
  }
  const std::vector<td::Variable> variables = model.trainable_variables();
  td::Generator g(3);
  const td::Tensor x = td::Tensor::normal({4, 8}, g);
  for (int step = 1; step <= 3; ++step) {
    try {
      s.run([&](td::ReplicaContext& ctx) {
        td::GradientTape tape;
        const td::Tensor loss = td::ops::sum(model(x, true));
        if (step == 3 && s.worker_index() == 1)
          std::this_thread::sleep_for(std::chrono::seconds(60));  // stuck: never arrives
        optimizer->apply_gradients(ctx, tape.gradient(loss, variables), variables);
        if (step == 2 && ctx.local_replica_id() == 0) REQUIRE(ctx.bucketed_steps() == 1);
      });
    } catch (const std::exception& e) {
      std::cout << "worker " << s.worker_index() << " raised at step " << step << ": " << e.what()
                << std::endl;
      std::_Exit(3);  // non-zero: mpirun ends the job (and the stuck worker)
    }
  }
  FAIL("the step with a missing worker returned");
}

TEST_CASE("multi-worker: the chief's trace holds every worker's timeline, a process each",
          "[mpi]") {
  td::Strategy& s = strategy();
  const std::string dir = shared_temp_dir(s);
  const std::string file = dir + "/trace.json";
  constexpr int kSteps = 3;
  {
    td::profile::Profiler profiler(s, {.trace_file = file, .print_summaries = false});
    for (int i = 0; i < kSteps; ++i)
      s.run([](td::ReplicaContext& ctx) {
        ctx.all_reduce(td::ReduceOp::kSum, td::Tensor::ones({2000}));
      });
    const td::profile::Summary summary = profiler.end_epoch();
    CHECK(summary.steps == kSteps);
    CHECK(summary.per_replica.size() == static_cast<size_t>(s.num_local_replicas()));
    // Each stage counts what this replica passed in: the in-process reduction, with several
    // local replicas the cross-worker one (replica 0) and the local broadcast.
    CHECK(summary.per_replica[0].comm_bytes >= 2000 * 4);
  }  // every worker ends its profiler: the chief gathers the events and writes the file
  if (s.is_chief()) {
    std::ifstream in(file);
    REQUIRE(in.good());
    std::stringstream text;
    text << in.rdbuf();
    const tandem::detail::Json trace = tandem::detail::JsonReader::parse(text.str());
    std::vector<int> runs(static_cast<size_t>(s.num_workers()), 0);
    std::vector<std::string> names(static_cast<size_t>(s.num_workers()));
    for (const tandem::detail::Json& e : trace["traceEvents"].array) {
      const int pid = static_cast<int>(e["pid"].number);
      REQUIRE(pid >= 0);
      REQUIRE(pid < s.num_workers());
      if (e["ph"].string == "M" && e["name"].string == "process_name")
        names[static_cast<size_t>(pid)] = e["args"]["name"].string;
      // The loop's runs (tid 1): one per step in every worker.
      if (e["ph"].string == "X" && e["name"].string == "step" && e["tid"].number == 1)
        ++runs[static_cast<size_t>(pid)];
    }
    for (int w = 0; w < s.num_workers(); ++w) {
      CHECK(names[static_cast<size_t>(w)] == "worker " + std::to_string(w));
      CHECK(runs[static_cast<size_t>(w)] == kSteps);
    }
    std::filesystem::remove_all(dir);
  }
}

TEST_CASE(
    "multi-worker: an Inf on one worker's replica skips that update on every worker and "
    "halves every loss scale",
    "[mpi]") {
  td::Strategy& s = strategy();
  td::Generator g(/*seed=*/21);
  const int64_t steps = 6, batch = 16;
  const td::Tensor features = td::Tensor::normal({steps * batch, 8}, g);
  std::vector<int64_t> labels(static_cast<size_t>(steps * batch));
  for (size_t i = 0; i < labels.size(); ++i) labels[i] = static_cast<int64_t>(i % 4);
  auto data = s.distribute_dataset(
      td::data::from_tensor_slices({features, td::Tensor::from_vector(labels)}).batch(batch),
      {.auto_shard_policy = td::data::AutoShardPolicy::kData});
  td::nn::Sequential model({td::nn::Dense(16, td::nn::Activation::kRelu), td::nn::Dense(4)});
  std::unique_ptr<td::optim::Adam> adam;
  std::unique_ptr<td::optim::LossScaleOptimizer> lso;
  {
    auto scope = s.scope();
    model.set_seed(9);
    model.build({8});
    adam = std::make_unique<td::optim::Adam>(td::optim::Adam::Options{.learning_rate = 0.01});
    lso = std::make_unique<td::optim::LossScaleOptimizer>(*adam);
  }
  const std::vector<td::Variable> variables = model.trainable_variables();
  // The last replica of the last worker overflows at step 3 (0-based): only there is the
  // gradient not finite; the others see it in the sum.
  const int bad_replica = s.num_replicas_in_sync() - 1;
  int64_t step_index = 0;
  auto step = [&](td::ReplicaContext& ctx, const td::data::Batch& b) {
    td::GradientTape tape;
    td::Tensor loss = td::compute_average_loss(
        td::losses::sparse_categorical_crossentropy(b.labels(), model(b.features(), true), true),
        batch);
    if (step_index == 3 && ctx.replica_id_in_sync_group() == bad_replica)
      loss = loss * std::numeric_limits<double>::infinity();
    lso->apply_gradients(ctx, tape.gradient(lso->scale_loss(loss), variables), variables);
    return loss;
  };
  std::vector<std::vector<float>> before, after;  // every local copy, around step 3
  for (const auto& b : data) {
    if (step_index == 3)
      for (const td::Variable& v : variables)
        for (int r = 0; r < v.num_copies(); ++r) before.push_back(v.copy(r).to_vector<float>());
    s.run(step, b);
    if (step_index == 3) {
      for (const td::Variable& v : variables)
        for (int r = 0; r < v.num_copies(); ++r) after.push_back(v.copy(r).to_vector<float>());
      CHECK(lso->loss_scale() == 16384.0);
      CHECK(adam->iterations() == 3);  // the skipped update is not counted
    }
    ++step_index;
  }
  REQUIRE(step_index == steps);
  CHECK(after == before);  // the skipped update changed nothing, on any local replica
  CHECK(adam->iterations() == steps - 1);
  for (int r = 0; r < s.num_local_replicas(); ++r)
    CHECK(lso->dynamic_scale_variable().copy(r).item<double>() == 16384.0);
  // Every worker ends with the same weights, bit for bit.
  std::string mine;
  for (const td::Variable& v : variables) {
    const std::vector<float> values = v.copy(0).to_vector<float>();
    for (float f : values) CHECK(std::isfinite(f));
    mine.append(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float));
  }
  const std::vector<std::vector<char>> all =
      td::worker_group()->all_gather(std::vector<char>(mine.begin(), mine.end()), "weights");
  for (const std::vector<char>& other : all) CHECK(std::string(other.begin(), other.end()) == mine);
}
