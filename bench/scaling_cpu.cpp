// Scaling over CPU replicas: the sample MLP (784-256-128-10, Adam, fashion_mnist_mlp's train
// step) at one global batch on 1, 2 and 4 replicas, with the speed-up and scaling efficiency
// next to the step timeline's breakdown (profile::Profiler) for each count, and what recording
// the timeline costs: every round times a block of steps with the profiler off, then one with it
// on, and the table gives the medians over rounds. Replicas in separate processes (mpirun -np 2,
// workers from TF_CONFIG) beside 2 in one process: bench/scaling_workers.sh.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "tandem/tandem.h"
#include "timing.h"

namespace td = tandem;

namespace {

struct Options {
  int64_t global_batch = 256;
  std::vector<int> replicas{1, 2, 4};
  int steps = 100;  // per block
  int rounds = 5;
};

struct Row {
  int replicas = 0, threads = 0;
  double off_ms = 0, on_ms = 0;  // medians over rounds of each block's median step
  td::profile::Summary summary;  // of the last round's profiled block
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

Row run(int replicas, const Options& options) {
  td::MirroredStrategy strategy = td::MirroredStrategy::cpu(replicas);
  const int64_t per_replica = options.global_batch / replicas;
  td::Generator generator(/*seed=*/1);
  std::vector<td::Tensor> features, labels;
  for (int r = 0; r < replicas; ++r) {
    features.push_back(td::Tensor::uniform({per_replica, 28, 28}, generator, 0, 1));
    labels.push_back(
        td::ops::cast(td::Tensor::uniform({per_replica}, generator, 0, 10, td::DType::kFloat64),
                      td::DType::kInt64));
  }
  const td::PerReplica<td::Tensor> x(features), y(labels);

  auto scope = strategy.scope();
  const td::nn::Activation relu = td::nn::Activation::kRelu;
  td::nn::Sequential model(
      {td::nn::Flatten(), td::nn::Dense(256, relu), td::nn::Dense(128, relu), td::nn::Dense(10)});
  model.set_seed(42);
  model.build({28, 28});
  const std::vector<td::Variable> variables = model.trainable_variables();
  td::optim::Adam optimizer(
      {.learning_rate = 1e-3, .beta_1 = 0.9, .beta_2 = 0.999, .epsilon = 1e-7});
  optimizer.build(variables);
  const td::losses::SparseCategoricalCrossentropy loss_fn(
      {.from_logits = true, .reduction = td::losses::Reduction::kNone});
  const int64_t global_batch = options.global_batch;
  auto train_step = [&](td::ReplicaContext& ctx, const td::Tensor& xs, const td::Tensor& ys) {
    td::GradientTape tape;
    const td::Tensor logits = model(xs, /*training=*/true);
    const td::Tensor loss = td::compute_average_loss(loss_fn(ys, logits), global_batch);
    optimizer.apply_gradients(ctx, tape.gradient(loss, variables), variables);
    return loss;
  };
  auto block = [&] {
    std::vector<double> ms;
    for (int i = 0; i < options.steps; ++i) {
      const double start = td::bench::now_seconds();
      strategy.run(train_step, x, y);
      ms.push_back((td::bench::now_seconds() - start) * 1e3);
    }
    return median(ms);
  };

  Row row;
  row.replicas = replicas;
  row.threads = strategy.run([](td::ReplicaContext&) { return td::compute_threads(); }).values()[0];
  block();  // warm-up: primitives, allocator pools
  std::vector<double> off, on;
  for (int round = 0; round < options.rounds; ++round) {
    off.push_back(block());
    td::profile::Profiler profiler(strategy, {.trace_file = "", .print_summaries = false});
    on.push_back(block());
    row.summary = profiler.end_epoch();
  }
  row.off_ms = median(off);
  row.on_ms = median(on);
  return row;
}

std::string pct(double share) {
  char text[16];
  std::snprintf(text, sizeof(text), "%.0f%%", share * 100);
  return text;
}

}  // namespace

int main(int argc, char** argv) {
  Options options;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "bench_scaling_cpu: %s needs a value\n", arg.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (arg == "--batch") {
      options.global_batch = std::atoll(value().c_str());
    } else if (arg == "--steps") {
      options.steps = std::atoi(value().c_str());
    } else if (arg == "--rounds") {
      options.rounds = std::atoi(value().c_str());
    } else {
      std::fprintf(stderr,
                   "usage: %s [--batch GLOBAL (256)] [--steps PER_BLOCK (100)] [--rounds N (5)]\n",
                   argv[0]);
      return arg == "--help" ? 0 : 2;
    }
  }
  if (options.global_batch < 4 || options.steps < 1 || options.rounds < 1) {
    std::fprintf(stderr, "bench_scaling_cpu: needs --batch >= 4, --steps >= 1, --rounds >= 1\n");
    return 2;
  }

  std::vector<Row> rows;
  for (int replicas : options.replicas) rows.push_back(run(replicas, options));

  std::printf(
      "sample MLP 784-256-128-10, Adam, global batch %lld, %d cores; %d rounds of %d steps "
      "with the profiler off then on; step = median\n\n",
      static_cast<long long>(options.global_batch), td::hardware_cores(), options.rounds,
      options.steps);
  std::printf("%8s %7s %10s %8s %10s %8s | %8s %8s %6s %9s %6s %6s | %9s\n", "replicas", "threads",
              "samples/s", "step_ms", "speed-up", "effic.", "compute", "waiting", "comm",
              "optimizer", "input", "other", "profiling");
  const double base = rows.front().off_ms;
  for (const Row& r : rows) {
    const td::profile::Summary& s = r.summary;
    const double speedup = base / r.off_ms;
    std::printf("%8d %7d %10.0f %8.3f %9.2fx %8s | %8s %8s %6s %9s %6s %6s | %+8.1f%%\n",
                r.replicas, r.threads, static_cast<double>(options.global_batch) / r.off_ms * 1e3,
                r.off_ms, speedup, pct(speedup / r.replicas).c_str(), pct(s.compute_share).c_str(),
                pct(s.comm_wait_share).c_str(), pct(s.comm_data_share).c_str(),
                pct(s.optimizer_share).c_str(), pct(s.input_share).c_str(),
                pct(s.other_share + s.host_sync_share + s.checkpoint_share).c_str(),
                (r.on_ms / r.off_ms - 1) * 100);
  }
  std::printf(
      "\nspeed-up and efficiency against 1 replica at the same global batch; the middle "
      "columns are the profiler's shares of the step (waiting = for slower peers, comm = "
      "moving data); profiling = step time with the profiler on vs off\n");
  for (const Row& r : rows) {
    for (const td::profile::Advice& a : r.summary.advice)
      std::printf("%d replicas, advice (%s): %s\n", r.replicas, a.rule.c_str(), a.message.c_str());
    if (r.summary.advice.empty()) std::printf("%d replicas: no advice\n", r.replicas);
  }
  std::printf(
      "\nreproduce: cmake --build build --target bench_scaling_cpu && "
      "build/bench/bench_scaling_cpu --batch %lld --steps %d --rounds %d\n",
      static_cast<long long>(options.global_batch), options.steps, options.rounds);
  return 0;
}
