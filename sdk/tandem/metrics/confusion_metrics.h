// Keras's confusion-matrix metrics: Precision, Recall and AUC. Their state is Keras's
// variables (true_positives, ... of one value per threshold), kept per replica and summed on
// read like every metric's; updates run on the host (CUDA tensors are copied there).
#pragma once

#include <string>
#include <vector>

#include "tandem/metrics/metric.h"
#include "tandem/tensor/tensor.h"

namespace tandem::metrics {

/// Keras's Precision: tp / (tp + fp) at each threshold (0 while tp + fp is 0). An element of
/// y_pred counts as a positive prediction at threshold t when y_pred > t, and as a positive
/// label when y_true != 0; every element of the batch is one prediction (y_true and y_pred of
/// one shape, or one with an extra trailing axis of 1). sample_weight weighs the elements with
/// Keras's rules (a scalar, or broadcastable to y_pred once [N] gains a trailing axis).
/// Thresholds spaced evenly over [0, 1] (3 or more) use Keras's bucketed counting, which first
/// clips predictions to [0, 1]. State: true_positives, false_positives [thresholds].
class Precision : public Metric {
 public:
  /// `thresholds`: one or more, each in [0, 1].
  explicit Precision(std::string name = "precision", std::vector<double> thresholds = {0.5});
  /// Adds one batch's counts at each threshold (inputs and weights as above).
  void update_state(const Tensor& y_true, const Tensor& y_pred,
                    const Tensor& sample_weight = Tensor());
  /// The thresholds given at construction.
  const std::vector<double>& thresholds() const { return thresholds_; }
  /// The value at each threshold, of every replica and worker (a collective in a multi-worker
  /// job; raises inside strategy.run). result() is the one value when there is one threshold.
  std::vector<double> results() const;

 protected:
  /// The single threshold's value; raises, pointing to results(), with several thresholds.
  double compute(const MetricState& combined) const override;

 private:
  std::vector<double> thresholds_;
  bool evenly_;
};

/// Keras's Recall: tp / (tp + fn) at each threshold (0 while tp + fn is 0); inputs, weights
/// and thresholds as Precision. State: true_positives, false_negatives [thresholds].
class Recall : public Metric {
 public:
  /// `thresholds`: one or more, each in [0, 1].
  explicit Recall(std::string name = "recall", std::vector<double> thresholds = {0.5});
  /// Adds one batch's counts at each threshold (inputs and weights as Precision's).
  void update_state(const Tensor& y_true, const Tensor& y_pred,
                    const Tensor& sample_weight = Tensor());
  /// The thresholds given at construction.
  const std::vector<double>& thresholds() const { return thresholds_; }
  /// The value at each threshold (as Precision::results()).
  std::vector<double> results() const;

 protected:
  double compute(const MetricState& combined) const override;

 private:
  std::vector<double> thresholds_;
  bool evenly_;
};

/// The curve an AUC integrates.
enum class AucCurve {
  kRoc,  ///< true-positive rate (recall) against false-positive rate
  kPr,   ///< precision against recall
};

/// How an AUC sums its Riemann terms (Keras's summation_method).
enum class AucSummationMethod {
  kInterpolation,  ///< trapezoids for ROC; for PR Keras's interpolation of Davis & Goadrich 2006
  kMinoring,       ///< the lower of the two heights of each interval
  kMajoring,       ///< the higher
};

/// AUC's settings (Keras's defaults).
struct AucOptions {
  /// Thresholds, the two end points included: 0 - 1e-7, i / (n - 1) for i = 1 .. n - 2, and
  /// 1 + 1e-7 (Keras's). At least 2.
  int num_thresholds = 200;
  /// The curve: ROC (the default) or PR.
  AucCurve curve = AucCurve::kRoc;
  /// How the area is summed (default: interpolation).
  AucSummationMethod summation_method = AucSummationMethod::kInterpolation;
  /// y_pred holds logits: sigmoid is applied first.
  bool from_logits = false;
};

/// Keras's AUC (not multi-label): the area under the ROC or PR curve, from the confusion
/// matrix at num_thresholds thresholds, with Keras's bucketed counting (predictions clipped to
/// [0, 1]) and Keras's formulas for each curve and summation method. Inputs and weights as
/// Precision. State: true_positives, true_negatives, false_positives, false_negatives
/// [num_thresholds].
class AUC : public Metric {
 public:
  /// Raises unless options.num_thresholds >= 2.
  explicit AUC(std::string name = "auc", AucOptions options = {});
  /// Adds one batch's counts at each threshold (inputs and weights as Precision's).
  void update_state(const Tensor& y_true, const Tensor& y_pred,
                    const Tensor& sample_weight = Tensor());
  /// The options given at construction.
  const AucOptions& options() const { return options_; }
  /// The thresholds, end points included (num_thresholds of them).
  const std::vector<double>& thresholds() const { return thresholds_; }

 protected:
  double compute(const MetricState& combined) const override;

 private:
  AucOptions options_;
  std::vector<double> thresholds_;
};

}  // namespace tandem::metrics
