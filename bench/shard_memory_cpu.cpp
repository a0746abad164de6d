// Memory of optimizer-state sharding: an MLP of >= 50 M float32 parameters trained with Adam on
// 4 CPU replicas in one process, with shard_optimizer_state 0, 1 and 2, each in a process of its
// own (peak resident memory is per process). Prints, per stage, the bytes each replica holds
// (parameters, optimizer state), the process's peak resident memory and the median step time.
//   bench_shard_memory_cpu                 every stage, one child process each, and the ratios
//   bench_shard_memory_cpu --stage 1 ...   one run (what the children do)
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "tandem/tandem.h"
#include "timing.h"

namespace {

namespace td = tandem;

struct Options {
  int stage = -1;  // -1: run every stage in a child process
  int replicas = 4;
  int64_t width = 2048;
  int layers = 12;
  int steps = 4;
  int64_t batch = 16;  // global
};

[[noreturn]] void usage(const char* program, int code) {
  std::fprintf(code == 0 ? stdout : stderr,
               "usage: %s [--stage S] [--replicas R] [--width W] [--layers L] [--steps N] "
               "[--batch B]\n"
               "  --stage     0, 1 or 2 (default: each, one child process each)\n"
               "  --replicas  CPU replicas in the process (default 4)\n"
               "  --width     units of each Dense layer and input features (default 2048)\n"
               "  --layers    Dense layers (default 12: 12 x (2048 x 2048 + 2048) = 50.4 M "
               "parameters)\n"
               "  --steps     timed steps after one warm-up step (default 4)\n"
               "  --batch     global batch (default 16)\n",
               program);
  std::exit(code);
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage(argv[0], 2);
      return argv[++i];
    };
    if (arg == "--stage")
      o.stage = std::stoi(value());
    else if (arg == "--replicas")
      o.replicas = std::stoi(value());
    else if (arg == "--width")
      o.width = std::stoll(value());
    else if (arg == "--layers")
      o.layers = std::stoi(value());
    else if (arg == "--steps")
      o.steps = std::stoi(value());
    else if (arg == "--batch")
      o.batch = std::stoll(value());
    else if (arg == "--help" || arg == "-h")
      usage(argv[0], 0);
    else
      usage(argv[0], 2);
  }
  if (o.replicas < 1 || o.width < 1 || o.layers < 1 || o.steps < 1 || o.batch % o.replicas != 0)
    usage(argv[0], 2);
  return o;
}

/// The process's peak resident memory (VmHWM), in bytes.
int64_t peak_resident_bytes() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line))
    if (line.rfind("VmHWM:", 0) == 0) return std::stoll(line.substr(6)) * 1024;
  return -1;
}

/// One run; prints "stage,params,parameter_bytes_per_replica,state_bytes_per_replica_max,
/// peak_rss_bytes,median_step_s".
void run_one(const Options& o) {
  auto strategy = td::MirroredStrategy::cpu(o.replicas);
  td::nn::Sequential model;
  std::unique_ptr<td::optim::Adam> adam;
  {
    auto scope = strategy.scope();
    for (int l = 0; l < o.layers; ++l) model.add(td::nn::Dense(o.width));
    model.set_seed(1);
    model.build({o.width});
    adam = std::make_unique<td::optim::Adam>(
        td::optim::Adam::Options{.learning_rate = 1e-4, .shard_optimizer_state = o.stage});
    adam->build(model.trainable_variables());
  }
  const std::vector<td::Variable> variables = model.trainable_variables();
  int64_t parameter_bytes = 0;
  std::vector<int64_t> state_bytes(static_cast<size_t>(o.replicas), 0);
  for (const td::Variable& v : variables)
    parameter_bytes += static_cast<int64_t>(v.copy(0).nbytes());
  // The slots (or the parts of them) each replica holds.
  for (const td::optim::Optimizer::SlotPlacement& p : adam->slot_placements()) {
    const int64_t bytes =
        (p.end - p.begin) * static_cast<int64_t>(td::dtype_size(p.variable.copy(0).dtype()));
    for (int r = 0; r < o.replicas; ++r)
      if (p.owner < 0 || p.owner == r) state_bytes[static_cast<size_t>(r)] += bytes;
  }
  td::Generator g(7);
  const td::Tensor x = td::Tensor::normal({o.batch, o.width}, g);
  const int64_t per_replica = o.batch / o.replicas;
  std::vector<td::Tensor> xs;
  for (int r = 0; r < o.replicas; ++r)
    xs.push_back(x.slice(r * per_replica, (r + 1) * per_replica));
  auto step = [&](td::ReplicaContext& ctx, const td::Tensor& input) {
    td::GradientTape tape;
    const td::Tensor out = model(input, /*training=*/true);
    const td::Tensor loss =
        td::compute_average_loss(td::ops::mean(td::ops::square(out), {1}), o.batch);
    adam->apply_gradients(ctx, tape.gradient(loss, variables), variables);
  };
  strategy.run(step, td::PerReplica<td::Tensor>(xs));  // warm-up: slots touched, buffers made
  std::vector<double> seconds;
  for (int s = 0; s < o.steps; ++s) {
    const double start = td::bench::now_seconds();
    strategy.run(step, td::PerReplica<td::Tensor>(xs));
    seconds.push_back(td::bench::now_seconds() - start);
  }
  std::sort(seconds.begin(), seconds.end());
  int64_t params = 0;
  for (const td::Variable& v : variables) params += v.copy(0).numel();
  std::printf("%d,%lld,%lld,%lld,%lld,%.4f\n", o.stage, static_cast<long long>(params),
              static_cast<long long>(parameter_bytes),
              static_cast<long long>(*std::max_element(state_bytes.begin(), state_bytes.end())),
              static_cast<long long>(peak_resident_bytes()), seconds[seconds.size() / 2]);
}

/// Runs this program with `--stage stage` and the other options; returns its one line.
std::string run_child(const Options& o, int stage) {
  const std::string command = "/proc/" + std::to_string(::getpid()) + "/exe --stage " +
                              std::to_string(stage) + " --replicas " + std::to_string(o.replicas) +
                              " --width " + std::to_string(o.width) + " --layers " +
                              std::to_string(o.layers) + " --steps " + std::to_string(o.steps) +
                              " --batch " + std::to_string(o.batch) + " 2>/dev/null";
  FILE* pipe = ::popen(command.c_str(), "r");
  TANDEM_CHECK(pipe != nullptr, "bench_shard_memory_cpu: cannot run ", command);
  std::string out;
  char buffer[512];
  while (std::fgets(buffer, sizeof buffer, pipe) != nullptr) out += buffer;
  const int status = ::pclose(pipe);
  TANDEM_CHECK(status == 0 && !out.empty(), "bench_shard_memory_cpu: ", command, " failed");
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  if (o.stage >= 0) {
    run_one(o);
    return 0;
  }
  std::printf(
      "Optimizer-state sharding, Adam, %d CPU replicas in one process, %d x Dense(%lld), "
      "global batch %lld, median of %d steps\n",
      o.replicas, o.layers, static_cast<long long>(o.width), static_cast<long long>(o.batch),
      o.steps);
  std::printf("%-6s %12s %22s %26s %16s %12s\n", "stage", "parameters", "param MiB/replica",
              "optimizer state MiB/replica", "peak RSS MiB", "step s");
  double rss[3] = {0, 0, 0}, step_s[3] = {0, 0, 0}, state[3] = {0, 0, 0};
  for (int stage = 0; stage <= 2; ++stage) {
    long long params = 0, parameter_bytes = 0, state_bytes = 0, peak = 0;
    double seconds = 0;
    const std::string line = run_child(o, stage);
    int parsed_stage = -1;
    TANDEM_CHECK(std::sscanf(line.c_str(), "%d,%lld,%lld,%lld,%lld,%lf", &parsed_stage, &params,
                             &parameter_bytes, &state_bytes, &peak, &seconds) == 6,
                 "bench_shard_memory_cpu: unexpected output: ", line);
    constexpr double kMiB = 1024.0 * 1024.0;
    std::printf("%-6d %12lld %22.1f %26.1f %16.1f %12.3f\n", stage, params,
                static_cast<double>(parameter_bytes) / kMiB,
                static_cast<double>(state_bytes) / kMiB, static_cast<double>(peak) / kMiB, seconds);
    rss[stage] = static_cast<double>(peak);
    step_s[stage] = seconds;
    state[stage] = static_cast<double>(state_bytes);
  }
  for (int stage = 1; stage <= 2; ++stage)
    std::printf(
        "stage %d / stage 0: optimizer state per replica %.3f, peak RSS %.3f (%.1f%% less), "
        "step time %.3f\n",
        stage, state[stage] / state[0], rss[stage] / rss[0], 100.0 * (1.0 - rss[stage] / rss[0]),
        step_s[stage] / step_s[0]);
  std::printf("reproduce: %s\n",
              td::bench::reproduce_command(TANDEM_BINARY_DIR, argc, argv).c_str());
  return 0;
}
