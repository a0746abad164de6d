// Gradient buckets reduced during the backward pass vs one all-reduce after it, on CPU replicas:
// step time, and the communication the step waited for (exposed) against all of it. The model
// is bench_accumulation_cpu's MLP (784-2048-2048-10, 5.8M parameters, 23 MB of gradients per
// replica), so that the all-reduce is comparable to the compute.
//
//   bench_overlap_cpu [--replicas 2] [--per-replica-batch 64] [--steps 8] [--rounds 3]
//                     [--bucket-mb 25] [--first-bucket-mb 1] [--hidden 2048] [--layers 2]
//                     [--accumulation 1] [--trace FILE] [--device cpu|cuda]
//                     [--compression bfloat16|float16] [--shard 1|2]
//
// --compression: the rounds compare float32 gradients with gradients sent as that type
// (CommunicationOptions::gradient_compression) instead of comparing buckets with none; both
// modes use --bucket-mb (0: no buckets, one all-reduce after the backward pass).
//
// --shard S: the rounds compare Adam holding its whole state on every replica with Adam at
// shard_optimizer_state = S (each replica updates its own variables, which then go from their
// owners to the others); both use --bucket-mb. Over workers, the step time of stage 1 against
// stage 0 is the price of sharding across a network (bench/overlap_veth.sh shapes it).
//
// --device cuda: the replicas are logical replicas sharing cuda:0 (each bucket is reduced on
// the replica's own thread, queued on its stream, while the rest of the backward pass is
// queued); step times then include a device synchronization after the measured steps.
//
// --accumulation N: gradient accumulation over N micro-steps (only the last reduces; with
// buckets, its backward pass packs accumulator + gradient); figures are then per update.
//
// Under mpirun (or srun), or started from TF_CONFIG, every process is a worker with
// TANDEM_CPU_REPLICAS replicas (MultiWorkerMirroredStrategy, --replicas ignored);
// bench/overlap_veth.sh runs two workers in two network namespaces joined by a rate-limited veth
// pair, over Open MPI or Gloo. Alone, it runs --replicas replicas in this process
// (MirroredStrategy).
//
// Figures are replica 0's, from the step timeline (tandem::profile): "exposed" is the time its
// thread waited for gradients to be reduced (without buckets: the whole all-reduce, which runs
// on its thread; with buckets: its wait in apply_gradients for buckets still in flight), "comm"
// the time its all-reduces took wherever they ran (with buckets, on its communication thread,
// overlapping the backward pass). Rounds alternate the two modes; the table gives medians.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "tandem/tandem.h"
#include "tandem/tensor/device_runtime.h"
#include "timing.h"

namespace td = tandem;
namespace tb = tandem::bench;
namespace tp = tandem::profile;

namespace {

struct Options {
  int replicas = 2;
  int64_t per_replica_batch = 64;
  int steps = 8;  // measured steps per mode and round (after one warm-up step)
  int rounds = 3;
  double bucket_mb = 25;
  double first_bucket_mb = 1;
  int hidden = 2048;     // units per hidden layer
  int layers = 2;        // hidden layers
  int accumulation = 1;  // micro-steps per update
  std::string trace;     // a Chrome trace of the last bucketed measurement, when set
  bool cuda = false;     // logical replicas on cuda:0 instead of CPU replicas
  td::GradientCompression compression = td::GradientCompression::kNone;  // --compression
  int shard = 0;  // --shard: the stage compared with unsharded Adam
};

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

struct Sample {
  double step_ms = 0;     // wall time per step, on the calling thread
  double exposed_ms = 0;  // per step: replica 0 waiting for its gradients' reduction
  double comm_ms = 0;     // per step: replica 0's all-reduces, wherever they ran
};

bool under_a_launcher() {
  if (const char* tf_config = std::getenv("TF_CONFIG"); tf_config != nullptr && *tf_config)
    return true;  // a worker started from TF_CONFIG
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS"}) {
    const char* value = std::getenv(name);
    if (value != nullptr && std::atoi(value) > 1) return true;
  }
  return false;
}

std::unique_ptr<td::Strategy> make(const Options& options) {
  if (under_a_launcher()) return std::make_unique<td::MultiWorkerMirroredStrategy>();
  std::vector<td::Device> devices;
  for (int r = 0; r < options.replicas; ++r)
    devices.push_back(options.cuda ? td::Device::cuda(0) : td::Device::cpu(r));
  return std::make_unique<td::MirroredStrategy>(devices);
}

class Bench {
 public:
  explicit Bench(const Options& options) : options_(options), strategy_(make(options)) {
    auto scope = strategy_->scope();
    std::vector<td::nn::Module> modules;
    for (int l = 0; l < options.layers; ++l)
      modules.push_back(td::nn::Dense(options.hidden, td::nn::Activation::kRelu));
    modules.push_back(td::nn::Dense(10));
    model_ = std::make_unique<td::nn::Sequential>(std::move(modules));
    model_->set_seed(1);
    model_->build({784});
    optimizer_ = std::make_unique<td::optim::Adam>(td::optim::Adam::Options{
        .learning_rate = 1e-5, .gradient_accumulation_steps = options.accumulation});
    optimizer_->build(model_->trainable_variables());
    if (options.shard > 0) {
      sharded_ = std::make_unique<td::optim::Adam>(
          td::optim::Adam::Options{.learning_rate = 1e-5,
                                   .gradient_accumulation_steps = options.accumulation,
                                   .shard_optimizer_state = options.shard});
      sharded_->build(model_->trainable_variables());
    }
    td::Generator g(7 + static_cast<uint64_t>(strategy_->worker_index()));
    for (int r = 0; r < strategy_->num_local_replicas(); ++r) {
      const td::Device device = strategy_->devices()[static_cast<size_t>(r)];
      features_.push_back(td::Tensor::normal({options.per_replica_batch, 784}, g).to(device));
      std::vector<int64_t> labels(static_cast<size_t>(options.per_replica_batch));
      for (size_t i = 0; i < labels.size(); ++i) labels[i] = static_cast<int64_t>((i * 7 + r) % 10);
      labels_.push_back(td::Tensor::from_vector(labels).to(device));
    }
  }

  td::Strategy& strategy() { return *strategy_; }
  int64_t parameters() const {
    int64_t n = 0;
    for (const td::Variable& v : model_->trainable_variables()) n += v.shape().numel();
    return n;
  }

  /// `second`: the mode compared with the first (buckets, with --compression the compressed
  /// gradients, with --shard the sharded optimizer).
  Sample measure(bool second) {
    const bool compare_compression = options_.compression != td::GradientCompression::kNone;
    const bool compare_shard = options_.shard > 0;
    const bool buckets = compare_compression || compare_shard ? options_.bucket_mb > 0 : second;
    td::optim::Optimizer& optimizer = compare_shard && second ? *sharded_ : *optimizer_;
    td::CommunicationOptions communication{.bytes_per_pack = 0, .first_bytes_per_pack = 0};
    if (buckets) {
      communication.bytes_per_pack = static_cast<int64_t>(options_.bucket_mb * (1 << 20));
      communication.first_bytes_per_pack =
          static_cast<int64_t>(options_.first_bucket_mb * (1 << 20));
    }
    if (compare_compression && second) communication.gradient_compression = options_.compression;
    strategy_->set_communication_options(communication);
    const std::vector<td::Variable> variables = model_->trainable_variables();
    const int64_t global_batch = options_.per_replica_batch * strategy_->num_replicas_in_sync();
    auto step = [&](td::ReplicaContext& ctx, const td::Tensor& x, const td::Tensor& y) {
      td::GradientTape tape;
      const td::Tensor loss = td::compute_average_loss(
          td::losses::sparse_categorical_crossentropy(y, (*model_)(x, true), true), global_batch);
      optimizer.apply_gradients(ctx, tape.gradient(loss, variables), variables);
    };
    const td::PerReplica<td::Tensor> xs(features_), ys(labels_);
    // Warm-up: one update; with buckets, the one that lays them out.
    for (int m = 0; m < options_.accumulation; ++m) strategy_->run(step, xs, ys);
    std::vector<tp::Event> events;
    double seconds = 0;
    {
      tp::Profiler profiler(*strategy_, {.trace_file = second ? options_.trace : std::string(),
                                         .print_summaries = false});
      const double start = tb::now_seconds();
      for (int s = 0; s < options_.steps * options_.accumulation; ++s) strategy_->run(step, xs, ys);
      // Each replica waits for what it queued on its own stream (a no-op on CPU replicas).
      strategy_->run([](td::ReplicaContext& ctx) { td::synchronize(ctx.device()); });
      seconds = tb::now_seconds() - start;
      profiler.end_epoch();
      events = profiler.events();
    }
    Sample out;
    out.step_ms = seconds * 1e3 / options_.steps;
    // Exposed: collectives on the replica's own thread, and its waits for buckets in flight.
    double comm_ns = 0, exposed_ns = 0;
    for (const tp::Event& e : events) {
      if (e.track.index != 0) continue;
      const double ns = static_cast<double>(e.end_ns - e.begin_ns);
      const bool comm = e.phase == tp::Phase::kCommWait || e.phase == tp::Phase::kCommData;
      if (comm && e.track.kind == tp::TrackKind::kCommunicator) {
        comm_ns += ns;
        if (!e.overlapped) exposed_ns += ns;
      }
      if (e.phase == tp::Phase::kCommWait && e.track.kind == tp::TrackKind::kReplica)
        exposed_ns += ns;
    }
    out.comm_ms = comm_ns * 1e-6 / options_.steps;
    out.exposed_ms = exposed_ns * 1e-6 / options_.steps;
    return out;
  }

 private:
  Options options_;
  std::unique_ptr<td::Strategy> strategy_;
  std::unique_ptr<td::nn::Sequential> model_;
  std::unique_ptr<td::optim::Adam> optimizer_;
  std::unique_ptr<td::optim::Adam> sharded_;  // --shard
  std::vector<td::Tensor> features_, labels_;
};

double parse_number(const char* flag, const char* value) {
  char* end = nullptr;
  const double v = std::strtod(value, &end);
  if (end == value || *end != '\0' || !(v > 0) || v > 1e6) {
    std::fprintf(stderr, "bench_overlap_cpu: %s needs a number > 0, got \"%s\"\n", flag, value);
    std::exit(2);
  }
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  Options options;
  for (int i = 1; i < argc; i += 2) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) {
      std::fprintf(stderr, "bench_overlap_cpu: %s needs a value\n", flag.c_str());
      return 2;
    }
    if (flag == "--trace") {
      options.trace = argv[i + 1];
      continue;
    }
    if (flag == "--device") {
      const std::string device = argv[i + 1];
      if (device != "cpu" && device != "cuda") {
        std::fprintf(stderr, "bench_overlap_cpu: --device takes cpu or cuda, got \"%s\"\n",
                     device.c_str());
        return 2;
      }
      options.cuda = device == "cuda";
      continue;
    }
    if (flag == "--compression") {
      const std::string type = argv[i + 1];
      if (type != "bfloat16" && type != "float16") {
        std::fprintf(stderr,
                     "bench_overlap_cpu: --compression takes bfloat16 or float16, got \"%s\"\n",
                     type.c_str());
        return 2;
      }
      options.compression = type == "bfloat16" ? td::GradientCompression::kBFloat16
                                               : td::GradientCompression::kFloat16;
      continue;
    }
    if (flag == "--shard") {
      const std::string stage = argv[i + 1];
      if (stage != "1" && stage != "2") {
        std::fprintf(stderr, "bench_overlap_cpu: --shard takes 1 or 2, got \"%s\"\n",
                     stage.c_str());
        return 2;
      }
      options.shard = std::stoi(stage);
      continue;
    }
    if (flag == "--bucket-mb" && std::string(argv[i + 1]) == "0") {
      options.bucket_mb = 0;  // with --compression: no buckets
      continue;
    }
    const double value = parse_number(argv[i], argv[i + 1]);
    if (flag == "--replicas") {
      options.replicas = static_cast<int>(value);
    } else if (flag == "--per-replica-batch") {
      options.per_replica_batch = static_cast<int64_t>(value);
    } else if (flag == "--steps") {
      options.steps = static_cast<int>(value);
    } else if (flag == "--rounds") {
      options.rounds = static_cast<int>(value);
    } else if (flag == "--bucket-mb") {
      options.bucket_mb = value;
    } else if (flag == "--first-bucket-mb") {
      options.first_bucket_mb = value;
    } else if (flag == "--hidden") {
      options.hidden = static_cast<int>(value);
    } else if (flag == "--layers") {
      options.layers = static_cast<int>(value);
    } else if (flag == "--accumulation") {
      options.accumulation = static_cast<int>(value);
    } else {
      std::fprintf(stderr,
                   "bench_overlap_cpu: unknown flag %s (--replicas, --per-replica-batch, "
                   "--steps, --rounds, --bucket-mb, --first-bucket-mb, --hidden, --layers, "
                   "--accumulation, --trace, --device, --compression, --shard)\n",
                   flag.c_str());
      return 2;
    }
  }
  Bench bench(options);
  td::Strategy& strategy = bench.strategy();
  std::vector<Sample> off, on;
  for (int round = 0; round < options.rounds; ++round) {
    // Alternate which mode goes first, so that drift hits both alike.
    if (round % 2 == 0) {
      off.push_back(bench.measure(false));
      on.push_back(bench.measure(true));
    } else {
      on.push_back(bench.measure(true));
      off.push_back(bench.measure(false));
    }
  }
  if (!strategy.is_chief()) return 0;
  auto med = [](const std::vector<Sample>& samples, double Sample::*field) {
    std::vector<double> values;
    for (const Sample& s : samples) values.push_back(s.*field);
    return median(values);
  };
  const std::string per_update = options.accumulation > 1
                                     ? ", " + std::to_string(options.accumulation) +
                                           " micro-steps per update; figures per update"
                                     : "";
  std::printf(
      "bench_overlap_cpu: %d worker(s) x %d replica(s), per-replica batch %lld, MLP "
      "784-%dx%d-10 (%.2fM parameters, %.1f MB of gradients), %d steps x %d rounds, "
      "buckets %.3g MiB (first %.3g MiB)%s\n",
      strategy.num_workers(), strategy.num_local_replicas(),
      static_cast<long long>(options.per_replica_batch), options.hidden, options.layers,
      static_cast<double>(bench.parameters()) * 1e-6,
      static_cast<double>(bench.parameters()) * 4e-6, options.steps, options.rounds,
      options.bucket_mb, options.first_bucket_mb, per_update.c_str());
  std::printf("%-26s %10s %12s %10s\n", "mode", "step_ms", "exposed_ms", "comm_ms");
  if (options.shard > 0) {
    const std::string label = "shard_optimizer_state " + std::to_string(options.shard);
    const double off_step = med(off, &Sample::step_ms), on_step = med(on, &Sample::step_ms);
    std::printf("%-26s %10.2f %12.2f %10.2f\n", "unsharded", off_step,
                med(off, &Sample::exposed_ms), med(off, &Sample::comm_ms));
    std::printf("%-26s %10.2f %12.2f %10.2f\n", label.c_str(), on_step,
                med(on, &Sample::exposed_ms), med(on, &Sample::comm_ms));
    std::printf("step time %+.1f%% with %s (ratio %.3f)\n", 100.0 * (on_step / off_step - 1.0),
                label.c_str(), on_step / off_step);
    return 0;
  }
  if (options.compression != td::GradientCompression::kNone) {
    const std::string label = std::string("gradients as ") + td::to_string(options.compression);
    const double off_step = med(off, &Sample::step_ms), on_step = med(on, &Sample::step_ms);
    const double off_exposed = med(off, &Sample::exposed_ms),
                 on_exposed = med(on, &Sample::exposed_ms);
    std::printf("%-26s %10.2f %12.2f %10.2f\n", "gradients as float32", off_step, off_exposed,
                med(off, &Sample::comm_ms));
    std::printf("%-26s %10.2f %12.2f %10.2f\n", label.c_str(), on_step, on_exposed,
                med(on, &Sample::comm_ms));
    std::printf("step time %+.1f%%, exposed communication %+.1f%% with %s\n",
                100.0 * (on_step / off_step - 1.0),
                100.0 * (on_exposed / std::max(off_exposed, 1e-9) - 1.0), label.c_str());
    return 0;
  }
  const double off_step = med(off, &Sample::step_ms), on_step = med(on, &Sample::step_ms);
  const double off_exposed = med(off, &Sample::exposed_ms),
               on_exposed = med(on, &Sample::exposed_ms);
  std::printf("%-26s %10.2f %12.2f %10.2f\n", "after backward (no buckets)", off_step, off_exposed,
              med(off, &Sample::comm_ms));
  std::printf("%-26s %10.2f %12.2f %10.2f\n", "buckets during backward", on_step, on_exposed,
              med(on, &Sample::comm_ms));
  if (off_exposed > 0) {
    std::printf("step time %+.1f%%, exposed communication %+.1f%% with buckets\n",
                100.0 * (on_step / off_step - 1.0), 100.0 * (on_exposed / off_exposed - 1.0));
  } else {  // one replica: nothing to reduce
    std::printf("step time %+.1f%% with buckets (no communication to expose)\n",
                100.0 * (on_step / off_step - 1.0));
  }
  return 0;
}
