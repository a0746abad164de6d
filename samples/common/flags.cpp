// Flag parsing for the samples: "--flag value" or "--flag=value", every value checked in full
// (from_chars must consume it), errors naming the flag and the value.
#include "common/flags.h"

#include <charconv>
#include <cmath>
#include <cstdlib>
#include <iostream>
#include <sstream>
#include <stdexcept>
#include <string_view>
#include <system_error>

namespace samples {

namespace {

/// A bad command line; the message names the flag and the value.
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

[[noreturn]] void bad_value(std::string_view flag, std::string_view value, std::string_view want) {
  std::ostringstream message;
  message << flag << " \"" << value << "\" is not " << want;
  throw UsageError(message.str());
}

/// A whole number in [low, high], or a UsageError naming the flag.
template <typename Int>
Int parse_int(std::string_view flag, std::string_view value, Int low, Int high,
              std::string_view want) {
  Int parsed{};
  const auto [end, error] = std::from_chars(value.data(), value.data() + value.size(), parsed);
  if (error != std::errc() || end != value.data() + value.size() || parsed < low || parsed > high) {
    bad_value(flag, value, want);
  }
  return parsed;
}

double parse_positive_double(std::string_view flag, std::string_view value) {
  double parsed = 0.0;
  const auto [end, error] = std::from_chars(value.data(), value.data() + value.size(), parsed);
  if (error != std::errc() || end != value.data() + value.size() || !std::isfinite(parsed) ||
      parsed <= 0.0) {
    bad_value(flag, value, "a positive number (e.g. 1e-3)");
  }
  return parsed;
}

Flags parse(int argc, char** argv, const SampleInfo& info, bool& help) {
  Flags flags;
  if (!info.default_lr_schedule.empty()) flags.lr_schedule = info.default_lr_schedule;
  flags.learning_rate = info.default_learning_rate;
  flags.checkpoint_dir = info.default_checkpoint_dir;
  for (int i = 1; i < argc; ++i) {
    std::string_view arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      help = true;
      return flags;
    }
    if (!arg.starts_with("--")) {
      throw UsageError("unexpected argument \"" + std::string(arg) + "\" (flags start with --)");
    }
    // "--flag=value" or "--flag value".
    std::string_view flag = arg;
    std::optional<std::string_view> inline_value;
    if (const size_t eq = arg.find('='); eq != std::string_view::npos) {
      flag = arg.substr(0, eq);
      inline_value = arg.substr(eq + 1);
    }
    if (flag == "--fresh") {
      if (inline_value) {
        throw UsageError("--fresh takes no value (got \"" + std::string(*inline_value) + "\")");
      }
      flags.fresh = true;
      continue;
    }
    if (flag == "--sync-bn" && info.batch_norm) {
      if (inline_value) {
        throw UsageError("--sync-bn takes no value (got \"" + std::string(*inline_value) + "\")");
      }
      flags.sync_bn = true;
      continue;
    }
    auto value = [&]() -> std::string_view {
      if (inline_value) return *inline_value;
      if (i + 1 >= argc) throw UsageError(std::string(flag) + " needs a value");
      return argv[++i];
    };
    if (flag == "--epochs") {
      flags.epochs = parse_int<int64_t>(flag, value(), 1, 1'000'000, "a whole number >= 1");
    } else if (flag == "--per-replica-batch") {
      flags.per_replica_batch =
          parse_int<int64_t>(flag, value(), 1, 1'000'000, "a whole number >= 1");
    } else if (flag == "--devices") {
      const std::string_view v = value();
      flags.devices.clear();
      size_t begin = 0;
      while (begin <= v.size()) {
        const size_t comma = std::min(v.find(',', begin), v.size());
        const std::string_view name = v.substr(begin, comma - begin);
        if (!(name.starts_with("cpu") || name.starts_with("cuda")))
          bad_value(flag, v, "a comma-separated device list such as cuda:0,cuda:1");
        flags.devices.emplace_back(name);
        begin = comma + 1;
      }
    } else if (flag == "--replicas") {
      flags.replicas = parse_int<int>(flag, value(), 1, 4096, "a replica count in [1, 4096]");
    } else if (flag == "--learning-rate") {
      flags.learning_rate = parse_positive_double(flag, value());
    } else if (flag == "--seed") {
      flags.seed = parse_int<uint64_t>(flag, value(), 0, UINT64_MAX, "a whole number >= 0");
    } else if (flag == "--lr-scaling") {
      const std::string_view v = value();
      if (v == "none") {
        flags.lr_scaling = LrScaling::kNone;
      } else if (v == "linear") {
        flags.lr_scaling = LrScaling::kLinear;
      } else {
        bad_value(flag, v, "none or linear");
      }
    } else if (flag == "--checkpoint-dir") {
      const std::string_view v = value();
      if (v.empty()) bad_value(flag, v, "a directory");
      flags.checkpoint_dir = std::string(v);
    } else if (flag == "--metrics-json") {
      const std::string_view v = value();
      if (v.empty()) bad_value(flag, v, "a file name");
      flags.metrics_json = std::string(v);
    } else if (flag == "--tensorboard") {
      const std::string_view v = value();
      if (v.empty()) bad_value(flag, v, "a directory");
      flags.tensorboard = std::string(v);
    } else if (flag == "--profile") {
      const std::string_view v = value();
      if (v.empty()) bad_value(flag, v, "a file name");
      flags.profile = std::string(v);
    } else if (flag == "--accumulation-steps") {
      flags.accumulation_steps = parse_int<int>(flag, value(), 1, 1'000'000, "a whole number >= 1");
    } else if (flag == "--shard-optimizer-state") {
      flags.shard_optimizer_state = parse_int<int>(flag, value(), 0, 2, "0, 1 or 2");
    } else if (flag == "--bucket-mib") {
      flags.bucket_mib = parse_int<int>(flag, value(), 0, 1024, "a whole number from 0 to 1024");
    } else if (flag == "--gradient-compression") {
      const std::string_view v = value();
      if (v != "none" && v != "bfloat16" && v != "float16")
        bad_value(flag, v, "none, bfloat16 or float16");
      flags.gradient_compression = std::string(v);
    } else if (flag == "--precision") {
      const std::string_view v = value();
      if (v != "float32" && v != "mixed_bfloat16" && v != "mixed_float16")
        bad_value(flag, v, "float32, mixed_bfloat16 or mixed_float16");
      flags.precision = std::string(v);
    } else if (flag == "--lr-schedule" && !info.default_lr_schedule.empty()) {
      const std::string_view v = value();
      if (v != "constant" && v != "cosine") bad_value(flag, v, "constant or cosine");
      flags.lr_schedule = std::string(v);
    } else if (flag == "--tfrecords" && info.tfrecords) {
      const std::string_view v = value();
      if (v.empty()) bad_value(flag, v, "a directory");
      flags.tfrecords = std::string(v);
    } else if (flag == "--max-steps") {
      flags.max_steps = parse_int<int64_t>(flag, value(), 1, INT64_MAX, "a whole number >= 1");
    } else {
      throw UsageError("unknown flag \"" + std::string(flag) + "\"");
    }
  }
  return flags;
}

}  // namespace

double Flags::scaled_learning_rate(int num_replicas) const {
  return lr_scaling == LrScaling::kLinear ? learning_rate * num_replicas : learning_rate;
}

std::string usage(const SampleInfo& info) {
  std::ostringstream out;
  out << info.name << ": " << info.description << "\n\n"
      << "usage: " << info.name << " [flags]   (run it from the repository root)\n\n"
      << "  --epochs N                epochs to train in all, counting the epochs of a resumed\n"
      << "                            run (default 10)\n"
      << "  --per-replica-batch N     examples per replica per step; the global batch is\n"
      << "                            N x replicas (default 64)\n"
      << "  --replicas N              train on N CPU replicas (logical devices cpu:0..N-1,\n"
      << "                            sharing the cores). Default: MirroredStrategy's choice,\n"
      << "                            every GPU, else TANDEM_CPU_REPLICAS CPU replicas (1)\n"
      << "  --devices LIST            replica devices, e.g. cuda:0,cuda:1 (NCCL) or cuda:0,cuda:0\n"
      << "                            (two replicas sharing one GPU); overrides --replicas\n"
      << "  --learning-rate X         Adam's learning rate before --lr-scaling (default "
      << info.default_learning_rate << ")\n"
      << "  --seed S                  seed of the weight initialisation and of the shuffle\n"
      << "                            (default 42)\n"
      << "  --lr-scaling none|linear  linear multiplies the learning rate by the replica count\n"
      << "                            (the usual rule when the global batch grows with the\n"
      << "                            replicas); default none\n";
  if (!info.default_lr_schedule.empty())
    out << "  --lr-schedule constant|cosine  cosine decays the learning rate to 0 over the\n"
        << "                            updates of --epochs (Keras's CosineDecay); default "
        << info.default_lr_schedule << "\n";
  out << "  --checkpoint-dir DIR      where checkpoints are saved after every epoch; a run\n"
      << "                            resumes from the newest one there (default\n"
      << "                            " << info.default_checkpoint_dir << ")\n"
      << "  --fresh                   start from scratch, ignoring existing checkpoints (new\n"
      << "                            ones are still saved in --checkpoint-dir)\n"
      << "  --metrics-json FILE       write one JSON object per line per epoch: epoch, loss,\n"
      << "                            train_accuracy, test_accuracy, samples_per_sec, replicas,\n"
      << "                            epoch_seconds (appended to when the run resumes)\n"
      << "  --tensorboard DIR         write TensorBoard event files into DIR (the chief): each\n"
      << "                            epoch's loss, accuracies, learning rate, samples/s and\n"
      << "                            where each replica's time went (the profiler's breakdown,\n"
      << "                            speed-up, efficiency, advice); tensorboard --logdir DIR\n"
      << "  --profile FILE            record the step timeline: at each epoch's end print where\n"
      << "                            each replica's time went (input, compute, waiting for\n"
      << "                            peers, communication, optimizer) with advice; write a\n"
      << "                            Chrome trace to FILE at the end (TANDEM_PROFILE=FILE too)\n"
      << "  --accumulation-steps N    accumulate the gradients of N steps (micro-batches) and\n"
      << "                            update once with their mean: the effective batch is\n"
      << "                            N x the global batch, with the memory of one step and\n"
      << "                            one all-reduce per update (default 1)\n"
      << "  --shard-optimizer-state S 1: each replica keeps the optimizer's slots of its own\n"
      << "                            variables only; 2: and only their summed gradients\n"
      << "                            (bitwise the same training; one process; default 0)\n"
      << "  --bucket-mib N            all-reduce the gradients in buckets of N MiB during the\n"
      << "                            backward pass (0: one all-reduce after it); default: the\n"
      << "                            strategy's (buckets for GPUs and TF_CONFIG workers)\n"
      << "  --gradient-compression T  send the gradients between replicas as T: bfloat16 or\n"
      << "                            float16 (half the bytes; summed in float32), or none\n"
      << "                            (default)\n"
      << "  --precision P             float32 (default), mixed_bfloat16 or mixed_float16 (Keras's\n"
      << "                            dtype policies: float32 weights, 16-bit computation;\n"
      << "                            bfloat16 is the fast one on CPUs with AVX512-BF16 or AMX)\n"
      << (info.batch_norm
              ? "  --sync-bn                 batch normalization over the global batch (every\n"
                "                            replica and worker: one all-reduce per layer)\n"
              : "")
      << (info.tfrecords
              ? "  --tfrecords DIR           train from DIR/*.tfrecord: tf.train.Examples {image:\n"
                "                            PNG or JPEG bytes of 28x28 gray, label: int64},\n"
                "                            decoded on every core; a DIR without such files gets\n"
                "                            Fashion-MNIST's training images written there first\n"
                "                            (PNGs, 8 files)\n"
              : "")
      << "  --max-steps N             at most N training steps per epoch (smoke tests); the\n"
      << "                            whole test split is still evaluated\n"
      << "  --help                    this text\n\n"
      << "SIGTERM or Ctrl-C (to any worker) finishes the current step on every worker, saves a\n"
      << "checkpoint and exits with code 75; the next run resumes there (tandem-run restarts\n"
      << "such a job by itself). A bad flag exits with code 2. Environment:\n"
      << "TANDEM_CPU_REPLICAS (the default replica count), TANDEM_LOG_LEVEL (debug, info,\n"
      << "warning, error).\n";
  return out.str();
}

Flags parse_flags_or_exit(int argc, char** argv, const SampleInfo& info) {
  try {
    bool help = false;
    Flags flags = parse(argc, argv, info, help);
    if (help) {
      std::cout << usage(info);
      std::exit(EXIT_SUCCESS);
    }
    return flags;
  } catch (const UsageError& error) {
    std::cerr << info.name << ": " << error.what() << " (see --help)\n";
    std::exit(kUsageExitCode);
  }
}

}  // namespace samples
