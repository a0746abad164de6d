// TrackedState: the interface a program's own object implements to be saved and restored by a
// Checkpoint with everything else (its state as named host tensors, under
// /training_state/user/<name>/<key>).
#pragma once

#include <map>
#include <string>

#include "tandem/tensor/tensor.h"

namespace tandem {

/// A program's own state in a checkpoint. Implement save_state() and restore_state(), track
/// the object by name ({"schedule", &my_schedule}), and every checkpoint holds its state:
///
///   struct BestLoss : td::TrackedState {
///     double best = INFINITY; int64_t since = 0;
///     td::TrackedState::State save_state() const override {
///       return {{"best", td::Tensor::from_vector<double>({best}, td::Shape{})},
///               {"since", td::Tensor::from_vector<int64_t>({since}, td::Shape{})}};
///     }
///     void restore_state(const td::TrackedState::State& s) override {
///       best = s.at("best").item<double>(); since = s.at("since").item<int64_t>();
///     }
///   };
///
/// The state is the program's, the same on every worker (not per replica): the chief writes
/// it, every worker restores it. Each tensor is stored as it is (dtype float32, float64,
/// int32, int64 or uint8; any shape; bit-exact, NaN and infinities included; a CUDA
/// tensor is copied to the host).
class TrackedState {
 public:
  /// Key -> tensor. A key is a dataset name: non-empty, without '/'.
  using State = std::map<std::string, Tensor>;

  virtual ~TrackedState() = default;

  /// The state to save. Called on the chief when a checkpoint is written (by
  /// CheckpointManager::save, from replica 0's thread while the other replicas wait).
  virtual State save_state() const = 0;

  /// Checks a state read from a checkpoint (host tensors) before anything is restored; raise a
  /// tandem::Error to refuse it, and the restore changes nothing. The default accepts a state
  /// with the keys of save_state() now, each of the same dtype and shape, and names the first
  /// difference; override it for state whose shape may change (a history that grows).
  virtual void check_state(const State& state) const;

  /// Takes back a state check_state() accepted (host tensors). Called on every worker, after
  /// every object of the checkpoint passed its checks; it should not raise.
  virtual void restore_state(const State& state) = 0;
};

}  // namespace tandem
