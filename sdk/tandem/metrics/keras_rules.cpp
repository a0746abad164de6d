// Keras's metric input rules on host float64 arrays (internal/keras_rules.h), following
// keras/src/losses/loss.py (squeeze_or_expand_to_same_rank), keras/src/metrics/
// reduction_metrics.py (Mean and Sum) and keras/src/metrics/metrics_utils.py (confusion matrices).
#include "tandem/metrics/internal/keras_rules.h"

#include <algorithm>
#include <cmath>

#include "tandem/core/error.h"

namespace tandem::metrics::detail {

namespace {

/// Drops the last axis (of size 1).
void squeeze_last(HostArray& x) {
  std::vector<int64_t> dims = x.shape.dims();
  dims.pop_back();
  x.shape = Shape(std::move(dims));
}

/// Adds a last axis of size 1.
void expand_last(HostArray& x) {
  std::vector<int64_t> dims = x.shape.dims();
  dims.push_back(1);
  x.shape = Shape(std::move(dims));
}

/// The mean (or sum) over every axis from `first_axis` on (a reduction of trailing axes).
HostArray reduce_trailing(const HostArray& x, int64_t first_axis, SampleReduction reduction) {
  if (first_axis >= x.shape.rank()) return x;
  std::vector<int64_t> kept(x.shape.dims().begin(), x.shape.dims().begin() + first_axis);
  int64_t inner = 1;
  for (int64_t a = first_axis; a < x.shape.rank(); ++a) inner *= x.shape[a];
  HostArray out{Shape(kept), {}};
  const int64_t outer = out.shape.numel();
  out.values.resize(static_cast<size_t>(outer));
  for (int64_t i = 0; i < outer; ++i) {
    double sum = 0.0;
    for (int64_t k = 0; k < inner; ++k) sum += x.values[static_cast<size_t>(i * inner + k)];
    // An empty mean is NaN in Keras (mean of nothing); it only arises for empty axes.
    out.values[static_cast<size_t>(i)] =
        reduction == SampleReduction::kMean ? sum / static_cast<double>(inner) : sum;
  }
  return out;
}

/// Whether `from` broadcasts to `to` (numpy's rules, without adding axes to `to`).
bool broadcasts_to(const Shape& from, const Shape& to) {
  if (from.rank() > to.rank()) return false;
  for (int64_t a = 1; a <= from.rank(); ++a)
    if (from[-a] != 1 && from[-a] != to[-a]) return false;
  return true;
}

double sum_of(const std::vector<double>& v) {
  double sum = 0.0;
  for (double x : v) sum += x;
  return sum;
}

}  // namespace

HostArray to_host(const Tensor& x) { return {x.shape(), x.to_vector<double>()}; }

void squeeze_or_expand_to_same_rank(HostArray& x1, HostArray& x2, bool expand_rank_1) {
  const int64_t r1 = x1.shape.rank(), r2 = x2.shape.rank();
  if (r1 == r2) return;
  if (r1 == r2 + 1 && x1.shape[-1] == 1) {
    if (r2 == 1 && expand_rank_1)
      expand_last(x2);
    else
      squeeze_last(x1);
  }
  if (r2 == r1 + 1 && x2.shape[-1] == 1) {
    if (r1 == 1 && expand_rank_1)
      expand_last(x1);
    else
      squeeze_last(x2);
  }
}

HostArray broadcast_to(const HostArray& x, const Shape& shape, const std::string& metric,
                       const char* what) {
  if (x.shape == shape) return x;
  TANDEM_CHECK(broadcasts_to(x.shape, shape), metric, ": ", what, " of shape ", x.shape,
               " does not broadcast to shape ", shape);
  const int64_t rank = shape.rank();
  // Stride of each output axis in x (0 where x broadcasts along it).
  std::vector<int64_t> stride(static_cast<size_t>(rank), 0);
  const std::vector<int64_t> x_strides = x.shape.strides();
  for (int64_t a = 0; a < x.shape.rank(); ++a) {
    const int64_t d = x.shape[a];
    if (d != 1)
      stride[static_cast<size_t>(rank - x.shape.rank() + a)] = x_strides[static_cast<size_t>(a)];
  }
  HostArray out{shape, std::vector<double>(static_cast<size_t>(shape.numel()))};
  std::vector<int64_t> index(static_cast<size_t>(rank), 0);
  for (size_t i = 0; i < out.values.size(); ++i) {
    int64_t at = 0;
    for (int64_t a = 0; a < rank; ++a)
      at += index[static_cast<size_t>(a)] * stride[static_cast<size_t>(a)];
    out.values[i] = x.values[static_cast<size_t>(at)];
    for (int64_t a = rank - 1; a >= 0; --a) {
      if (++index[static_cast<size_t>(a)] < shape[a]) break;
      index[static_cast<size_t>(a)] = 0;
    }
  }
  return out;
}

std::pair<double, double> samplewise_update(HostArray values, const Tensor& sample_weight,
                                            SampleReduction reduction, const std::string& metric,
                                            const char* values_what) {
  if (!sample_weight.defined()) {
    values = reduce_trailing(values, 1, reduction);
    const double samples = values.shape.rank() >= 1 ? static_cast<double>(values.shape[0]) : 1.0;
    return {sum_of(values.values), samples};
  }
  const Shape values_shape = values.shape;
  HostArray weight = to_host(sample_weight);
  squeeze_or_expand_to_same_rank(values, weight);
  const int64_t weight_rank = weight.shape.rank();
  if (values.shape.rank() > weight_rank) values = reduce_trailing(values, weight_rank, reduction);
  TANDEM_CHECK(broadcasts_to(weight.shape, values.shape), metric, ": sample_weight of shape ",
               sample_weight.shape(), " does not fit ", values_what, " of shape ", values_shape,
               " (Keras's rule: the ", values_what, " are reduced to the weights' rank, here to ",
               "shape ", values.shape, ", and the weights must broadcast to that; weights [N] ",
               "or [N, 1] weigh the samples)");
  weight = broadcast_to(weight, values.shape, metric, "sample_weight");
  for (size_t i = 0; i < values.values.size(); ++i) values.values[i] *= weight.values[i];
  if (weight_rank > 1) weight = reduce_trailing(weight, 1, reduction);
  values = reduce_trailing(values, 1, reduction);
  return {sum_of(values.values), sum_of(weight.values)};
}

bool evenly_distributed(const std::vector<double>& thresholds) {
  const size_t n = thresholds.size();
  if (n < 3) return false;
  for (size_t i = 0; i < n; ++i) {
    // numpy: np.arange(n, dtype=float32) / (n - 1) is float32; allclose(rtol=1e-5, atol=1e-7).
    const double even = static_cast<double>(static_cast<float>(i) / static_cast<float>(n - 1));
    if (!(std::abs(thresholds[i] - even) <= 1e-7 + 1e-5 * std::abs(even))) return false;
  }
  return true;
}

ConfusionCounts confusion_counts(const std::string& metric, const Tensor& y_true,
                                 const Tensor& y_pred, const Tensor& sample_weight,
                                 const std::vector<double>& thresholds, bool evenly,
                                 bool with_epsilon, bool sigmoid_first) {
  TANDEM_CHECK(y_true.defined() && y_pred.defined(), metric,
               ": update_state needs y_true and y_pred");
  HostArray truth = to_host(y_true), pred = to_host(y_pred);
  if (sigmoid_first)
    for (double& p : pred.values) p = 1.0 / (1.0 + std::exp(-p));
  squeeze_or_expand_to_same_rank(pred, truth);
  TANDEM_CHECK(truth.shape == pred.shape, metric, ": y_true has shape ", y_true.shape(),
               " but y_pred has shape ", y_pred.shape(), "; they must match");
  std::vector<double> weights;  // one per prediction; empty: every weight is 1
  if (sample_weight.defined()) {
    HostArray weight = to_host(sample_weight);
    expand_last(weight);
    // Keras: squeeze_or_expand_to_same_rank(y_true, sample_weight, expand_rank_1=False), of
    // which only the weights are kept.
    HostArray labels_view{truth.shape, {}};
    squeeze_or_expand_to_same_rank(labels_view, weight, /*expand_rank_1=*/false);
    weights = broadcast_to(weight, pred.shape, metric, "sample_weight").values;
  }
  const size_t n = thresholds.size();
  ConfusionCounts out{std::vector<double>(n, 0.0), std::vector<double>(n, 0.0),
                      std::vector<double>(n, 0.0), std::vector<double>(n, 0.0)};
  const size_t count = pred.values.size();
  if (evenly) {
    // Bucket b holds the predictions in (t_b, t_b+1]; the count above threshold i is the sum of
    // buckets i and up (a reversed cumulative sum), as Keras's optimized path computes it.
    std::vector<double> tp_bucket(n, 0.0), fp_bucket(n, 0.0);
    double total_true = 0.0, total_false = 0.0;
    for (size_t j = 0; j < count; ++j) {
      const double w = weights.empty() ? 1.0 : weights[j];
      const double label = truth.values[j] != 0.0 ? 1.0 : 0.0;
      const double true_label = label * w, false_label = (1.0 - label) * w;
      total_true += true_label;
      total_false += false_label;
      const double p = std::clamp(pred.values[j], 0.0, 1.0);
      double bucket = std::ceil(p * (static_cast<double>(n) - 1.0)) - 1.0;
      if (with_epsilon) bucket = std::max(bucket, 0.0);
      // unsorted_segment_sum drops negative segment ids, and a NaN prediction's (its cast to
      // an integer id is negative there); NaN must not reach the cast below (undefined).
      if (!(bucket >= 0.0)) continue;
      tp_bucket[static_cast<size_t>(bucket)] += true_label;
      fp_bucket[static_cast<size_t>(bucket)] += false_label;
    }
    double tp = 0.0, fp = 0.0;
    for (size_t i = n; i-- > 0;) {
      tp += tp_bucket[i];
      fp += fp_bucket[i];
      out.true_positives[i] = tp;
      out.false_positives[i] = fp;
      out.false_negatives[i] = total_true - tp;
      out.true_negatives[i] = total_false - fp;
    }
    return out;
  }
  for (size_t j = 0; j < count; ++j) {
    const double w = weights.empty() ? 1.0 : weights[j];
    const bool label = truth.values[j] != 0.0;
    for (size_t i = 0; i < n; ++i) {
      const bool positive = pred.values[j] > thresholds[i];
      (label ? (positive ? out.true_positives : out.false_negatives)
             : (positive ? out.false_positives : out.true_negatives))[i] += w;
    }
  }
  return out;
}

}  // namespace tandem::metrics::detail
