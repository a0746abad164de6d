// Metric, the base of every metric, and its state: named float64 variables (Keras's metric
// variables, e.g. total and count, or true_positives [num_thresholds]) kept per replica and
// summed over the replicas, and over the workers of a multi-worker job, when read (sync-on-read,
// tf.distribute's SUM aggregation of metric variables).
#pragma once

#include <initializer_list>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tandem/core/shape.h"
#include "tandem/core/workers.h"
#include "tandem/nn/replica_state.h"

namespace tandem::metrics {

/// One state variable of a metric, as Keras declares it with add_variable: a name (Keras's:
/// "total", "true_positives", ...; also its dataset name in checkpoints) and a shape ({} for a
/// scalar, {200} for 200 thresholds). Every variable is float64 and starts at zero.
struct MetricVariable {
  /// Unique within the metric, non-empty, without '/'.
  std::string name;
  /// {} (the default) for a scalar; at least one value.
  Shape shape = {};
  /// A count (a sum of non-negative weights): a restore refuses a negative stored value.
  bool non_negative = false;
};

/// A metric's state: the values of each of its variables (row-major, float64), in the order the
/// metric declares them. Partial states of several replicas or workers combine by adding them
/// element-wise.
class MetricState {
 public:
  /// (variable name, its values) pairs, in the metric's order.
  using Values = std::vector<std::pair<std::string, std::vector<double>>>;

  MetricState() = default;
  /// Zeros for each of `variables`.
  explicit MetricState(const std::vector<MetricVariable>& variables);
  /// Given values, e.g. MetricState({{"total", {6.0}}, {"count", {4.0}}}).
  MetricState(std::initializer_list<std::pair<std::string, std::vector<double>>> values);
  /// Takes the given variables and values as they are.
  explicit MetricState(Values values) : values_(std::move(values)) {}

  /// The values of the variable `name`; raises naming it and the variables the state has.
  const std::vector<double>& at(std::string_view name) const;
  /// The values of the variable `name`, to update in place; raises as the const overload.
  std::vector<double>& at(std::string_view name);
  /// The one value of a scalar variable, e.g. state.scalar("count"); raises unless the variable
  /// exists and has exactly one value.
  double scalar(std::string_view name) const;
  /// Whether the state has a variable `name`.
  bool contains(std::string_view name) const;
  /// Every variable and its values, in order.
  const Values& values() const { return values_; }
  /// Adds `other` element-wise; raises unless it has the same variables with as many values.
  void add(const MetricState& other);
  /// Every value, variable after variable (what an all-reduce carries).
  std::vector<double> flatten() const;
  /// Sets every value from `flat` (as flatten() lays them out); raises on a size mismatch.
  void unflatten(const std::vector<double>& flat);

 private:
  Values values_;
};

/// A metric: update_state() inside strategy.run (each replica adds to its own state), result()
/// and reset_state() outside it (they read or clear every replica's state; inside run they
/// raise).
///
/// A metric made while a MultiWorkerMirroredStrategy lives in the process belongs to that job:
/// result() and combined_state() then also sum over every worker, with one small all-reduce,
/// so every worker must call them together (as with tf.distribute's metrics, whose reads
/// all-reduce, and torchmetrics' compute()). local_result() and local_state() read this
/// process's replicas only, without communication.
///
/// Writing your own metric (Keras's Metric subclassing, in C++):
///
///   class RootMeanSquare : public td::metrics::Metric {   // sqrt(mean(x^2))
///    public:
///     explicit RootMeanSquare(std::string name = "rms")
///         : Metric(std::move(name), {{.name = "sum_squares"},
///                                    {.name = "count", .non_negative = true}}) {}
///     void update_state(const td::Tensor& values) {     // inside strategy.run, per replica
///       td::metrics::MetricState& state = replica_state();
///       for (double v : values.to_vector<double>()) state.at("sum_squares")[0] += v * v;
///       state.at("count")[0] += static_cast<double>(values.numel());
///     }
///    protected:
///     double compute(const td::metrics::MetricState& s) const override {
///       return s.scalar("count") == 0 ? 0.0 : std::sqrt(s.scalar("sum_squares") /
///       s.scalar("count"));
///     }
///   };
///
/// - The constructor declares the state variables (name, shape). Every variable is combined by
///   SUM over the replicas and workers, so keep sums (Keras's rule too): a mean is kept as a
///   total and a count, a maximum cannot be (keep it out of a Metric, or in a TrackedState).
/// - update_state (any signature) runs on each replica thread and adds to replica_state(), the
///   calling replica's own state; it reads its tensors on the host (to_vector copies a CUDA
///   tensor there).
/// - compute() turns the combined state into the value result() returns; result(),
///   reset_state() and combined_state() run outside strategy.run.
/// - Tracked by a Checkpoint ({"name", &metric}), the combined state is saved under
///   `/training_state/metrics/<name>/<variable>` and restored into replica 0 of the chief; a
///   restore checks each variable's shape, that values are finite and that non_negative ones
///   are >= 0.
class Metric {
 public:
  virtual ~Metric() = default;
  Metric(const Metric&) = delete;
  Metric& operator=(const Metric&) = delete;

  /// The name given at construction (e.g. "mean"), used in error messages and checkpoints.
  const std::string& name() const { return name_; }
  /// The state variables, in order.
  const std::vector<MetricVariable>& variables() const { return variables_; }
  /// The value over every replica's updates, of every worker: compute(combined_state()). A
  /// collective in a multi-worker job. Raises inside strategy.run.
  double result() const;
  /// The value over this process's replicas only (no communication). Raises inside
  /// strategy.run.
  double local_result() const;
  /// Zeroes every replica's state. Raises inside strategy.run.
  void reset_state();
  /// The state summed over every replica of every worker (a collective in a multi-worker job).
  /// Raises inside strategy.run.
  MetricState combined_state() const;
  /// The state summed over this process's replicas. Call it outside strategy.run, or where
  /// every other replica waits (CheckpointManager::save inside run gathers with it).
  MetricState local_state() const;
  /// Restores a combined state (of every worker): the chief's replica 0 takes it, every other
  /// replica and worker starts from zero (equivalent, since only the sum is ever read). Raises
  /// unless `state` has this metric's variables with their sizes; raises inside strategy.run.
  void set_combined_state(const MetricState& state);
  /// Workers whose states result() combines: 1, or the job's workers (see above).
  int num_workers() const;
  /// Each of this process's replicas' state, in replica order. Raises inside strategy.run.
  std::vector<MetricState> replica_states() const;

 protected:
  /// A metric with the variables total and count (Mean and the metrics built on it).
  explicit Metric(std::string name);
  /// A metric with the given state variables (non-empty, distinct names; see MetricVariable).
  Metric(std::string name, std::vector<MetricVariable> variables);
  /// The calling replica's state, for update_state to add to (each replica thread touches only
  /// its own).
  MetricState& replica_state();
  /// The metric's value from a combined state.
  virtual double compute(const MetricState& combined) const = 0;
  /// Raises naming the metric and `what` ("result()", ...) when called inside strategy.run.
  void check_outside_run(const char* what) const;

 private:
  std::string name_;
  std::vector<MetricVariable> variables_;
  mutable nn::ReplicaLocal<MetricState> states_;
  std::shared_ptr<WorkerGroup> workers_;  // the job's workers when made in one (else null)
};

}  // namespace tandem::metrics
