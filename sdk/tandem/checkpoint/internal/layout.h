// The checkpoint layout (docs/checkpoint-format.md, version 1) as writing, restoring and
// verifying a checkpoint share it: the names of its groups and values, the tracked objects by
// kind, the model's layers as Keras stores them, and the checks every restored value passes.
// Internal to the checkpoint layer.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "tandem/autograd/variable.h"
#include "tandem/checkpoint/checkpoint.h"
#include "tandem/data/iterator_state.h"
#include "tandem/io/internal/hdf5_file.h"
#include "tandem/optim/loss_scale_optimizer.h"
#include "tandem/tensor/tensor.h"

namespace tandem::nn {
class Module;
class ReplicaGenerators;
}  // namespace tandem::nn

namespace tandem::detail {

// ---- names of the layout (docs/checkpoint-format.md) -----------------------------------------

inline constexpr const char* kFormatName = "tandem.checkpoint";
inline constexpr const char* kModelWeights = "model_weights";
inline constexpr const char* kOptimizerWeights = "optimizer_weights";
inline constexpr const char* kTrainingState = "training_state";
inline constexpr const char* kIterationName = "iteration:0";
inline constexpr const char* kRngAlgorithm = "philox4x32-10";
/// The root attribute tandem_checksums of files whose datasets carry checksums.
inline constexpr const char* kChecksums = "fletcher32";
/// Counters (steps, epochs, iterations, samples) are at most 2^53: every such count is exact in
/// a float64 (learning-rate schedules and logs take it as one), and no run gets near it.
inline constexpr int64_t kMaxCounter = int64_t{1} << 53;
/// The Keras version /model_weights claims: its legacy-h5 loaders accept this layout.
inline constexpr const char* kKerasVersion = "2.15.0";
/// The standard int64 scalars of /training_state.
inline constexpr std::array<const char*, 4> kStandardCounters = {"global_step", "epoch",
                                                                 "step_in_epoch", "samples_seen"};

bool is_standard_counter(const std::string& name);

// ---- the tracked objects -------------------------------------------------------------------

/// The tracked objects of kind T, by name, in the order they were added.
template <typename T>
std::vector<std::pair<std::string, T*>> tracked(const std::vector<Checkpoint::Entry>& entries) {
  std::vector<std::pair<std::string, T*>> out;
  for (const Checkpoint::Entry& e : entries)
    if (T* const* p = std::get_if<T*>(&e.object.pointer())) out.emplace_back(e.name, *p);
  return out;
}

/// The first tracked object of kind T (a checkpoint holds one model and one optimizer), or
/// nullptr.
template <typename T>
T* tracked_one(const std::vector<Checkpoint::Entry>& entries) {
  auto all = tracked<T>(entries);
  return all.empty() ? nullptr : all.front().second;
}

/// The tracked optimizer's innermost() (a wrapper's slots and counter are the wrapped
/// optimizer's, stored as that one's), or nullptr.
inline optim::Optimizer* tracked_optimizer(const std::vector<Checkpoint::Entry>& entries) {
  optim::Optimizer* optimizer = tracked_one<optim::Optimizer>(entries);
  return optimizer != nullptr ? &optimizer->innermost() : nullptr;
}

/// The tracked optimizer when it is a loss-scale optimizer, or nullptr.
inline optim::LossScaleOptimizer* tracked_loss_scale(
    const std::vector<Checkpoint::Entry>& entries) {
  return dynamic_cast<optim::LossScaleOptimizer*>(tracked_one<optim::Optimizer>(entries));
}

/// The tracked counter called `name`, or nullptr.
int64_t* tracked_counter(const std::vector<Checkpoint::Entry>& entries, const std::string& name);

/// One layer of the model as Keras stores it: its name and its variables in Keras order.
struct LayerWeights {
  std::string name;
  std::vector<Variable> weights;
};

/// The model's layers in Keras' layout: a Sequential's layers (a nested Sequential is one
/// layer holding all of its variables, as in Keras), or the module itself when it has none.
/// Each layer's variables in Keras's legacy order: trainable first, then the others.
std::vector<LayerWeights> layers_of(const nn::Module& model);

/// The dropout streams of the model: a Sequential's, or a standalone Dropout's.
nn::ReplicaGenerators* generators_of(const nn::Module& model);

/// "dense/kernel" -> "dense/kernel:0", the name Keras gives a variable's dataset.
std::string keras_name(const std::string& variable_name);
std::string strip_keras_suffix(const std::string& name);

/// The model_signature of a model's layers: a stable hash of every layer's name and of each
/// variable's name, shape and dtype.
std::string signature_of(const std::vector<LayerWeights>& layers);

/// What model_signature hashes of one layer, held apart from the variables (a save records it
/// with the copy of the values and hashes it on the thread that writes the file).
struct LayerDescription {
  struct Weight {
    std::string name;
    Shape shape;
    DType dtype = DType::kFloat32;
  };
  std::string name;
  std::vector<Weight> weights;
};
/// The same signature, of layers described.
std::string signature_of(const std::vector<LayerDescription>& layers);

/// Writes `value` into every replica's copy of `variable`, so that all replicas hold the same
/// bits (the restore-side "broadcast" of a mirrored variable; load_weights uses it too).
void assign_all_copies(const Variable& variable, const Tensor& value);

// ---- what restored values may be -----------------------------------------------------------

/// "<file>:/<group>/<name>": where a value was read, for error messages.
std::string location(const h5::Group& group, const std::string& name);

/// Raises naming `where` unless every element of `value` is finite (and >= 0 when
/// `non_negative`): weights, slots and accumulators of a run that trained are never NaN/Inf,
/// and a second moment is a mean of squares.
void check_values(const std::string& where, const Tensor& value, bool non_negative,
                  const char* why_non_negative = "");

/// Raises naming `where` unless 0 <= value <= kMaxCounter.
void check_counter(const std::string& where, int64_t value);

/// A file whose model_signature does not describe its own /model_weights was changed after it
/// was written (a flipped bit in a shape): damaged, not "another model".
/// `difference`: what differs from the model restoring it, when there is one (names the
/// variable and both shapes).
void check_own_signature(const h5::Group& root, const std::string& path,
                         const std::string& difference = "");

/// Raises CheckpointMismatchError "<path>: <what>".
[[noreturn]] void mismatch(const std::string& path, const std::string& what);

/// Opens the checkpoint `path` read-only. A file that declares its checksums (the root attribute
/// tandem_checksums) must have one on every dataset that holds data (h5::Origin::kTandem); one
/// written before checkpoints carried them (in the HDF5 1.8 format or older) is read as it is
/// (h5::Origin::kForeign); one in the current format that does not declare them raises. Either
/// way only hard links, data inside the file and lossless filters are read.
h5::File open_checkpoint(const std::string& path);

/// The checks a checkpoint file passes before anything of it is used, without the model that
/// wrote it (Checkpoint::restore runs them first, verify_checkpoint alone, so that the two agree
/// on every file): the format and version; /model_weights and /training_state present; the
/// model_signature of its own layout; every group reached once (no cycles) and every dataset
/// read back (so every checksum verified); every group's children exactly the names its
/// attribute lists; every value possible (finite weights, slots and accumulators, Adam's v >= 0,
/// counters in [0, 2^53], metric counts >= 0, shuffle buffers without repeats, the
/// accumulation's micro_step below its steps). `model_difference`: when given, what differs
/// from the model restoring the file, added to the message of a damaged signature.
void validate_checkpoint(const h5::Group& root, const std::string& path,
                         const std::function<std::string()>& model_difference = nullptr);

/// Raises naming `path` unless the group /`name` exists.
void require_group(const h5::Group& root, const std::string& name, const std::string& path);

/// Reads the saved position of a pipeline (entry_names and a dataset per entry) and checks what
/// any saved pipeline state must satisfy (see layout.cpp).
data::IteratorState read_iterator_state(const h5::Group& group);

}  // namespace tandem::detail
