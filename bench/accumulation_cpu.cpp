// Gradient accumulation on CPU replicas: time per sample and the share of it spent in the
// gradient all-reduce, for N = 1, 2, 4, 8 micro-steps per update. The model is an MLP large
// enough that the all-reduce matters (784-2048-2048-10, 5.8M parameters, 23 MB of gradients per
// replica); each micro-step feeds --per-replica-batch examples to every replica.
//
//   bench_accumulation_cpu [--replicas 4] [--per-replica-batch 16] [--updates 4] [--rounds 3]
//
// "all-reduce" is the wall time each replica spends inside all_reduce calls (the communicator's
// own counter, CollectiveStats::all_reduce_seconds), waiting for its peers included, averaged
// over replicas. Rounds interleave the N values so that machine noise hits all of them; the
// table gives medians over rounds.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "tandem/tandem.h"
#include "timing.h"

namespace td = tandem;
namespace tb = tandem::bench;

namespace {

struct Options {
  int replicas = 4;
  int64_t per_replica_batch = 16;
  int updates = 4;  // measured updates per N (after one warm-up update)
  int rounds = 3;
};

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

struct Sample {
  double seconds = 0;             // wall time of the measured micro-steps
  double all_reduce_seconds = 0;  // mean over replicas of the time inside all_reduce
  uint64_t all_reduce_calls = 0;  // replica 0's calls during the measured micro-steps
  int64_t samples = 0;            // examples processed in the measured micro-steps
};

class Bench {
 public:
  explicit Bench(const Options& options)
      : options_(options), strategy_(td::MirroredStrategy::cpu(options.replicas)) {
    auto scope = strategy_.scope();
    model_ = std::make_unique<td::nn::Sequential>(std::initializer_list<td::nn::Module>{
        td::nn::Dense(2048, td::nn::Activation::kRelu),
        td::nn::Dense(2048, td::nn::Activation::kRelu), td::nn::Dense(10)});
    model_->set_seed(1);
    model_->build({784});
    td::Generator g(7);
    const int64_t rows = options.per_replica_batch;
    for (int r = 0; r < options.replicas; ++r) {
      features_.push_back(td::Tensor::normal({rows, 784}, g));
      std::vector<int64_t> labels(static_cast<size_t>(rows));
      for (size_t i = 0; i < labels.size(); ++i) labels[i] = static_cast<int64_t>((i * 7 + r) % 10);
      labels_.push_back(td::Tensor::from_vector(labels));
    }
  }

  int64_t parameters() const {
    int64_t n = 0;
    for (const td::Variable& v : model_->trainable_variables()) n += v.shape().numel();
    return n;
  }

  Sample measure(int steps) {
    std::unique_ptr<td::optim::Adam> optimizer;
    {
      auto scope = strategy_.scope();
      optimizer = std::make_unique<td::optim::Adam>(
          td::optim::Adam::Options{.learning_rate = 1e-4, .gradient_accumulation_steps = steps});
      optimizer->build(model_->trainable_variables());
    }
    const std::vector<td::Variable> variables = model_->trainable_variables();
    const int64_t global_micro_batch = options_.per_replica_batch * options_.replicas;
    std::vector<td::collectives::CollectiveStats> stats(static_cast<size_t>(options_.replicas));
    auto step = [&](td::ReplicaContext& ctx, const td::Tensor& x, const td::Tensor& y) {
      td::GradientTape tape;
      const td::Tensor loss = td::compute_average_loss(
          td::losses::sparse_categorical_crossentropy(y, (*model_)(x, true), true),
          global_micro_batch);
      optimizer->apply_gradients(ctx, tape.gradient(loss, variables), variables);
      stats[static_cast<size_t>(ctx.replica_id_in_sync_group())] = ctx.communicator().stats();
    };
    const td::PerReplica<td::Tensor> xs(features_), ys(labels_);
    for (int s = 0; s < steps; ++s) strategy_.run(step, xs, ys);  // warm-up update
    const std::vector<td::collectives::CollectiveStats> before = stats;
    const double start = tb::now_seconds();
    for (int s = 0; s < steps * options_.updates; ++s) strategy_.run(step, xs, ys);
    Sample out;
    out.seconds = tb::now_seconds() - start;
    for (size_t r = 0; r < stats.size(); ++r)
      out.all_reduce_seconds += stats[r].all_reduce_seconds - before[r].all_reduce_seconds;
    out.all_reduce_seconds /= static_cast<double>(stats.size());
    out.all_reduce_calls = stats[0].all_reduce - before[0].all_reduce;
    out.samples = global_micro_batch * steps * options_.updates;
    return out;
  }

 private:
  Options options_;
  td::MirroredStrategy strategy_;
  std::unique_ptr<td::nn::Sequential> model_;
  std::vector<td::Tensor> features_, labels_;
};

int parse_int(const char* flag, const char* value) {
  char* end = nullptr;
  const long v = std::strtol(value, &end, 10);
  if (end == value || *end != '\0' || v < 1 || v > 1'000'000) {
    std::fprintf(stderr, "bench_accumulation_cpu: %s needs a whole number >= 1, got \"%s\"\n", flag,
                 value);
    std::exit(2);
  }
  return static_cast<int>(v);
}

}  // namespace

int main(int argc, char** argv) {
  Options options;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--replicas") {
      options.replicas = parse_int(argv[i], argv[i + 1]);
    } else if (flag == "--per-replica-batch") {
      options.per_replica_batch = parse_int(argv[i], argv[i + 1]);
    } else if (flag == "--updates") {
      options.updates = parse_int(argv[i], argv[i + 1]);
    } else if (flag == "--rounds") {
      options.rounds = parse_int(argv[i], argv[i + 1]);
    } else {
      std::fprintf(stderr, "bench_accumulation_cpu: unknown flag \"%s\"\n", argv[i]);
      return 2;
    }
  }
  if (argc % 2 == 0) {
    std::fprintf(stderr, "bench_accumulation_cpu: %s needs a value\n", argv[argc - 1]);
    return 2;
  }

  Bench bench(options);
  const std::vector<int> steps_list = {1, 2, 4, 8};
  std::map<int, std::vector<Sample>> samples;
  for (int round = 0; round < options.rounds; ++round) {
    // Rotate the order so that no N always runs first (or last) in a round.
    for (size_t k = 0; k < steps_list.size(); ++k) {
      const int steps = steps_list[(k + static_cast<size_t>(round)) % steps_list.size()];
      samples[steps].push_back(bench.measure(steps));
    }
  }

  std::printf(
      "Gradient accumulation on %d CPU replicas (%d cores), MLP 784-2048-2048-10 "
      "(%.2fM parameters, %.1f MB of gradients per replica), Adam\n",
      options.replicas, td::hardware_cores(), bench.parameters() / 1e6,
      bench.parameters() * 4.0 / 1e6);
  std::printf(
      "micro-step = %lld examples per replica (%lld global); %d updates per N, median of "
      "%d interleaved rounds\n\n",
      static_cast<long long>(options.per_replica_batch),
      static_cast<long long>(options.per_replica_batch * options.replicas), options.updates,
      options.rounds);
  std::printf("%3s %10s %16s %14s %14s %12s %20s\n", "N", "eff_batch", "all_reduce/update",
              "us/sample", "comm_us/sample", "comm_share", "comm/sample vs N=1");
  double comm_per_sample_1 = 0;
  for (int steps : steps_list) {
    std::vector<double> us_per_sample, comm_per_sample, share;
    uint64_t calls = 0;
    for (const Sample& s : samples[steps]) {
      us_per_sample.push_back(s.seconds / static_cast<double>(s.samples) * 1e6);
      comm_per_sample.push_back(s.all_reduce_seconds / static_cast<double>(s.samples) * 1e6);
      share.push_back(s.all_reduce_seconds / s.seconds);
      calls = s.all_reduce_calls;
    }
    const double comm = median(comm_per_sample);
    if (steps == 1) comm_per_sample_1 = comm;
    std::printf("%3d %10lld %16.2f %14.1f %14.1f %11.1f%% %19.2fx\n", steps,
                static_cast<long long>(options.per_replica_batch * options.replicas * steps),
                static_cast<double>(calls) / options.updates, median(us_per_sample), comm,
                100.0 * median(share), comm_per_sample_1 / comm);
  }
  std::printf("\ntarget: communication per sample falls >= 3.5x at N=4\n");
  std::printf(
      "reproduce: cmake --build build --target bench_accumulation_cpu && "
      "./build/bench/bench_accumulation_cpu\n");
  return 0;
}
