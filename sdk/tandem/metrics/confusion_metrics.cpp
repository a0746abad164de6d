// Precision, Recall and AUC: Keras's confusion-matrix counts per threshold (keras_rules.cpp),
// added to the calling replica's state, and Keras's formulas on the combined counts
// (keras/src/metrics/confusion_metrics.py).
#include "tandem/metrics/confusion_metrics.h"

#include <algorithm>
#include <cmath>

#include "tandem/core/error.h"
#include "tandem/metrics/internal/keras_rules.h"

namespace tandem::metrics {

namespace {

/// x / y, 0 where y is 0 (Keras's divide_no_nan).
double divide_no_nan(double x, double y) { return y == 0.0 ? 0.0 : x / y; }

const std::vector<double>& checked_thresholds(const std::string& metric,
                                              const std::vector<double>& thresholds) {
  TANDEM_CHECK(!thresholds.empty(), metric, ": needs at least one threshold");
  for (double t : thresholds)
    TANDEM_CHECK(t >= 0.0 && t <= 1.0, metric, ": threshold ", t, " is outside [0, 1]");
  return thresholds;
}

std::vector<MetricVariable> counts(std::initializer_list<const char*> names, size_t thresholds) {
  std::vector<MetricVariable> out;
  for (const char* name : names)
    out.push_back(
        {.name = name, .shape = Shape{static_cast<int64_t>(thresholds)}, .non_negative = true});
  return out;
}

void add(std::vector<double>& to, const std::vector<double>& values) {
  for (size_t i = 0; i < to.size(); ++i) to[i] += values[i];
}

/// numerator / (numerator + other) at each threshold.
std::vector<double> ratios(const MetricState& state, const char* numerator, const char* other) {
  const std::vector<double>& a = state.at(numerator);
  const std::vector<double>& b = state.at(other);
  std::vector<double> out(a.size());
  for (size_t i = 0; i < a.size(); ++i) out[i] = divide_no_nan(a[i], a[i] + b[i]);
  return out;
}

double single(const std::string& metric, const std::vector<double>& values) {
  TANDEM_CHECK(values.size() == 1, metric, ": has ", values.size(), " thresholds, so ",
               values.size(), " values: read them with results()");
  return values[0];
}

}  // namespace

// ---- Precision and Recall ----------------------------------------------------------------------

Precision::Precision(std::string name, std::vector<double> thresholds)
    : Metric(name, counts({"true_positives", "false_positives"},
                          checked_thresholds(name, thresholds).size())),
      thresholds_(std::move(thresholds)),
      evenly_(detail::evenly_distributed(thresholds_)) {}

void Precision::update_state(const Tensor& y_true, const Tensor& y_pred,
                             const Tensor& sample_weight) {
  const detail::ConfusionCounts c = detail::confusion_counts(
      name(), y_true, y_pred, sample_weight, thresholds_, evenly_, /*with_epsilon=*/false);
  MetricState& state = replica_state();
  add(state.at("true_positives"), c.true_positives);
  add(state.at("false_positives"), c.false_positives);
}

std::vector<double> Precision::results() const {
  return ratios(combined_state(), "true_positives", "false_positives");
}

double Precision::compute(const MetricState& combined) const {
  return single(name(), ratios(combined, "true_positives", "false_positives"));
}

Recall::Recall(std::string name, std::vector<double> thresholds)
    : Metric(name, counts({"true_positives", "false_negatives"},
                          checked_thresholds(name, thresholds).size())),
      thresholds_(std::move(thresholds)),
      evenly_(detail::evenly_distributed(thresholds_)) {}

void Recall::update_state(const Tensor& y_true, const Tensor& y_pred, const Tensor& sample_weight) {
  const detail::ConfusionCounts c = detail::confusion_counts(
      name(), y_true, y_pred, sample_weight, thresholds_, evenly_, /*with_epsilon=*/false);
  MetricState& state = replica_state();
  add(state.at("true_positives"), c.true_positives);
  add(state.at("false_negatives"), c.false_negatives);
}

std::vector<double> Recall::results() const {
  return ratios(combined_state(), "true_positives", "false_negatives");
}

double Recall::compute(const MetricState& combined) const {
  return single(name(), ratios(combined, "true_positives", "false_negatives"));
}

// ---- AUC ---------------------------------------------------------------------------------------

namespace {

int checked_num_thresholds(const std::string& metric, int num_thresholds) {
  TANDEM_CHECK(num_thresholds > 1, metric, ": num_thresholds is ", num_thresholds,
               "; it must be > 1");
  return num_thresholds;
}

/// Keras's AUC thresholds: [0 - epsilon, 1 / (n - 1), ..., (n - 2) / (n - 1), 1 + epsilon].
std::vector<double> auc_thresholds(int n) {
  constexpr double kEpsilon = 1e-7;  // keras.backend.epsilon()
  std::vector<double> out = {0.0 - kEpsilon};
  for (int i = 0; i < n - 2; ++i) out.push_back((i + 1) * 1.0 / (n - 1));
  out.push_back(1.0 + kEpsilon);
  return out;
}

/// Keras's AUC.interpolate_pr_auc: the PR area with precision interpolated between thresholds
/// (Davis & Goadrich 2006, in closed form).
double interpolate_pr_auc(const MetricState& s) {
  const std::vector<double>& tp = s.at("true_positives");
  const std::vector<double>& fp = s.at("false_positives");
  const std::vector<double>& fn = s.at("false_negatives");
  double sum = 0.0;
  for (size_t i = 0; i + 1 < tp.size(); ++i) {
    const double dtp = tp[i] - tp[i + 1];
    const double p_a = tp[i] + fp[i], p_b = tp[i + 1] + fp[i + 1];
    const double dp = p_a - p_b;
    const double slope = divide_no_nan(dtp, std::max(dp, 0.0));
    const double intercept = tp[i + 1] - slope * p_b;
    const double ratio = p_a > 0.0 && p_b > 0.0 ? divide_no_nan(p_a, std::max(p_b, 0.0)) : 1.0;
    sum += divide_no_nan(slope * (dtp + intercept * std::log(ratio)),
                         std::max(tp[i + 1] + fn[i + 1], 0.0));
  }
  return sum;
}

}  // namespace

AUC::AUC(std::string name, AucOptions options)
    : Metric(name,
             counts({"true_positives", "true_negatives", "false_positives", "false_negatives"},
                    static_cast<size_t>(checked_num_thresholds(name, options.num_thresholds)))),
      options_(options),
      thresholds_(auc_thresholds(options.num_thresholds)) {}

void AUC::update_state(const Tensor& y_true, const Tensor& y_pred, const Tensor& sample_weight) {
  // Keras's thresholds are evenly spaced with epsilon end points: its bucketed path.
  const detail::ConfusionCounts c =
      detail::confusion_counts(name(), y_true, y_pred, sample_weight, thresholds_,
                               /*evenly=*/true, /*with_epsilon=*/true, options_.from_logits);
  MetricState& state = replica_state();
  add(state.at("true_positives"), c.true_positives);
  add(state.at("true_negatives"), c.true_negatives);
  add(state.at("false_positives"), c.false_positives);
  add(state.at("false_negatives"), c.false_negatives);
}

double AUC::compute(const MetricState& combined) const {
  if (options_.curve == AucCurve::kPr &&
      options_.summation_method == AucSummationMethod::kInterpolation)
    return interpolate_pr_auc(combined);
  const std::vector<double> recall = ratios(combined, "true_positives", "false_negatives");
  // ROC: y = recall over x = the false-positive rate; PR: y = precision over x = recall.
  const std::vector<double> x = options_.curve == AucCurve::kRoc
                                    ? ratios(combined, "false_positives", "true_negatives")
                                    : recall;
  const std::vector<double> y = options_.curve == AucCurve::kRoc
                                    ? recall
                                    : ratios(combined, "true_positives", "false_positives");
  double sum = 0.0;
  for (size_t i = 0; i + 1 < x.size(); ++i) {
    double height = 0.0;
    switch (options_.summation_method) {
      case AucSummationMethod::kInterpolation:
        height = (y[i] + y[i + 1]) / 2.0;
        break;
      case AucSummationMethod::kMinoring:
        height = std::min(y[i], y[i + 1]);
        break;
      case AucSummationMethod::kMajoring:
        height = std::max(y[i], y[i + 1]);
        break;
    }
    sum += (x[i] - x[i + 1]) * height;
  }
  return sum;
}

}  // namespace tandem::metrics
