// The step timeline: synthetic runs with known answers (a slow input pipeline, a slow replica,
// a large all-reduce for little compute, a healthy run) against the profiler's figures and
// advice, and the Chrome trace it writes.
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tandem/core/internal/json.h"
#include "tandem/distribute/internal/strategy_access.h"
#include "tandem/tandem.h"

namespace td = tandem;
namespace profile = tandem::profile;
using tandem::detail::Json;
using tandem::detail::JsonReader;

namespace {

/// Sleeps `ms` and adds the time it really slept (later than asked on a busy machine) to
/// `slept_us`: what the test injected, to hold the profiler's figures against.
void sleep_ms(double ms, std::atomic<int64_t>* slept_us = nullptr) {
  const auto start = std::chrono::steady_clock::now();
  std::this_thread::sleep_for(std::chrono::microseconds(static_cast<int64_t>(ms * 1000)));
  if (slept_us != nullptr)
    *slept_us += std::chrono::duration_cast<std::chrono::microseconds>(
                     std::chrono::steady_clock::now() - start)
                     .count();
}

/// Mean milliseconds per step of what `slept_us` collected over `steps` steps.
double per_step_ms(const std::atomic<int64_t>& slept_us, int64_t steps) {
  return static_cast<double>(slept_us.load()) / 1000.0 / static_cast<double>(steps);
}

const profile::Advice* find_advice(const profile::Summary& s, const std::string& rule) {
  for (const profile::Advice& a : s.advice)
    if (a.rule == rule) return &a;
  return nullptr;
}

/// `steps` runs of `step` on `strategy` under a profiler; the summary of them.
template <typename Step>
profile::Summary profile_steps(td::Strategy& strategy, int steps, const Step& step) {
  profile::Profiler profiler(strategy, {.trace_file = "", .print_summaries = false});
  for (int i = 0; i < steps; ++i) strategy.run(step);
  return profiler.end_epoch();
}

}  // namespace

TEST_CASE("spans are recorded only while a profiler records", "[cpu][profile]") {
  REQUIRE_FALSE(profile::enabled());
  { const profile::Span span(profile::Phase::kOptimizer); }
  td::OneDeviceStrategy strategy;
  profile::Profiler profiler(strategy, {.trace_file = "", .print_summaries = false});
  REQUIRE(profile::enabled());
  { const profile::Span span(profile::Phase::kOptimizer); }
  const profile::Summary s = profiler.end_epoch();
  CHECK(s.steps == 0);
  REQUIRE(profiler.events().size() == 1);
  CHECK(profiler.events()[0].phase == profile::Phase::kOptimizer);
  CHECK(profiler.events()[0].end_ns >= profiler.events()[0].begin_ns);
  CHECK_THROWS_WITH(profile::Profiler(strategy), Catch::Contains("another profiler is recording"));
}

TEST_CASE("a slow input pipeline: the input wait is its share of the step, and input-bound advice",
          "[cpu][profile]") {
  // Each batch takes 40 ms to produce (no prefetch, so the loop waits for all of it) and each
  // step 40 ms to compute: the loop waits for data half of each step.
  constexpr double kProduceMs = 40, kComputeMs = 40;
  td::MirroredStrategy strategy = td::MirroredStrategy::cpu(2);
  const td::Tensor x = td::Tensor::zeros({96, 4}, td::DType::kFloat32);
  std::atomic<int64_t> produced_us{0};
  std::vector<std::atomic<int64_t>> computed_us(2);
  td::data::Dataset data = td::data::from_tensor_slices({x}).batch(8).map([&](td::data::Element e) {
    sleep_ms(kProduceMs, &produced_us);
    return e;
  });
  td::data::DistributedDataset batches = strategy.distribute_dataset(data);
  profile::Profiler profiler(strategy, {.trace_file = "", .print_summaries = false});
  for (const td::PerReplica<td::data::Batch>& batch : batches)
    strategy.run(
        [&](td::ReplicaContext& ctx, const td::data::Batch&) {
          sleep_ms(kComputeMs, &computed_us[static_cast<size_t>(ctx.local_replica_id())]);
        },
        batch);
  // The epoch ended inside the loop: the profiler summarised it by itself.
  REQUIRE(profiler.summaries().size() == 1);
  const profile::Summary& s = profiler.summaries()[0];
  CAPTURE(s.to_string());
  CHECK(s.steps == 12);
  CHECK(s.examples_per_step == Approx(8));
  // The injected times (as slept: 12 batches produced, the 13th call found the end), within
  // 10%, and so their shares of the step: half each on a quiet machine.
  const double produce_ms = per_step_ms(produced_us, 12);
  for (const profile::ReplicaBreakdown& r : s.per_replica) {
    CHECK(r.input_ms == Approx(produce_ms).epsilon(0.1));
    CHECK(r.compute_ms ==
          Approx(per_step_ms(computed_us[static_cast<size_t>(r.replica)], 12)).epsilon(0.1));
  }
  const double injected = produce_ms / s.step_ms_mean;
  CHECK(s.input_share == Approx(injected).epsilon(0.1));
  const profile::Advice* advice = find_advice(s, "input-bound");
  REQUIRE(advice != nullptr);
  CHECK(advice->figure == Approx(s.input_share));
  CHECK_THAT(advice->message, Catch::Contains("waited for data") && Catch::Contains("prefetch"));
  CHECK(find_advice(s, "straggler") == nullptr);
}

TEST_CASE("a slow replica is named as the straggler with the share the others waited",
          "[cpu][profile]") {
  // Replica 1 computes 60 ms per step, replica 0 30 ms: it is 100% slower, and replica 0 waits
  // 30 ms for it at the all-reduce, half of each step.
  td::MirroredStrategy strategy = td::MirroredStrategy::cpu(2);
  std::vector<std::atomic<int64_t>> slept_us(2);
  const profile::Summary s = profile_steps(strategy, 8, [&](td::ReplicaContext& ctx) {
    const int r = ctx.replica_id_in_sync_group();
    sleep_ms(r == 1 ? 60 : 30, &slept_us[static_cast<size_t>(r)]);
    ctx.all_reduce(td::ReduceOp::kSum, td::Tensor::ones({16}, td::DType::kFloat32));
  });
  CAPTURE(s.to_string());
  REQUIRE(s.steps == 8);
  const double fast = per_step_ms(slept_us[0], 8), slow = per_step_ms(slept_us[1], 8);
  const profile::Advice* advice = find_advice(s, "straggler");
  REQUIRE(advice != nullptr);
  CHECK_THAT(advice->message, Catch::StartsWith("replica 1 (cpu:1) was"));
  CHECK(advice->figure == Approx(slow / fast - 1).epsilon(0.1));
  CHECK(s.per_replica[0].comm_wait_ms == Approx(slow - fast).epsilon(0.1));
  CHECK(s.per_replica[1].comm_wait_ms < 0.1 * s.step_ms_mean);
  CHECK(find_advice(s, "communication-bound") == nullptr);
}

TEST_CASE("a large model's gradients for a tiny batch on 4 replicas: communication-bound",
          "[cpu][profile]") {
  td::MirroredStrategy strategy = td::MirroredStrategy::cpu(4);
  // 8M float gradients (32 MB) per replica, and a 2x8 by 8x8 product of compute.
  td::PerReplica<td::Tensor> gradients(
      std::vector<td::Tensor>(4, td::Tensor::ones({int64_t{1} << 23}, td::DType::kFloat32)));
  for (int r = 0; r < 4; ++r)
    gradients.values()[static_cast<size_t>(r)] = gradients.values()[0].clone();
  const td::Tensor a = td::Tensor::ones({2, 8}, td::DType::kFloat32);
  const td::Tensor b = td::Tensor::ones({8, 8}, td::DType::kFloat32);
  profile::Profiler profiler(strategy, {.trace_file = "", .print_summaries = false});
  for (int i = 0; i < 5; ++i)
    strategy.run(
        [&](td::ReplicaContext& ctx, const td::Tensor& g) {
          (void)td::ops::matmul(a, b);
          ctx.all_reduce(td::ReduceOp::kSum, g);
        },
        gradients);
  const profile::Summary s = profiler.end_epoch();
  CAPTURE(s.to_string());
  const profile::Advice* advice = find_advice(s, "communication-bound");
  REQUIRE(advice != nullptr);
  CHECK_THAT(advice->message, Catch::Contains("33.6 MB of gradients per replica") &&
                                  Catch::Contains("gradient accumulation"));
  CHECK(s.comm_data_share > 0.2);
  CHECK(s.per_replica[0].comm_bytes == Approx(4.0 * (1 << 23)));
}

TEST_CASE("a healthy run gets no advice", "[cpu][profile]") {
  td::MirroredStrategy strategy = td::MirroredStrategy::cpu(2);
  std::vector<std::atomic<int64_t>> slept_us(2);
  const profile::Summary s = profile_steps(strategy, 8, [&](td::ReplicaContext& ctx) {
    sleep_ms(40, &slept_us[static_cast<size_t>(ctx.local_replica_id())]);
    ctx.all_reduce(td::ReduceOp::kSum, td::Tensor::ones({16}, td::DType::kFloat32));
  });
  CAPTURE(s.to_string());
  CHECK(s.advice.empty());
  for (const profile::ReplicaBreakdown& r : s.per_replica)
    CHECK(r.compute_ms ==
          Approx(per_step_ms(slept_us[static_cast<size_t>(r.replica)], 8)).epsilon(0.1));
  CHECK(s.speedup > 1.5);  // about 2: both replicas compute the whole step
  CHECK_THAT(s.to_string(), Catch::Contains("advice: none"));
}

TEST_CASE("the trace follows the Chrome Trace Event Format, a track per replica and communicator",
          "[cpu][profile]") {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("tandem_trace_" + std::to_string(::getpid()));
  const std::string file = (dir / "trace.json").string();
  constexpr int kSteps = 4;
  {
    td::MirroredStrategy strategy = td::MirroredStrategy::cpu(2);
    const td::Tensor x = td::Tensor::zeros({8 * kSteps, 4}, td::DType::kFloat32);
    td::data::DistributedDataset batches =
        strategy.distribute_dataset(td::data::from_tensor_slices({x}).batch(8));
    profile::Profiler profiler(strategy, {.trace_file = file, .print_summaries = false});
    for (const auto& batch : batches)
      strategy.run(
          [](td::ReplicaContext& ctx, const td::data::Batch&) {
            ctx.all_reduce(td::ReduceOp::kSum, td::Tensor::ones({16}, td::DType::kFloat32));
          },
          batch);
  }
  std::ifstream in(file);
  REQUIRE(in.good());
  std::stringstream text;
  text << in.rdbuf();
  const Json trace = JsonReader::parse(text.str());
  REQUIRE(trace["traceEvents"].kind == Json::Kind::kArray);
  CHECK(trace["displayTimeUnit"].string == "ms");

  std::map<int, std::string> track_names;
  std::map<std::pair<int, std::string>, int> counts;  // (tid, name) -> complete events
  std::map<int, double> last_ts;
  for (const Json& e : trace["traceEvents"].array) {
    const std::string ph = e["ph"].string;
    REQUIRE(e["pid"].kind == Json::Kind::kNumber);
    REQUIRE(e["tid"].kind == Json::Kind::kNumber);
    const int tid = static_cast<int>(e["tid"].number);
    if (ph == "M") {
      if (e["name"].string == "thread_name") track_names[tid] = e["args"]["name"].string;
      continue;
    }
    REQUIRE((ph == "X" || ph == "i"));
    REQUIRE(e["ts"].kind == Json::Kind::kNumber);
    CHECK(e["cat"].string == "tandem");
    CHECK(e["ts"].number >= last_ts[tid]);  // monotone per track
    last_ts[tid] = e["ts"].number;
    if (ph == "X") {
      REQUIRE(e["dur"].kind == Json::Kind::kNumber);
      CHECK(e["dur"].number >= 0);
      ++counts[{tid, e["name"].string}];
    } else {
      CHECK(e["s"].string == "t");
      CHECK(e["name"].string == "epoch_end");
    }
  }
  // Named tracks: the loop, the input pipeline, each replica and each communicator.
  std::map<std::string, int> tid_of;
  for (const auto& [tid, name] : track_names) tid_of[name] = tid;
  for (const char* name : {"training loop", "input pipeline", "replica 0 (cpu:0)",
                           "replica 1 (cpu:1)", "communicator 0", "communicator 1"})
    REQUIRE(tid_of.count(name) == 1);
  for (const auto& [key, count] : counts) REQUIRE(track_names.count(key.first) == 1);
  // One event per phase per step: a run on the loop, a task per replica, one all-reduce each
  // (a wait to open it, the data, a wait to close it); one input wait per step plus the last,
  // which found the end of the data.
  CHECK(counts[{tid_of["training loop"], "step"}] == kSteps);
  CHECK(counts[{tid_of["input pipeline"], "input"}] == kSteps + 1);
  for (int r = 0; r < 2; ++r) {
    CHECK(counts[{tid_of["replica " + std::to_string(r) + " (cpu:" + std::to_string(r) + ")"],
                  "step"}] == kSteps);
    CHECK(counts[{tid_of["communicator " + std::to_string(r)], "comm_data"}] == kSteps);
    CHECK(counts[{tid_of["communicator " + std::to_string(r)], "comm_wait"}] == 2 * kSteps);
  }
  std::filesystem::remove_all(dir);
}

TEST_CASE("the optimizer's update is a phase of its own", "[cpu][profile]") {
  td::OneDeviceStrategy strategy;
  td::Variable w = td::make_variable("w", td::Tensor::ones({4}));
  td::optim::SGD sgd;
  profile::Profiler profiler(strategy, {.trace_file = "", .print_summaries = false});
  for (int i = 0; i < 3; ++i)
    strategy.run(
        [&](td::ReplicaContext& ctx) { sgd.apply_gradients(ctx, {td::Tensor::ones({4})}, {w}); });
  const profile::Summary s = profiler.end_epoch();
  REQUIRE(s.steps == 3);
  int optimizer_spans = 0;
  for (const profile::Event& e : profiler.events())
    optimizer_spans +=
        e.phase == profile::Phase::kOptimizer && e.track.kind == profile::TrackKind::kReplica;
  CHECK(optimizer_spans == 3);
  CHECK(s.per_replica[0].optimizer_ms > 0);
  CHECK(s.per_replica[0].compute_ms >= 0);
}

TEST_CASE(
    "the loss scale and skipped updates are in the summary and the trace, with advice when the "
    "scale "
    "sits at its floor",
    "[cpu][profile]") {
  const std::string file = (std::filesystem::temp_directory_path() /
                            ("tandem_loss_scale_trace_" + std::to_string(::getpid()) + ".json"))
                               .string();
  auto strategy = td::MirroredStrategy::cpu(2);
  td::Variable w;
  std::unique_ptr<td::optim::SGD> sgd;
  std::unique_ptr<td::optim::LossScaleOptimizer> lso;
  {
    auto scope = strategy.scope();
    w = td::make_variable("w", td::Tensor::ones({4}));
    sgd = std::make_unique<td::optim::SGD>();
    lso = std::make_unique<td::optim::LossScaleOptimizer>(
        *sgd, td::optim::LossScaleOptions{.initial_scale = 4, .dynamic_growth_steps = 3});
  }
  // Steps whose replica 1 overflows: the scale halves there and doubles after 3 finite ones.
  auto run = [&](const std::vector<bool>& overflow) {
    for (bool inf : overflow)
      strategy.run([&](td::ReplicaContext& ctx) {
        const bool bad = inf && ctx.replica_id_in_sync_group() == 1;
        td::Tensor g = td::Tensor::full({4}, bad ? std::numeric_limits<double>::infinity() : 1.0);
        lso->apply_gradients(ctx, {g}, {w});
      });
  };
  {
    profile::Profiler profiler(strategy, {.trace_file = file, .print_summaries = false});
    // 4 -> 2 (skipped), then 3 finite: 4; one more finite.
    run({true, false, false, false, false});
    const profile::Summary first = profiler.end_epoch();
    CHECK(first.loss_scale == 4.0);
    CHECK(first.loss_scale_updates == 5);
    CHECK(first.skipped_updates == 1);
    CHECK(find_advice(first, "loss-scale-floor") == nullptr);
    CHECK_THAT(first.to_string(),
               Catch::Contains("loss scale: 4 after the last update; 1 of 5 updates skipped"));
    // Every update overflows: 4 -> 2 -> 1 -> 0.5, all skipped.
    run({true, true, true});
    const profile::Summary second = profiler.end_epoch();
    CHECK(second.loss_scale == 0.5);
    CHECK(second.skipped_updates == 3);
    const profile::Advice* floor = find_advice(second, "loss-scale-floor");
    REQUIRE(floor != nullptr);
    CHECK(floor->figure == 1.0);  // every update of the epoch skipped
    CHECK_THAT(floor->message, Catch::Contains("fell to 0.5 and 3 of 3 updates were skipped"));
  }
  CHECK(lso->skipped_updates() == 4);
  std::ifstream in(file);
  std::stringstream text;
  text << in.rdbuf();
  std::filesystem::remove(file);
  const Json trace = JsonReader::parse(text.str());
  std::vector<double> scales;
  int skipped = 0;
  for (const Json& e : trace["traceEvents"].array) {
    if (e["ph"].string == "C" && e["name"].string == "loss scale")
      scales.push_back(e["args"]["scale"].number);
    if (e["name"].string == "skipped_update") ++skipped;
  }
  CHECK(scales == std::vector<double>{2, 2, 2, 4, 4, 2, 1, 0.5});
  CHECK(skipped == 4);
}

TEST_CASE("the speed-balanced split and the timeline read one compute figure per replica",
          "[cpu][profile]") {
  // Replica 1 computes longer, replica 0 waits for it at the all-reduce, both run the optimizer
  // and read a value back: compute is the task less all of that, one measure for both readers.
  td::MirroredStrategy strategy = td::MirroredStrategy::cpu(2);
  td::Variable w;
  std::unique_ptr<td::optim::SGD> sgd;
  {
    auto scope = strategy.scope();
    w = td::make_variable("w", td::Tensor::ones({64}));
    sgd = std::make_unique<td::optim::SGD>();
  }
  std::vector<std::atomic<int64_t>> slept_us(2);
  std::vector<double> stats_before(2);
  for (int r = 0; r < 2; ++r)
    stats_before[static_cast<size_t>(r)] =
        td::detail::StrategyAccess::communicator(strategy, r).stats().all_reduce_seconds;
  profile::Profiler profiler(strategy, {.trace_file = "", .print_summaries = false});
  std::vector<std::vector<double>> split_ms(2);  // what SplitPolicy::kBySpeed reads, per run
  constexpr int kSteps = 4;
  for (int step = 0; step < kSteps; ++step) {
    strategy.run([&](td::ReplicaContext& ctx) {
      const int r = ctx.replica_id_in_sync_group();
      sleep_ms(r == 1 ? 20 : 8, &slept_us[static_cast<size_t>(r)]);
      sgd->apply_gradients(ctx, {td::Tensor::ones({64})}, {w});
      (void)td::ops::sum(w.value()).item<float>();
    });
    const td::data::ReplicaTimes times = td::detail::StrategyAccess::replica_times(strategy);
    REQUIRE(times.compute_seconds.size() == 2);
    for (size_t r = 0; r < 2; ++r) split_ms[r].push_back(times.compute_seconds[r] * 1e3);
  }
  const profile::Summary s = profiler.end_epoch();
  REQUIRE(s.steps == kSteps);
  // Each replica task's span carries the figure the split read after that run.
  std::vector<std::vector<double>> trace_ms(2);
  for (const profile::Event& e : profiler.events())
    if (e.phase == profile::Phase::kStep && e.track.kind == profile::TrackKind::kReplica)
      trace_ms[static_cast<size_t>(e.track.index)].push_back(static_cast<double>(e.compute_ns) *
                                                             1e-6);
  for (size_t r = 0; r < 2; ++r) {
    INFO("replica " << r);
    REQUIRE(trace_ms[r].size() == static_cast<size_t>(kSteps));
    double mean = 0;
    for (int step = 0; step < kSteps; ++step) {
      CHECK(trace_ms[r][static_cast<size_t>(step)] ==
            Approx(split_ms[r][static_cast<size_t>(step)]).epsilon(1e-12));
      mean += split_ms[r][static_cast<size_t>(step)] / kSteps;
    }
    // The summary's compute is their mean, and it is the sleep (what the replica computed), not
    // the wait at the all-reduce nor the optimizer.
    CHECK(s.per_replica[r].compute_ms == Approx(mean).epsilon(1e-9));
    CHECK(s.per_replica[r].compute_ms >= per_step_ms(slept_us[r], kSteps));
    CHECK(s.per_replica[r].compute_ms < per_step_ms(slept_us[r], kSteps) + 5.0);
  }
  CHECK(s.per_replica[0].comm_wait_ms > 5.0);  // replica 0 waited for replica 1
  // Collective time has one measure too: the communicator's all_reduce_seconds is the time of
  // the collectives' spans the timeline adds up.
  for (int r = 0; r < 2; ++r) {
    const profile::ReplicaBreakdown& b = s.per_replica[static_cast<size_t>(r)];
    const double stats_ms =
        (td::detail::StrategyAccess::communicator(strategy, r).stats().all_reduce_seconds -
         stats_before[static_cast<size_t>(r)]) *
        1e3;
    CHECK(stats_ms ==
          Approx((b.comm_wait_ms - b.bucket_wait_ms + b.comm_data_ms) * kSteps).epsilon(1e-6));
  }
}

namespace {
std::atomic<int> g_pushes{0}, g_pops{0}, g_step_pushes{0};
}  // namespace

TEST_CASE("spans open and close named ranges in pairs while recording (NVTX with CUDA)",
          "[cpu][profile]") {
  static const profile::RangeHooks counting{[](const char* name) {
                                              ++g_pushes;
                                              if (std::string_view(name) == "step") ++g_step_pushes;
                                            },
                                            [] { ++g_pops; }};
  const profile::RangeHooks* saved = profile::range_hooks();
  profile::set_range_hooks(&counting);
  { const profile::Span off(profile::Phase::kOptimizer); }  // not recording: no range
  CHECK(g_pushes == 0);
  {
    td::MirroredStrategy strategy = td::MirroredStrategy::cpu(2);
    profile::Profiler profiler(strategy, {.trace_file = "", .print_summaries = false});
    // After the profiler, which installs NVTX's hooks in a CUDA build.
    const profile::RangeHooks* nvtx = profile::range_hooks();
    profile::set_range_hooks(&counting);
    for (int i = 0; i < 3; ++i)
      strategy.run([](td::ReplicaContext& ctx) {
        ctx.all_reduce(td::ReduceOp::kSum, td::Tensor::ones({4}));
      });
    profile::set_range_hooks(nvtx);
  }
  profile::set_range_hooks(saved);
  CHECK(g_pushes == g_pops);
  // Per run: the loop's and each replica's step, and the all-reduce's three parts per replica.
  CHECK(g_step_pushes == 3 * 3);
  CHECK(g_pushes == 3 * (3 + 2 * 3));
}

namespace {

/// A fresh folder under /tmp, removed at scope exit.
struct Scratch {
  Scratch() {
    std::string pattern = (std::filesystem::temp_directory_path() / "tandem_trace_XXXXXX").string();
    REQUIRE(::mkdtemp(pattern.data()) != nullptr);
    path = pattern;
  }
  ~Scratch() { std::filesystem::remove_all(path); }
  std::string file(const std::string& name) const { return (path / name).string(); }
  std::vector<std::string> entries() const {
    std::vector<std::string> out;
    for (const auto& entry : std::filesystem::directory_iterator(path))
      out.push_back(entry.path().filename().string());
    std::sort(out.begin(), out.end());
    return out;
  }
  std::filesystem::path path;
};

}  // namespace

TEST_CASE("the trace file is checked when the profiler starts, and never replaces a non-file",
          "[cpu][profile]") {
  Scratch scratch;
  td::MirroredStrategy strategy = td::MirroredStrategy::cpu(1);
  auto make = [&](const std::string& path) {
    profile::Profiler profiler(strategy, {.trace_file = path, .print_summaries = false});
  };
  // A folder that cannot be made (a file is in the way), a directory, a FIFO: refused at once,
  // naming the path, before any training.
  std::ofstream(scratch.file("plain")) << "x";
  CHECK_THROWS_WITH(make(scratch.file("plain/trace.json")),
                    Catch::Contains("cannot make the folder of the trace file \"" +
                                    scratch.file("plain/trace.json")));
  CHECK_THROWS_WITH(make(scratch.path.string()),
                    Catch::Contains("is a directory, not a regular file"));
  REQUIRE(::mkfifo(scratch.file("fifo").c_str(), 0600) == 0);
  CHECK_THROWS_WITH(
      make(scratch.file("fifo")),
      Catch::Contains("\"" + scratch.file("fifo") + "\" is a FIFO, not a regular file"));
  // A FIFO where a temporary file would go does not block the write at the end, and stays.
  REQUIRE(::mkfifo(scratch.file("trace.json.tmp").c_str(), 0600) == 0);
  const auto start = std::chrono::steady_clock::now();
  {
    profile::Profiler profiler(
        strategy, {.trace_file = scratch.file("trace.json"), .print_summaries = false});
    strategy.run([](td::ReplicaContext&) {});
  }
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(5));
  CHECK(std::filesystem::is_fifo(scratch.file("trace.json.tmp")));
  CHECK(std::filesystem::file_size(scratch.file("trace.json")) > 0);
  CHECK(scratch.entries() ==
        std::vector<std::string>{"fifo", "plain", "trace.json", "trace.json.tmp"});
}

TEST_CASE("a trace that cannot be written (a full disk) leaves no file behind", "[cpu][profile]") {
  // A child process with a file size limit of 64 bytes stands in for a full disk.
  Scratch scratch;
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::signal(SIGXFSZ, SIG_IGN);
    rlimit limit{64, 64};
    ::setrlimit(RLIMIT_FSIZE, &limit);
    {
      td::MirroredStrategy strategy = td::MirroredStrategy::cpu(1);
      profile::Profiler profiler(
          strategy, {.trace_file = scratch.file("trace.json"), .print_summaries = false});
      for (int i = 0; i < 20; ++i) strategy.run([](td::ReplicaContext&) {});
    }  // the write fails here: logged, and the temporary file removed
    std::_Exit(0);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  CHECK(WIFEXITED(status));
  CHECK(scratch.entries().empty());
}

TEST_CASE("the start-up line and the summaries say the memory a replica holds, sharded or not",
          "[cpu][profile]") {
  // Four variables of 1024, 1024, 256 and 256 float32 on 2 replicas with Adam (m, v).
  for (const int stage : {0, 1, 2}) {
    DYNAMIC_SECTION("shard_optimizer_state " << stage) {
      auto strategy = td::MirroredStrategy::cpu(2);
      std::vector<td::Variable> variables;
      std::unique_ptr<td::optim::Adam> adam;
      {
        auto scope = strategy.scope();
        const std::pair<const char*, int64_t> shapes[] = {
            {"w0", 1024}, {"w1", 1024}, {"w2", 256}, {"w3", 256}};
        for (const auto& [name, n] : shapes)
          variables.push_back(td::make_variable(name, td::Tensor::ones({n})));
        adam = std::make_unique<td::optim::Adam>(
            td::optim::Adam::Options{.shard_optimizer_state = stage});
        adam->build(variables);
      }
      const int64_t all = (1024 + 1024 + 256 + 256) * 4;
      // Replica 0 owns w0 (4 KiB), replica 1 w1, w2 and w3 (6 KiB): w1's start is the boundary
      // nearest the half. Sharded, each replica receives its own variables' sums alone.
      const int64_t most_owned = (1024 + 256 + 256) * 4;
      const td::optim::ReplicaMemory replica0 = adam->memory_of(0);
      CHECK(replica0.parameters == all);
      profile::Profiler profiler(
          strategy, {.trace_file = {}, .print_summaries = false, .optimizer = adam.get()});
      strategy.run([&](td::ReplicaContext& ctx) {
        std::vector<td::Tensor> grads;
        for (const td::Variable& v : variables) grads.push_back(td::Tensor::ones_like(v.value()));
        adam->apply_gradients(ctx, grads, variables);
      });
      const profile::Summary summary = profiler.end_epoch();
      CHECK(summary.shard_optimizer_state == stage);
      CHECK(summary.memory.parameters == all);
      CHECK(summary.memory.gradients == (stage == 0 ? all : most_owned));
      CHECK(summary.memory.optimizer_state == 2 * (stage == 0 ? all : most_owned));
      CHECK_THAT(summary.to_string(),
                 Catch::Contains("memory per replica (the most any holds): parameters 10.0 KiB") &&
                     Catch::Contains("(shard_optimizer_state " + std::to_string(stage) + ")"));
    }
  }
}
