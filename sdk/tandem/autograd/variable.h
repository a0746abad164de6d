// Variable: a named, mutable tensor that models and optimizers own. A handle: copies alias.
// Variables created inside a strategy scope hold one copy per replica; value() returns the
// copy of the replica running on the calling thread.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tandem/tensor/tensor.h"

namespace tandem {

/// When the replicas' copies of a variable agree (tf.VariableSynchronization): kOnWrite, the
/// default, keeps them equal (mirrored: every update is the same on every replica); kOnRead lets
/// each replica update its own copy (batch norm's moving statistics, metrics), and a read in
/// cross-replica context (outside strategy.run, checkpoint saves) combines them by the
/// variable's aggregation.
enum class VariableSynchronization { kOnWrite, kOnRead };
/// How the copies of a kOnRead variable combine when read in cross-replica context
/// (tf.VariableAggregation): their sum, their mean, or replica 0's copy. kNone: reading it there
/// raises.
enum class VariableAggregation { kNone, kSum, kMean, kOnlyFirstReplica };
/// "on_write", "on_read"; "none", "sum", "mean", "only_first_replica".
const char* to_string(VariableSynchronization synchronization);
/// See to_string(VariableSynchronization).
const char* to_string(VariableAggregation aggregation);

/// make_variable's settings beyond the name and the initial value.
struct VariableOptions {
  /// Whether optimizers update it (Module::trainable_variables lists it) and tapes watch it.
  bool trainable = true;
  /// When the replicas' copies agree; kOnRead needs trainable == false.
  VariableSynchronization synchronization = VariableSynchronization::kOnWrite;
  /// How a kOnRead variable's copies combine when read outside strategy.run.
  VariableAggregation aggregation = VariableAggregation::kNone;
  /// Its gradient touches few rows (an embedding table's: TensorFlow's IndexedSlices): the sum
  /// across replicas may gather the touched rows instead of all-reducing the whole table.
  bool row_sparse_gradient = false;
};

/// A named, mutable tensor that training updates: a layer's weight, an optimizer's slot, a
/// metric's state. A handle (copies alias one variable); inside a strategy scope it holds one
/// copy per replica, and value() returns the calling replica's. Make them with make_variable.
class Variable {
 public:
  /// An undefined variable (a layer's bias when it has none).
  Variable() = default;
  /// `name` is the Keras-style path ("dense/kernel"); `initial` is copied (not aliased).
  Variable(std::string name, const Tensor& initial, bool trainable = true);

  /// False for a default-constructed variable.
  bool defined() const { return state_ != nullptr; }
  /// The Keras-style path ("dense/kernel"), also its name in checkpoints.
  const std::string& name() const;
  /// Whether optimizers update it and tapes watch it.
  bool trainable() const;
  /// The value's shape.
  const Shape& shape() const { return value().shape(); }
  /// The value's dtype.
  DType dtype() const { return value().dtype(); }

  /// When the replicas' copies agree (kOnWrite unless set).
  VariableSynchronization synchronization() const;
  /// How a kOnRead variable's copies combine (kNone unless set).
  VariableAggregation aggregation() const;
  /// VariableOptions::row_sparse_gradient.
  bool row_sparse_gradient() const;
  /// Sets row_sparse_gradient() (the Embedding layer does for its table).
  void set_row_sparse_gradient(bool row_sparse) const;
  /// Sets how the copies agree and combine (make_variable does it when the variable is made).
  /// kOnRead needs trainable == false, as in TensorFlow: raises otherwise.
  void set_synchronization(VariableSynchronization synchronization,
                           VariableAggregation aggregation) const;

  /// This replica's value. Active gradient tapes on this thread watch it when trainable. In
  /// cross-replica context (outside strategy.run) a kOnRead variable with several copies reads
  /// as their aggregate (aggregated()); a mirrored one as replica 0's copy.
  const Tensor& value() const;
  /// This replica's value without notifying tapes (for optimizers and checkpoints).
  const Tensor& value_untracked() const;
  /// Copies `new_value` (same shape and dtype) into this replica's value (in cross-replica
  /// context, a kOnRead variable's every copy: assign_all).
  void assign(const Tensor& new_value) const;

  /// Number of per-replica copies (1 unless created inside a multi-replica scope).
  int num_copies() const;
  /// The copy of replica `replica` (for strategies, checkpoints and tests).
  const Tensor& copy(int replica) const;
  /// The copies combined by the aggregation (a new tensor on copy 0's device): what a
  /// cross-replica read and a checkpoint see of a kOnRead variable. A mirrored variable's is
  /// copy 0. Raises for a kOnRead variable whose aggregation is kNone.
  Tensor aggregated() const;
  /// Cross-replica assignment to every copy: `value` itself, except that a kOnRead kSum
  /// variable's copies get value / copies (so that they sum to it), as TensorFlow assigns them.
  void assign_all(const Tensor& value) const;
  /// Replaces the per-replica copies (used by strategy scopes when mirroring).
  void set_copies(std::vector<Tensor> copies) const;

  /// Identity (handles of one variable compare equal).
  const void* id() const { return state_.get(); }
  /// True when both handles alias one variable.
  friend bool operator==(const Variable& a, const Variable& b) { return a.state_ == b.state_; }

 private:
  struct State {
    std::string name;
    bool trainable = true;
    VariableSynchronization synchronization = VariableSynchronization::kOnWrite;
    VariableAggregation aggregation = VariableAggregation::kNone;
    bool row_sparse_gradient = false;
    std::vector<Tensor> copies;  // one per replica
    Tensor read;                 // the last cross-replica read of a kOnRead variable
  };
  std::shared_ptr<State> state_;
};

/// Creates a variable. This is the one place variables are made: inside a strategy scope the
/// scope's creator makes it mirrored (one copy per replica); elsewhere it is a plain Variable.
/// Models, layers and optimizers create every variable (weights and slots) through it.
Variable make_variable(std::string name, const Tensor& initial, bool trainable = true);
/// The same with a synchronization and aggregation (e.g. batch norm's moving statistics:
/// {.trainable = false, .synchronization = kOnRead, .aggregation = kMean}).
Variable make_variable(std::string name, const Tensor& initial, const VariableOptions& options);

/// Builds a variable from (name, initial value, trainable).
using VariableCreator = std::function<Variable(std::string, const Tensor&, bool)>;
/// Installs `creator` for variables made on the calling thread and returns the previous one
/// (an empty function means plain variables). Strategy scopes use this.
VariableCreator set_variable_creator(VariableCreator creator);

/// The replica whose copies Variable::value() returns on the calling thread, and the number of
/// replicas in sync (set by strategies on their replica threads; 0 and 1 elsewhere).
struct ReplicaBinding {
  int replica_id = 0;       ///< index among this process's replicas (the variable copy it uses)
  int num_replicas = 1;     ///< this process's replicas
  int first_global_id = 0;  ///< global id of local replica 0 (worker x local replicas)
  int num_replicas_in_sync = 1;  ///< replicas of the whole job: every worker's
};
/// The calling thread's binding: its replica inside strategy.run, {0, 1, 0, 1} elsewhere.
ReplicaBinding current_replica_binding();
/// Global id of this process's first replica: worker index x local replicas with several
/// workers (set by the multi-worker strategy), else 0.
int process_replica_offset();
/// Sets process_replica_offset() (the multi-worker strategy does, once it knows its rank).
void set_process_replica_offset(int offset);
/// Replicas in sync of the multi-worker job this process is a worker of (every worker's), and
/// this process's: {0, 0} when no multi-worker strategy has set them. Mirrored variables
/// then hold this process's copies of a job-wide variable (with one replica per worker, one
/// copy each), and an optimizer that shards its state lays it out over every worker's replicas.
struct JobReplicas {
  int in_sync = 0;  ///< every worker's replicas
  int local = 0;    ///< this process's (global ids process_replica_offset() + [0, local))
};
/// See JobReplicas.
JobReplicas job_replicas();
/// Sets job_replicas() (the multi-worker strategy does, with process_replica_offset()).
void set_job_replicas(JobReplicas replicas);
/// Sets the calling thread's binding (strategies do, on their replica threads).
void set_current_replica_binding(ReplicaBinding binding);

}  // namespace tandem
