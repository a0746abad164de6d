// The metrics (Keras's, with sync-on-read state; Metric, their base, is in metric.h): the means
// Mean, Sum, Accuracy, BinaryAccuracy, CategoricalAccuracy, SparseCategoricalAccuracy, and the
// confusion-matrix metrics Precision, Recall and AUC (confusion_metrics.h).
#pragma once

#include <string>

#include "tandem/metrics/confusion_metrics.h"
#include "tandem/metrics/metric.h"
#include "tandem/tensor/tensor.h"

namespace tandem::metrics {

/// The (weighted) mean of every value seen, per sample as Keras's Mean: total / count, 0 before
/// any update. State: total, count (scalars).
class Mean : public Metric {
 public:
  /// `name`: names the metric in its error messages and checkpoints.
  explicit Mean(std::string name = "mean") : Metric(std::move(name)) {}
  /// Adds one batch, with Keras's rule for sample weights (reduce_to_samplewise_values; the
  /// first axis is the batch):
  /// - without `sample_weight`: each sample's value is the mean over its non-batch axes; total
  ///   gains their sum, count the number of samples (values [N, C] add N; a scalar adds 1);
  /// - with it: when the ranks of values and weight differ by one and the longer ends in an
  ///   axis of 1, that axis is dropped (or, when the shorter has rank 1, the shorter gains one),
  ///   so [N] and [N, 1] weights both weigh samples, whether values are [N], [N, 1] or [N, C];
  ///   values are averaged over the axes beyond the weight's rank; the weight broadcasts to them
  ///   and multiplies them; weight and values are averaged over their non-batch axes; total
  ///   gains the sum of the weighted values, count the sum of the weights. A weight [N, C] on
  ///   values [N, C] weighs each element; a scalar weight weighs the batch's mean.
  ///
  /// Raises, naming the metric and both shapes, when the weight does not broadcast (a weight
  /// [M] on values [N, C] with M != N, or [N, C] on values [N] or [N, 1]).
  void update_state(const Tensor& values, const Tensor& sample_weight = Tensor());

 protected:
  double compute(const MetricState& combined) const override;
  /// Adds to the calling replica's total and count.
  void accumulate(double total, double count);
};

/// The (weighted) sum of every value seen, as Keras's Sum. State: total, and count (the number
/// of samples, or sum of their weights, seen; result() reads only total).
class Sum : public Metric {
 public:
  /// `name`: names the metric in its error messages and checkpoints.
  explicit Sum(std::string name = "sum") : Metric(std::move(name)) {}
  /// Adds sum(values * weight) to the total, with Mean::update_state's rule for the weight
  /// (Keras's) but sums in place of means: a weight [N] or [N, 1] on values [N, C] weighs each
  /// sample's row. Raises as Mean::update_state.
  void update_state(const Tensor& values, const Tensor& sample_weight = Tensor());

 protected:
  double compute(const MetricState& combined) const override { return combined.scalar("total"); }
};

/// How often y_pred equals y_true (same shape, or one with an extra trailing axis of 1), as
/// Keras's Accuracy: the mean of the per-sample match rates.
class Accuracy : public Mean {
 public:
  /// `name`: names the metric in its error messages and checkpoints.
  explicit Accuracy(std::string name = "accuracy") : Mean(std::move(name)) {}
  /// Adds the element-wise matches (y_true compared in y_pred's dtype) to the mean, weighted by
  /// `sample_weight` with Mean::update_state's rule: [N] or [N, 1] weighs samples, a weight of
  /// y_pred's shape weighs elements. Raises naming the shapes when y_true and y_pred differ.
  void update_state(const Tensor& y_true, const Tensor& y_pred,
                    const Tensor& sample_weight = Tensor());
};

/// How often argmax(y_pred, -1) equals the integer label: y_true [N] (or [N, 1]), y_pred
/// [N, C] logits or probabilities (or [N, ..., C] with labels [N, ...]), as Keras's.
class SparseCategoricalAccuracy : public Mean {
 public:
  /// `name`: names the metric in its error messages and checkpoints.
  explicit SparseCategoricalAccuracy(std::string name = "sparse_categorical_accuracy")
      : Mean(std::move(name)) {}
  /// Adds one match (1 or 0) per label to the mean, weighted with Mean::update_state's rule:
  /// `sample_weight` [N] or [N, 1] weighs samples. Ties in y_pred go to the first class.
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
  /// Adds one batch (y_true and y_pred as above), weighted by `sample_weight` as in
  /// Mean::update_state. Raises naming the shapes when they do not fit.
  void update_state(const Tensor& y_true, const Tensor& y_pred,
                    const Tensor& sample_weight = Tensor());
  /// The threshold given at construction (default 0.5).
  double threshold() const { return threshold_; }

 private:
  double threshold_;
};

/// Keras's CategoricalAccuracy: how often argmax(y_true, -1) equals argmax(y_pred, -1), for
/// one-hot labels y_true of y_pred's shape [..., classes] (logits or probabilities; ties go to
/// the first index, as argmax does). Weighted as BinaryAccuracy; computed on the host.
class CategoricalAccuracy : public Mean {
 public:
  /// `name`: names the metric in its error messages and checkpoints.
  explicit CategoricalAccuracy(std::string name = "categorical_accuracy") : Mean(std::move(name)) {}
  /// Adds one batch: one-hot y_true and y_pred, both [..., classes], `sample_weight` as in
  /// Mean::update_state (one match per sample of shape [N], so [N] or [N, 1] weighs samples).
  void update_state(const Tensor& y_true, const Tensor& y_pred,
                    const Tensor& sample_weight = Tensor());
};

}  // namespace tandem::metrics
