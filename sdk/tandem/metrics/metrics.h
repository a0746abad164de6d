// The metrics (Keras's, with sync-on-read state; Metric, their base, is in metric.h): the means
// Mean, Sum, Accuracy, BinaryAccuracy, CategoricalAccuracy, SparseCategoricalAccuracy, and the
// confusion-matrix metrics Precision, Recall and AUC (confusion_metrics.h).
#pragma once

#include <string>

#include "tandem/metrics/confusion_metrics.h"
#include "tandem/metrics/metric.h"
#include "tandem/tensor/tensor.h"

namespace tandem::metrics {

/// The (weighted) mean of every value seen: total / count, 0 before any update. State: total,
/// count (scalars).
class Mean : public Metric {
 public:
  explicit Mean(std::string name = "mean") : Metric(std::move(name)) {}
  /// Adds sum(values * w) to the total and sum(w) to the count (w = sample_weight broadcast to
  /// values' shape; 1 when undefined).
  void update_state(const Tensor& values, const Tensor& sample_weight = Tensor());

 protected:
  double compute(const MetricState& combined) const override;
  /// Adds to the calling replica's total and count.
  void accumulate(double total, double count);
};

/// The (weighted) sum of every value seen.
class Sum : public Metric {
 public:
  explicit Sum(std::string name = "sum") : Metric(std::move(name)) {}
  void update_state(const Tensor& values, const Tensor& sample_weight = Tensor());

 protected:
  double compute(const MetricState& combined) const override { return combined.scalar("total"); }
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

/// Keras's BinaryAccuracy: how often (y_pred > threshold) equals y_true (labels 0 or 1), as
/// Keras's mean over samples (a sample's value is the mean over its elements; sample_weight
/// of y_true's rank or less weighs samples, Keras's rules). y_true and y_pred have the same
/// shape, or one has an extra trailing axis of 1. Computed on the host (CUDA tensors are
/// copied there).
class BinaryAccuracy : public Mean {
 public:
  /// `threshold`: a prediction above it counts as 1.
  explicit BinaryAccuracy(std::string name = "binary_accuracy", double threshold = 0.5);
  void update_state(const Tensor& y_true, const Tensor& y_pred,
                    const Tensor& sample_weight = Tensor());
  double threshold() const { return threshold_; }

 private:
  double threshold_;
};

/// Keras's CategoricalAccuracy: how often argmax(y_true, -1) equals argmax(y_pred, -1), for
/// one-hot labels y_true of y_pred's shape [..., classes] (logits or probabilities; ties go to
/// the first index, as argmax does). Weighted as BinaryAccuracy; computed on the host.
class CategoricalAccuracy : public Mean {
 public:
  explicit CategoricalAccuracy(std::string name = "categorical_accuracy") : Mean(std::move(name)) {}
  void update_state(const Tensor& y_true, const Tensor& y_pred,
                    const Tensor& sample_weight = Tensor());
};

}  // namespace tandem::metrics
