// The command-line flags every Fashion-MNIST sample takes (--epochs, --per-replica-batch,
// --replicas, ...), their defaults, --help, and strict parsing: a bad value exits with code 2.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace samples {

/// Exit code for a bad command line.
inline constexpr int kUsageExitCode = 2;

enum class LrScaling {
  kNone,    ///< the learning rate as given
  kLinear,  ///< multiplied by the replica count (the global batch grows with the replicas)
};

/// What a sample tells the flag parser about itself.
struct SampleInfo {
  std::string name;                    ///< program name: "fashion_mnist_mlp"
  std::string description;             ///< one line for --help
  std::string default_checkpoint_dir;  ///< "checkpoints/fashion_mnist_mlp"
  /// The model has batch normalization: --sync-bn is accepted.
  bool batch_norm = false;
  /// --lr-schedule's default ("constant" or "cosine"); empty: the sample has no --lr-schedule.
  std::string default_lr_schedule = {};
  /// --learning-rate's default.
  double default_learning_rate = 1e-3;
  /// The sample can train from TFRecord files: --tfrecords is accepted.
  bool tfrecords = false;
};

struct Flags {
  int64_t epochs = 10;
  int64_t per_replica_batch = 64;
  /// CPU replicas; unset: MirroredStrategy's default device choice.
  std::optional<int> replicas;
  /// Replica devices ("cuda:0,cuda:1", or "cuda:0,cuda:0" for two replicas sharing a GPU);
  /// empty: --replicas or the default choice.
  std::vector<std::string> devices;
  double learning_rate = 1e-3;
  uint64_t seed = 42;
  LrScaling lr_scaling = LrScaling::kNone;
  std::string checkpoint_dir;
  bool fresh = false;
  /// JSON-lines file of per-epoch metrics; empty: none.
  std::string metrics_json;
  std::string tensorboard;  ///< --tensorboard DIR: TensorBoard event files (the chief writes)
  /// Chrome trace of the step timeline, with a breakdown and advice printed at each epoch's end;
  /// empty: TANDEM_PROFILE's file, or no profiling.
  std::string profile;
  /// Micro-steps per optimizer update (gradient accumulation); 1: update every step.
  int accumulation_steps = 1;
  /// The optimizer's shard_optimizer_state: 0 (every replica holds every slot), 1 or 2.
  int shard_optimizer_state = 0;
  /// Gradient bucket size in MiB (all-reduce during the backward pass); 0: no buckets; unset:
  /// the strategy's default.
  std::optional<int> bucket_mib;
  /// The type float32 gradients travel in between replicas: "none" (float32), "bfloat16",
  /// "float16" (CommunicationOptions::gradient_compression).
  std::string gradient_compression = "none";
  /// The dtype policy the model is made under: "float32", "mixed_bfloat16" or "mixed_float16".
  std::string precision = "float32";
  /// Batch normalization over the global batch (BatchNormalization(synchronized=true)).
  bool sync_bn = false;
  /// "constant", or "cosine": Keras's CosineDecay from the learning rate to 0 over every update
  /// of --epochs (a function of the optimizer's update count, so a resumed run continues it).
  std::string lr_schedule = "constant";
  /// --tfrecords DIR: train from DIR/*.tfrecord (tf.train.Examples {image: PNG or JPEG bytes,
  /// label: int64}); empty: the Fashion-MNIST IDX files.
  std::string tfrecords;
  /// Cap on training steps per epoch (smoke tests); unset: whole epochs.
  std::optional<int64_t> max_steps;

  /// The learning rate after --lr-scaling for `num_replicas` replicas.
  double scaled_learning_rate(int num_replicas) const;
  /// True once `steps` steps of the current epoch reached --max-steps.
  bool step_limit_reached(int64_t steps) const { return max_steps && steps >= *max_steps; }
};

/// Parses argv. --help prints usage and exits 0; an unknown flag, a missing value or a bad
/// value prints an error naming the flag and the value and exits with kUsageExitCode.
Flags parse_flags_or_exit(int argc, char** argv, const SampleInfo& info);

/// The --help text.
std::string usage(const SampleInfo& info);

}  // namespace samples
