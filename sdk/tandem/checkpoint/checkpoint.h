// Checkpoint: the objects of a training run that are saved and restored together (model,
// optimizer, data iterators, metrics, step counters, dropout RNG streams, the program's own
// numbers and TrackedState objects), written in the HDF5
// layout of docs/checkpoint-format.md (version 1), whose /model_weights Keras can load.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "tandem/checkpoint/tracked_state.h"
#include "tandem/core/error.h"

namespace tandem {

namespace nn {
class Module;
}  // namespace nn
namespace optim {
class Optimizer;
}  // namespace optim
namespace data {
class DistributedDataset;
class Iterator;
}  // namespace data
namespace metrics {
class Metric;
}  // namespace metrics

/// The checkpoint format version this build writes, and the newest it reads.
inline constexpr int64_t kCheckpointFormatVersion = 1;

/// A checkpoint that is intact but does not fit what restores it: written by a newer format
/// version, or of another model (a variable missing, a shape differs). The message names the
/// file, the first variable that differs and both shapes. restore_or_initialize falls back to
/// an older checkpoint past it too (a flipped bit can change a shape), and raises it only when
/// every checkpoint of the directory is of another model.
class CheckpointMismatchError : public Error {
 public:
  using Error::Error;
};

/// One object a Checkpoint saves and restores, made implicitly from a pointer to it:
/// \verbatim
///   nn::Module* (a Sequential or a single layer)   -> /model_weights, and the Sequential's
///                                                      dropout streams -> rng/replica_state
///   optim::Optimizer*                              -> /optimizer_weights (slots, iterations;
///       a wrapper's are the wrapped optimizer's); a LossScaleOptimizer's scale and counter
///       -> /training_state/loss_scale/{scale, good_steps}
///   data::DistributedDataset*, data::Iterator*     -> /training_state/data/<name>
///   metrics::Metric* (a user subclass too)         -> /training_state/metrics/<name>/<variable>:
///       each state variable, summed over replicas and workers
///   int64_t* (a counter the training loop keeps)   -> named "global_step", "epoch",
///       "step_in_epoch" or "samples_seen": that /training_state scalar; any other name:
///       /training_state/counters/<name> (int64)
///   double*, float* (the program's own numbers: a best loss, a learning rate it adapts)
///                                                  -> /training_state/counters/<name>, a
///       float64 / float32 scalar restored bit-exactly (NaN and infinities too); the standard
///       names above are int64 only
///   TrackedState* (any object of the program)      -> /training_state/user/<name>/<key>, one
///       dataset per key of its save_state()
/// \endverbatim
/// Counters, user state and metrics are the program's: the chief writes its own values (a
/// metric's summed over every worker), and a restore gives every worker the file's values. An
/// entry the file lacks (a checkpoint written before it was tracked) keeps its value, with a
/// warning naming it; one the file holds with another dtype (a float counter restored into a
/// double) or shape raises naming both.
/// The object must outlive the Checkpoint (and every CheckpointManager made from it).
class Trackable {
 public:
  /// The tracked object: one of the pointer types above.
  using Pointer =
      std::variant<nn::Module*, optim::Optimizer*, data::DistributedDataset*, data::Iterator*,
                   metrics::Metric*, int64_t*, double*, float*, TrackedState*>;
  // Implicit on purpose: Checkpoint({{"model", &model}, {"optimizer", &optimizer}}).
  /// Tracks a model: its weights and the Sequential's dropout streams.
  Trackable(nn::Module* model) : pointer_(model) {}  // NOLINT
  /// Tracks an optimizer: its slots and update count (and a loss scale's state).
  Trackable(optim::Optimizer* optimizer) : pointer_(optimizer) {}  // NOLINT
  /// Tracks a distributed dataset's position (epoch and place within it).
  Trackable(data::DistributedDataset* dataset) : pointer_(dataset) {}  // NOLINT
  /// Tracks a dataset iterator's position.
  Trackable(data::Iterator* iterator) : pointer_(iterator) {}  // NOLINT
  /// Tracks a metric's state (every state variable, summed over replicas and workers).
  Trackable(metrics::Metric* metric) : pointer_(metric) {}  // NOLINT
  /// Tracks an int64 counter of the training loop.
  Trackable(int64_t* counter) : pointer_(counter) {}  // NOLINT
  /// Tracks a float64 number of the program, restored bit-exactly.
  Trackable(double* counter) : pointer_(counter) {}  // NOLINT
  /// Tracks a float32 number of the program, restored bit-exactly.
  Trackable(float* counter) : pointer_(counter) {}  // NOLINT
  /// Tracks an object of the program through its TrackedState interface.
  Trackable(TrackedState* state) : pointer_(state) {}  // NOLINT

  /// The tracked object.
  const Pointer& pointer() const { return pointer_; }
  /// "model", "optimizer", "distributed dataset", "dataset iterator", "metric", "counter",
  /// "float64 counter", "float32 counter" or "user state".
  std::string_view kind() const;

 private:
  Pointer pointer_;
};

/// The state of a training run, tracked by name:
///
///   int64_t epoch = 0, step_in_epoch = 0;
///   td::Checkpoint checkpoint({{"model", &model}, {"optimizer", &optimizer},
///                              {"train_data", &dist_train}, {"train_accuracy", &accuracy},
///                              {"epoch", &epoch}, {"step_in_epoch", &step_in_epoch}});
///
/// At most one model and one optimizer (the Keras layout has one /model_weights). The
/// standard /training_state scalars default, when no counter of that name is tracked, to:
/// global_step = the optimizer's iterations (else 0), epoch = the first tracked distributed
/// dataset's epoch() (else 0), step_in_epoch = samples_seen = 0.
///
/// Mirrored variables: the values written are replica 0's copies (all copies are equal after
/// each synchronised update); a restore writes into every copy, so all replicas restart
/// bit-identical. Per-replica state is gathered: metrics store the SUM over replicas of each of
/// their state variables, the dropout streams one row per replica. In a multi-worker job,
/// CheckpointManager::save gathers it from every worker (a row per replica of every worker,
/// metric and accumulator sums over every worker) and a restore gives each worker its part.
///
/// Use it through a CheckpointManager (rotation, the `checkpoint` state file, chief-only
/// writes); write() and restore() are the single-file operations underneath.
class Checkpoint {
 public:
  /// A tracked object and its name (the name is its key in the file: `metrics/<name>`, ...).
  struct Entry {
    /// The object's key in the file; unique within the checkpoint, not empty.
    std::string name;
    /// The object.
    Trackable object;
  };

  /// Raises on an empty or repeated name, a null pointer, or a second model or optimizer.
  Checkpoint(std::initializer_list<Entry> entries);
  /// Tracks one more object (same rules as the constructor).
  void add(std::string name, Trackable object);
  /// Every tracked object, in the order added.
  const std::vector<Entry>& entries() const { return entries_; }

  /// Writes every tracked object to `path` (an existing file is replaced): the file is
  /// written as "<path>.tmp.<pid>" (exclusive create), closed, fsynced, renamed to `path`, and
  /// the directory is fsynced, so `path` is always either the old file or the complete new one.
  /// Call it where no replica is running (or let CheckpointManager::save coordinate replicas).
  void write(const std::string& path) const;

  /// Restores every tracked object from `path`. Everything is read and checked before anything
  /// changes, so a failed restore leaves the objects as they were. Raises tandem::Error naming
  /// the file when it is missing, not a regular file, truncated, not HDF5, not a Tandem
  /// checkpoint, lacks a group this checkpoint needs, fails a checksum, or holds values that
  /// cannot be valid (non-finite weights or slots, Adam's v < 0, counters outside [0, 2^53],
  /// a metric count < 0, a shuffle buffer with repeats; the error names the dataset);
  /// CheckpointMismatchError for a newer format version or another model. A data iterator whose
  /// saved position cannot be used (another pipeline) is reported and restarted at the beginning of
  /// its saved epoch. Call it from the main thread, outside strategy.run.
  void restore(const std::string& path) const;

  /// The step the next checkpoint is numbered by: the "global_step" counter if one is tracked,
  /// else the optimizer's iterations, else 0.
  int64_t global_step() const;
  /// Replicas of the tracked state (copies of the model's variables, else the optimizer's,
  /// else the data's replica count; 1 when there is none).
  int num_replicas() const;
  /// Hex FNV-1a hash of the model's layer names, variable names, shapes and dtypes (what the
  /// file's model_signature attribute holds); "" when no model is tracked.
  std::string model_signature() const;

 private:
  std::vector<Entry> entries_;
};

}  // namespace tandem
