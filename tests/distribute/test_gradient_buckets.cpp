// Gradient buckets reduced during the backward pass: bitwise the weights of the unbucketed
// all-reduce (1, 2, 4 replicas; SGD, Adam, clipping, accumulation), bucket boundaries (one,
// two, one per variable, a variable larger than a bucket, mixed dtypes), variables without a
// gradient, a replica failing with buckets in flight, buckets on the timeline while the
// backward pass still runs, and gradients sent as bfloat16 / float16 (with and without buckets).
#include <catch2/catch.hpp>
#include <chrono>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "support/compare.h"
#include "support/scoped_timeout.h"
#include "tandem/tandem.h"

namespace td = tandem;
namespace optim = tandem::optim;
using td::testing::ScopedTimeout;

namespace {

constexpr int64_t kBatch = 48;  // global batch per step
constexpr int64_t kFeatures = 8;
constexpr int64_t kClasses = 4;
constexpr int kSteps = 5;

struct Data {
  td::Tensor features, labels;
};

Data make_data(int steps) {
  td::Generator generator(/*seed=*/11);
  Data d;
  d.features = td::Tensor::normal({steps * kBatch, kFeatures}, generator);
  std::vector<int64_t> labels(static_cast<size_t>(steps * kBatch));
  for (size_t i = 0; i < labels.size(); ++i) labels[i] = static_cast<int64_t>((i * 7 + 3) % 4);
  d.labels = td::Tensor::from_vector(labels);
  return d;
}

enum class Kind { kSgd, kAdam, kAdamClipped };

std::unique_ptr<optim::Optimizer> make_optimizer(Kind kind, int accumulation) {
  switch (kind) {
    case Kind::kSgd:
      return std::make_unique<optim::SGD>(optim::SGD::Options{
          .learning_rate = 0.1, .momentum = 0.9, .gradient_accumulation_steps = accumulation});
    case Kind::kAdam:
      return std::make_unique<optim::Adam>(
          optim::Adam::Options{.learning_rate = 0.01, .gradient_accumulation_steps = accumulation});
    case Kind::kAdamClipped:
      return std::make_unique<optim::Adam>(
          optim::Adam::Options{.learning_rate = 0.01,
                               .global_clipnorm = 0.05,
                               .gradient_accumulation_steps = accumulation});
  }
  return nullptr;
}

struct Trained {
  std::vector<std::vector<float>> weights;  // replica 0's
  bool replicas_identical = true;
  size_t buckets = 0;                 // replica 0's layout at the end
  uint64_t bucketed_steps = 0;        // replica 0's
  std::vector<uint64_t> all_reduces;  // replica 0's all-reduce calls during each step
};

/// kSteps steps of an 8 -> 32 -> 32 -> 4 MLP (kernels of 1 KiB, 4 KiB and 512 B) on `replicas`
/// CPU replicas with `communication`.
Trained train(int replicas, td::CommunicationOptions communication, Kind kind, int accumulation,
              const Data& data, int steps = kSteps) {
  auto strategy = td::MirroredStrategy::cpu(replicas);
  strategy.set_communication_options(communication);
  td::nn::Sequential model({td::nn::Dense(32, td::nn::Activation::kRelu),
                            td::nn::Dense(32, td::nn::Activation::kRelu), td::nn::Dense(kClasses)});
  std::unique_ptr<optim::Optimizer> optimizer;
  {
    auto scope = strategy.scope();
    model.set_seed(3);
    model.build({kFeatures});
    optimizer = make_optimizer(kind, accumulation);
  }
  const std::vector<td::Variable> variables = model.trainable_variables();
  const int64_t per_replica = kBatch / replicas;
  Trained out;
  for (int s = 0; s < steps; ++s) {
    std::vector<td::Tensor> xs, ys;
    for (int r = 0; r < replicas; ++r) {
      const int64_t begin = s * kBatch + r * per_replica;
      xs.push_back(data.features.slice(begin, begin + per_replica));
      ys.push_back(data.labels.slice(begin, begin + per_replica));
    }
    uint64_t calls_before = 0;
    strategy.run(
        [&](td::ReplicaContext& ctx, const td::Tensor& x, const td::Tensor& y) {
          if (ctx.replica_id_in_sync_group() == 0)
            calls_before = ctx.communicator().stats().all_reduce;
          td::GradientTape tape;
          const td::Tensor logits = model(x, /*training=*/true);
          const td::Tensor loss = td::compute_average_loss(
              td::losses::sparse_categorical_crossentropy(y, logits, /*from_logits=*/true), kBatch);
          optimizer->apply_gradients(ctx, tape.gradient(loss, variables), variables);
          if (ctx.replica_id_in_sync_group() == 0) {
            out.buckets = ctx.num_gradient_buckets();
            out.bucketed_steps = ctx.bucketed_steps();
            out.all_reduces.push_back(ctx.communicator().stats().all_reduce - calls_before);
          }
        },
        td::PerReplica<td::Tensor>(xs), td::PerReplica<td::Tensor>(ys));
  }
  for (const td::Variable& v : variables) {
    out.weights.push_back(v.copy(0).to_vector<float>());
    for (int r = 1; r < v.num_copies(); ++r)
      out.replicas_identical =
          out.replicas_identical && v.copy(r).to_vector<float>() == out.weights.back();
  }
  return out;
}

constexpr td::CommunicationOptions kOff{.bytes_per_pack = 0, .first_bytes_per_pack = 0};
// Buckets close once they hold their size: {kernel 2}, {bias 2, kernel 1}, {bias 1, kernel 0},
// {bias 0} (see the bucket boundaries below).
constexpr td::CommunicationOptions kSmall{.bytes_per_pack = 1024, .first_bytes_per_pack = 1};

}  // namespace

TEST_CASE("gradient buckets: CPU replicas in one process start with them off",
          "[cpu][distribute][buckets]") {
  // Their all-reduces spin in-process: a communication thread would take a core from the
  // compute (docs/performance.md). Workers over Gloo start with them on (tests/mpi).
  for (int replicas : {1, 2}) {
    td::MirroredStrategy strategy = td::MirroredStrategy::cpu(replicas);
    CAPTURE(replicas);
    CHECK(strategy.communication_options().bytes_per_pack == 0);
    strategy.set_communication_options({});
    CHECK(strategy.communication_options().bytes_per_pack == int64_t{25} << 20);
    CHECK(strategy.communication_options().first_bytes_per_pack == int64_t{1} << 20);
  }
}

TEST_CASE("gradient buckets: the weights of the unbucketed all-reduce, bit for bit",
          "[cpu][distribute][buckets]") {
  constexpr int kAccumulatedSteps = 10;  // 3 updates of 3 micro-steps, and one micro-step
  const Data data = make_data(kAccumulatedSteps);
  for (Kind kind : {Kind::kSgd, Kind::kAdam, Kind::kAdamClipped}) {
    for (int accumulation : {1, 3}) {
      for (int replicas : {1, 2, 4}) {
        INFO("optimizer " << static_cast<int>(kind) << ", accumulation " << accumulation << ", "
                          << replicas << " replicas");
        const int steps = accumulation == 1 ? kSteps : kAccumulatedSteps;
        const Trained plain = train(replicas, kOff, kind, accumulation, data, steps);
        const Trained bucketed = train(replicas, kSmall, kind, accumulation, data, steps);
        CHECK(plain.replicas_identical);
        CHECK(bucketed.replicas_identical);
        CHECK(bucketed.weights == plain.weights);
        CHECK(plain.buckets == 0);
        if (replicas == 1) {
          CHECK(bucketed.bucketed_steps == 0);  // nothing to reduce
        } else if (accumulation == 1) {
          // Laid out at step 1, used from step 2 on.
          CHECK(bucketed.buckets == 4);
          CHECK(bucketed.bucketed_steps == static_cast<uint64_t>(kSteps - 1));
        } else {
          // Only the last micro-step of each update reduces, its buckets holding accumulator +
          // gradient: laid out at step 3, used at steps 6 and 9; no bucket goes out at the
          // other micro-steps (step 10 included).
          CHECK(bucketed.buckets == 4);
          CHECK(bucketed.bucketed_steps == 2);
          for (int s = 0; s < steps; ++s) {
            CAPTURE(s + 1);
            const bool last = (s + 1) % accumulation == 0;
            CHECK((bucketed.all_reduces[static_cast<size_t>(s)] > 0) == last);
            if (s + 1 >= 6 && last) CHECK(bucketed.all_reduces[static_cast<size_t>(s)] == 4);
          }
        }
      }
    }
  }
}

TEST_CASE("gradient buckets: one, two and one per variable, a variable larger than a bucket",
          "[cpu][distribute][buckets]") {
  const Data data = make_data(kSteps);
  const Trained plain = train(2, kOff, Kind::kAdam, 1, data);
  struct Case {
    const char* name;
    td::CommunicationOptions options;
    size_t buckets;
  };
  // Gradients become final last layer first: kernel 2 (512 B) and bias 2 (16 B), then kernel 1
  // (4 KiB) and bias 1 (128 B), then kernel 0 (1 KiB) and bias 0 (128 B): 5,904 bytes. A
  // bucket closes once it holds its size.
  for (const Case& c : {
           Case{"everything in one bucket",
                {.bytes_per_pack = 1 << 20, .first_bytes_per_pack = 1 << 20},
                1},
           // {kernel 2, bias 2, kernel 1}, {the rest}
           Case{"a small first bucket, then one",
                {.bytes_per_pack = 1 << 20, .first_bytes_per_pack = 600},
                2},
           Case{"one byte: a bucket per variable",
                {.bytes_per_pack = 1, .first_bytes_per_pack = 1},
                6},
           // {kernel 2}, {bias 2, kernel 1}, {bias 1, kernel 0}, {bias 0}
           Case{"1 KiB: the 4 KiB kernel overfills its bucket", kSmall, 4},
           // {kernel 2, bias 2, kernel 1}, {bias 1, kernel 0, bias 0}
           Case{"2 KiB after 600 bytes", {.bytes_per_pack = 2048, .first_bytes_per_pack = 600}, 2},
       }) {
    INFO(c.name);
    const Trained bucketed = train(2, c.options, Kind::kAdam, 1, data);
    CHECK(bucketed.buckets == c.buckets);
    CHECK(bucketed.bucketed_steps == static_cast<uint64_t>(kSteps - 1));
    CHECK(bucketed.weights == plain.weights);
  }
}

TEST_CASE("gradient buckets: float32 and float64 variables go to buckets of their own dtype",
          "[cpu][distribute][buckets]") {
  auto run = [](td::CommunicationOptions options) {
    auto strategy = td::MirroredStrategy::cpu(2);
    strategy.set_communication_options(options);
    td::Variable w32, w64;
    {
      auto scope = strategy.scope();
      td::Generator g(5);
      w32 = td::make_variable("w32", td::Tensor::normal({4, 3}, g));
      w64 =
          td::make_variable("w64", td::ops::cast(td::Tensor::normal({3}, g), td::DType::kFloat64));
    }
    auto scope = strategy.scope();
    td::optim::SGD optimizer({.learning_rate = 0.05, .momentum = 0.5});
    size_t buckets = 0;
    for (int step = 0; step < 4; ++step) {
      strategy.run([&](td::ReplicaContext& ctx) {
        td::Generator g(static_cast<uint64_t>(100 + step * 2 + ctx.replica_id_in_sync_group()));
        const td::Tensor x = td::Tensor::normal({5, 4}, g);
        td::GradientTape tape;
        const td::Tensor h = td::ops::matmul(x, w32.value());  // [5, 3] float32
        const td::Tensor h64 = td::ops::mul(td::ops::cast(h, td::DType::kFloat64), w64.value());
        const td::Tensor loss =
            td::ops::cast(td::ops::sum(td::ops::mul(h64, h64)), td::DType::kFloat32) / 10.0;
        optimizer.apply_gradients(ctx, tape.gradient(loss, {w32, w64}), {w32, w64});
        if (ctx.replica_id_in_sync_group() == 0) buckets = ctx.num_gradient_buckets();
      });
    }
    return std::make_pair(
        buckets, std::make_pair(w32.copy(1).to_vector<float>(), w64.copy(1).to_vector<double>()));
  };
  const auto plain = run(kOff);
  const auto bucketed = run({.bytes_per_pack = 1 << 20, .first_bytes_per_pack = 1 << 20});
  CHECK(bucketed.first == 2);  // one bucket per dtype, though both would fit in one
  CHECK(bucketed.second == plain.second);
}

TEST_CASE("gradient buckets: variables without a gradient", "[cpu][distribute][buckets]") {
  const ScopedTimeout timeout(std::chrono::milliseconds(3000));
  auto strategy = td::MirroredStrategy::cpu(2);
  strategy.set_communication_options({.bytes_per_pack = 64, .first_bytes_per_pack = 64});
  td::Variable used, unused;
  {
    auto scope = strategy.scope();
    used = td::make_variable("used", td::Tensor::full({6}, 1.0));
    unused = td::make_variable("unused", td::Tensor::full({6}, 2.0));
  }
  auto scope = strategy.scope();
  td::optim::SGD optimizer({.learning_rate = 0.1});
  auto step = [&](bool use_both) {
    strategy.run([&](td::ReplicaContext& ctx) {
      td::GradientTape tape;
      td::Tensor loss = td::ops::sum(td::ops::mul(used.value(), used.value()));
      if (use_both) loss = loss + td::ops::sum(unused.value());
      optimizer.apply_gradients(ctx, tape.gradient(loss, {used, unused}), {used, unused});
    });
  };
  SECTION("a variable never used keeps its value; the others are bucketed") {
    for (int s = 0; s < 4; ++s) step(false);
    CHECK(unused.copy(0).to_vector<float>() == std::vector<float>(6, 2.0f));
    CHECK(used.copy(0).to_vector<float>() != std::vector<float>(6, 1.0f));
    CHECK(used.copy(0).to_vector<float>() == used.copy(1).to_vector<float>());
  }
  SECTION("a variable that stops getting a gradient: a clear error naming it, no hang") {
    step(true);
    step(true);
    const auto start = std::chrono::steady_clock::now();
    CHECK_THROWS_WITH(step(false), Catch::Contains("source 1") &&
                                       Catch::Contains("has no gradient now") &&
                                       Catch::Contains("bytes_per_pack = 0"));
    CHECK(std::chrono::steady_clock::now() - start < std::chrono::milliseconds(2500));
    // The strategy stays usable: the next steps lay the buckets out again.
    step(false);
    step(false);
    CHECK(used.copy(0).to_vector<float>() == used.copy(1).to_vector<float>());
  }
}

TEST_CASE("gradient buckets: a replica that fails while buckets are in flight",
          "[cpu][distribute][buckets][faults]") {
  const ScopedTimeout timeout(std::chrono::milliseconds(3000));
  const Data data = make_data(8);
  auto strategy = td::MirroredStrategy::cpu(4);
  strategy.set_communication_options(kSmall);
  td::nn::Sequential model({td::nn::Dense(32, td::nn::Activation::kRelu), td::nn::Dense(kClasses)});
  std::unique_ptr<optim::Optimizer> optimizer;
  {
    auto scope = strategy.scope();
    model.build({kFeatures});
    optimizer = make_optimizer(Kind::kAdam, 1);
  }
  const std::vector<td::Variable> variables = model.trainable_variables();
  auto step = [&](int s, int failing) {
    strategy.run([&](td::ReplicaContext& ctx) {
      const int64_t begin = s * kBatch + ctx.replica_id_in_sync_group() * (kBatch / 4);
      td::GradientTape tape;
      const td::Tensor logits = model(data.features.slice(begin, begin + kBatch / 4), true);
      const td::Tensor loss =
          td::compute_average_loss(td::losses::sparse_categorical_crossentropy(
                                       data.labels.slice(begin, begin + kBatch / 4), logits, true),
                                   kBatch);
      std::vector<td::Tensor> grads = tape.gradient(loss, variables);
      // The buckets of this backward pass are in flight now.
      if (ctx.replica_id_in_sync_group() == failing) throw std::runtime_error("replica died");
      // The others meet once more before they update: the failure releases them here, so no
      // replica applies this step (without it, a replica whose buckets completed before the
      // abort reached it would update alone).
      ctx.all_reduce(td::ReduceOp::kSum, td::Tensor::ones({1}));
      optimizer->apply_gradients(ctx, grads, variables);
    });
  };
  step(0, -1);
  step(1, -1);
  const auto start = std::chrono::steady_clock::now();
  CHECK_THROWS_WITH(step(2, 2), Catch::Contains("replica 2") && Catch::Contains("replica died"));
  // Released at once by the failure, not by the timeout.
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::milliseconds(2500));
  step(3, -1);
  step(4, -1);
  for (const td::Variable& v : variables)
    for (int r = 1; r < 4; ++r) CHECK(v.copy(r).to_vector<float>() == v.copy(0).to_vector<float>());
}

TEST_CASE("gradient buckets: all-reduces start on the communicator track during the backward pass",
          "[cpu][distribute][buckets][profile]") {
  const Data data = make_data(6);
  auto strategy = td::MirroredStrategy::cpu(2);
  strategy.set_communication_options({.bytes_per_pack = 1, .first_bytes_per_pack = 1});
  td::nn::Sequential model({td::nn::Dense(2048, td::nn::Activation::kRelu),
                            td::nn::Dense(2048, td::nn::Activation::kRelu),
                            td::nn::Dense(kClasses)});
  std::unique_ptr<optim::Optimizer> optimizer;
  {
    auto scope = strategy.scope();
    model.build({kFeatures});
    optimizer = make_optimizer(Kind::kSgd, 1);
  }
  const std::vector<td::Variable> variables = model.trainable_variables();
  std::vector<int64_t> step_start(6, 0), backward_end(6, 0);  // replica 0's, per step
  td::profile::Profiler profiler(strategy, {.trace_file = "", .print_summaries = false});
  for (int s = 0; s < 6; ++s) {
    strategy.run([&](td::ReplicaContext& ctx) {
      if (ctx.replica_id_in_sync_group() == 0)
        step_start[static_cast<size_t>(s)] = td::profile::now_ns();
      const int64_t begin = s * kBatch + ctx.replica_id_in_sync_group() * (kBatch / 2);
      td::GradientTape tape;
      const td::Tensor logits = model(data.features.slice(begin, begin + kBatch / 2), true);
      const td::Tensor loss =
          td::compute_average_loss(td::losses::sparse_categorical_crossentropy(
                                       data.labels.slice(begin, begin + kBatch / 2), logits, true),
                                   kBatch);
      std::vector<td::Tensor> grads = tape.gradient(loss, variables);
      if (ctx.replica_id_in_sync_group() == 0)
        backward_end[static_cast<size_t>(s)] = td::profile::now_ns();
      optimizer->apply_gradients(ctx, grads, variables);
    });
  }
  const td::profile::Summary summary = profiler.end_epoch();
  // The summary keeps the buckets' all-reduces out of the step's breakdown (they overlapped
  // the compute) and reports them beside it, with the replica's wait for them.
  REQUIRE(summary.per_replica.size() == 2);
  const td::profile::ReplicaBreakdown& replica0 = summary.per_replica[0];
  CHECK(replica0.comm_overlapped_ms > 0);
  CHECK(replica0.bucket_wait_ms <= replica0.comm_wait_ms);
  CHECK(replica0.comm_bytes > 16.0 * 1024 * 1024);  // the 16 MiB kernel's bucket, every step
  CHECK_THAT(summary.to_string(), Catch::Contains("gradient buckets: replica 0's all-reduces"));
  // From step 2 on, replica 0's communicator track has all-reduces that began before its
  // backward pass returned (the first buckets went out while later gradients were computed;
  // the 16 MiB kernel of the middle layer is computed after the last layer's bucket left).
  int steps_overlapping = 0;
  for (int s = 1; s < 6; ++s) {
    const int64_t start = step_start[static_cast<size_t>(s)];
    const int64_t end = backward_end[static_cast<size_t>(s)];
    bool early = false;
    for (const td::profile::Event& e : profiler.events())
      if (e.track.kind == td::profile::TrackKind::kCommunicator && e.track.index == 0 &&
          e.begin_ns > start && e.begin_ns < end)
        early = true;
    steps_overlapping += early ? 1 : 0;
  }
  CHECK(steps_overlapping == 5);
}

namespace {

/// bits of the float32 value `x` rounded to T and back.
template <typename T>
float rounded(float x) {
  return static_cast<float>(T(x));
}

template <typename T>
void check_compressed_sum(int replicas, td::GradientCompression compression, int64_t bucket) {
  INFO(replicas << " replicas, " << td::to_string(compression) << ", buckets of " << bucket
                << " bytes");
  constexpr int64_t kN = 64;
  auto strategy = td::MirroredStrategy::cpu(replicas);
  strategy.set_communication_options({.bytes_per_pack = bucket,
                                      .first_bytes_per_pack = bucket,
                                      .gradient_compression = compression});
  td::Variable w;
  std::unique_ptr<td::optim::SGD> optimizer;
  {
    auto scope = strategy.scope();
    w = td::make_variable("w", td::Tensor::zeros({kN}));
    optimizer = std::make_unique<td::optim::SGD>(td::optim::SGD::Options{.learning_rate = 1.0});
  }
  // Replica r's gradient: values no 16-bit type holds exactly.
  auto gradient = [](int r) {
    std::vector<float> c(kN);
    for (int64_t i = 0; i < kN; ++i)
      c[static_cast<size_t>(i)] = (i % 2 == 0 ? 1.0f : -1.0f) * 0.1f * static_cast<float>(i + 1) *
                                  (1.0f + 0.37f * static_cast<float>(r)) / 3.0f;
    return c;
  };
  // Each replica's value rounded to T, the sum added in float32 in replica order, rounded once.
  std::vector<float> sum(kN);
  for (int64_t i = 0; i < kN; ++i) {
    float s = 0.0f;
    for (int r = 0; r < replicas; ++r) s += rounded<T>(gradient(r)[static_cast<size_t>(i)]);
    sum[static_cast<size_t>(i)] = rounded<T>(s);
  }
  uint64_t bytes = 0;  // replica 0's all-reduced bytes in the second step
  uint64_t bucketed = 0;
  for (int step = 0; step < 2; ++step) {
    strategy.run([&](td::ReplicaContext& ctx) {
      const int r = ctx.replica_id_in_sync_group();
      const uint64_t before = ctx.communicator().stats().bytes_all_reduced;
      const td::Tensor c = td::Tensor::from_vector(gradient(r));
      td::GradientTape tape;
      const td::Tensor loss = td::ops::sum(td::ops::mul(w.value(), c));  // gradient: c
      optimizer->apply_gradients(ctx, tape.gradient(loss, {w}), {w});
      if (r == 0) {
        bytes = ctx.communicator().stats().bytes_all_reduced - before;
        bucketed = ctx.bucketed_steps();
      }
    });
  }
  CHECK(bytes == kN * sizeof(T));  // half of float32's
  CHECK(bucketed == (bucket > 0 ? 1u : 0u));
  // Two steps of SGD with learning rate 1 from 0: -2 x the sum, exactly.
  std::vector<float> expected(kN);
  for (size_t i = 0; i < expected.size(); ++i) expected[i] = -2.0f * sum[i];
  for (int r = 0; r < replicas; ++r) CHECK(w.copy(r).to_vector<float>() == expected);
}

}  // namespace

TEST_CASE(
    "gradient compression: each replica's gradient rounded to 16 bits, their sum added in "
    "float32 and rounded once, half the bytes",
    "[cpu][distribute][compression]") {
  for (int replicas : {2, 4}) {
    for (int64_t bucket : {int64_t{0}, int64_t{1} << 20}) {
      check_compressed_sum<td::bfloat16>(replicas, td::GradientCompression::kBFloat16, bucket);
      check_compressed_sum<td::float16>(replicas, td::GradientCompression::kFloat16, bucket);
    }
  }
}

TEST_CASE(
    "gradient compression: training with buckets gives the bits of training without, close to "
    "float32",
    "[cpu][distribute][compression]") {
  constexpr int kAccumulatedSteps = 10;
  const Data data = make_data(kAccumulatedSteps);
  for (td::GradientCompression compression :
       {td::GradientCompression::kBFloat16, td::GradientCompression::kFloat16}) {
    td::CommunicationOptions off = kOff;
    td::CommunicationOptions small = kSmall;
    off.gradient_compression = small.gradient_compression = compression;
    for (Kind kind : {Kind::kSgd, Kind::kAdamClipped}) {
      for (int accumulation : {1, 3}) {
        for (int replicas : {2, 4}) {
          INFO(td::to_string(compression)
               << ", optimizer " << static_cast<int>(kind) << ", accumulation " << accumulation
               << ", " << replicas << " replicas");
          const int steps = accumulation == 1 ? kSteps : kAccumulatedSteps;
          const Trained reference = train(replicas, kOff, kind, accumulation, data, steps);
          const Trained plain = train(replicas, off, kind, accumulation, data, steps);
          const Trained bucketed = train(replicas, small, kind, accumulation, data, steps);
          CHECK(plain.replicas_identical);
          CHECK(bucketed.replicas_identical);
          CHECK(bucketed.bucketed_steps == (accumulation == 1 ? kSteps - 1u : 2u));
          CHECK(bucketed.weights == plain.weights);
          CHECK(plain.weights != reference.weights);  // the rounding shows
          // Adam's normalised steps carry the gradients' relative rounding (2^-9 for
          // bfloat16, 2^-12 for float16) into the weights, most where gradients are small.
          const double tolerance =
              compression == td::GradientCompression::kBFloat16 ? 3e-2 : 1.5e-2;
          for (size_t v = 0; v < plain.weights.size(); ++v) {
            const double difference =
                td::testing::relative_difference(reference.weights[v], plain.weights[v]);
            INFO("variable " << v << ": relative difference " << difference);
            CHECK(difference <= tolerance);
          }
        }
      }
    }
  }
}

TEST_CASE("gradient compression: an unknown value is refused, naming it",
          "[cpu][distribute][compression]") {
  auto strategy = td::MirroredStrategy::cpu(2);
  CHECK_THROWS_WITH(strategy.set_communication_options(
                        {.gradient_compression = static_cast<td::GradientCompression>(7)}),
                    Catch::Contains("gradient_compression 7"));
  CHECK(strategy.communication_options().gradient_compression == td::GradientCompression::kNone);
}
