// Metrics with sync-on-read state: each replica adds to its own (total, count) slot, indexed by
// current_replica_binding().replica_id; result() sums totals and counts over the replicas, as
// tf.distribute's SUM aggregation of metric variables, and over the workers of a multi-worker
// job. Mean, Sum, Accuracy, SparseCategoricalAccuracy.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "tandem/core/workers.h"
#include "tandem/nn/replica_state.h"
#include "tandem/tensor/tensor.h"

namespace tandem::metrics {

/// One replica's accumulated state (float64 on the host).
struct MetricState {
  double total = 0.0;
  double count = 0.0;
};

/// A metric: update_state() inside replicas (each thread writes only its own slot), result()
/// and reset_state() outside strategy.run (they read or clear every replica's slot).
///
/// A metric made while a MultiWorkerMirroredStrategy lives in the process belongs to that job:
/// result() and combined_state() then also sum over every worker, with one small all-reduce,
/// so every worker must call them together (as with tf.distribute's metrics, whose reads
/// all-reduce, and torchmetrics' compute()). local_result() and local_state() read this
/// process's replicas only, without communication.
class Metric {
 public:
  virtual ~Metric() = default;
  Metric(const Metric&) = delete;
  Metric& operator=(const Metric&) = delete;

  const std::string& name() const { return name_; }
  /// The value over every replica's updates, of every worker: combine(SUM of totals, SUM of
  /// counts). A collective in a multi-worker job.
  double result() const;
  /// The value over this process's replicas only (no communication).
  double local_result() const;
  /// Zeroes every replica's state.
  void reset_state();
  /// The state summed over every replica of every worker (a collective in a multi-worker job).
  MetricState combined_state() const;
  /// The state summed over this process's replicas.
  MetricState local_state() const;
  /// Restores a combined state (of every worker): the chief's replica 0 takes it, every other
  /// replica and worker starts from zero (equivalent, since only the sum is ever read).
  void set_combined_state(const MetricState& state);
  /// Workers whose states result() combines: 1, or the job's workers (see above).
  int num_workers() const;
  /// Each of this process's replicas' state, in replica order.
  std::vector<MetricState> replica_states() const;

 protected:
  explicit Metric(std::string name);
  /// Adds to the calling replica's state.
  void accumulate(double total, double count);
  /// The metric's value from a combined state.
  virtual double compute(const MetricState& combined) const = 0;

 private:
  std::string name_;
  mutable nn::ReplicaLocal<MetricState> states_;
  std::shared_ptr<WorkerGroup> workers_;  // the job's workers when made in one (else null)
};

/// The (weighted) mean of every value seen: total / count, 0 before any update.
class Mean : public Metric {
 public:
  explicit Mean(std::string name = "mean") : Metric(std::move(name)) {}
  /// Adds sum(values * w) to the total and sum(w) to the count (w = sample_weight broadcast to
  /// values' shape; 1 when undefined).
  void update_state(const Tensor& values, const Tensor& sample_weight = Tensor());

 protected:
  double compute(const MetricState& combined) const override;
};

/// The (weighted) sum of every value seen.
class Sum : public Metric {
 public:
  explicit Sum(std::string name = "sum") : Metric(std::move(name)) {}
  void update_state(const Tensor& values, const Tensor& sample_weight = Tensor());

 protected:
  double compute(const MetricState& combined) const override { return combined.total; }
};

/// How often y_pred equals y_true (same shape, or one with an extra trailing axis of 1).
class Accuracy : public Mean {
 public:
  explicit Accuracy(std::string name = "accuracy") : Mean(std::move(name)) {}
  void update_state(const Tensor& y_true, const Tensor& y_pred,
                    const Tensor& sample_weight = Tensor());
};

/// How often argmax(y_pred, -1) equals the integer label: y_true [N] (or [N, 1]), y_pred
/// [N, C] logits or probabilities.
class SparseCategoricalAccuracy : public Mean {
 public:
  explicit SparseCategoricalAccuracy(std::string name = "sparse_categorical_accuracy")
      : Mean(std::move(name)) {}
  void update_state(const Tensor& y_true, const Tensor& y_pred,
                    const Tensor& sample_weight = Tensor());
};

}  // namespace tandem::metrics
