// The updates of the mean metrics: Mean, Sum, Accuracy, SparseCategoricalAccuracy, and (on the
// host, Keras's rules) BinaryAccuracy and CategoricalAccuracy.
#include "tandem/metrics/metrics.h"

#include <cmath>
#include <utility>
#include <vector>

#include "tandem/autograd/tape.h"
#include "tandem/core/error.h"
#include "tandem/metrics/internal/keras_rules.h"
#include "tandem/ops/ops.h"

namespace tandem::metrics {

using detail::SampleReduction;

// ---- Mean and Sum ------------------------------------------------------------------------------

void Mean::accumulate(double total, double count) {
  MetricState& state = replica_state();
  state.at("total")[0] += total;
  state.at("count")[0] += count;
}

void Mean::update_state(const Tensor& values, const Tensor& sample_weight) {
  TANDEM_CHECK(values.defined(), name(), ": update_state with undefined values");
  const auto [total, count] = detail::samplewise_update(detail::to_host(values), sample_weight,
                                                        SampleReduction::kMean, name());
  accumulate(total, count);
}

double Mean::compute(const MetricState& combined) const {
  const double count = combined.scalar("count");
  return count == 0.0 ? 0.0 : combined.scalar("total") / count;
}

void Sum::update_state(const Tensor& values, const Tensor& sample_weight) {
  TANDEM_CHECK(values.defined(), name(), ": update_state with undefined values");
  const auto [total, count] = detail::samplewise_update(detail::to_host(values), sample_weight,
                                                        SampleReduction::kSum, name());
  MetricState& state = replica_state();
  state.at("total")[0] += total;
  state.at("count")[0] += count;
}

// ---- accuracies --------------------------------------------------------------------------------

void Accuracy::update_state(const Tensor& y_true, const Tensor& y_pred,
                            const Tensor& sample_weight) {
  TANDEM_CHECK(y_true.defined() && y_pred.defined(), name(),
               ": update_state needs y_true and y_pred");
  autograd::NoRecordGuard no_record;  // metrics are never differentiated
  // Keras's accuracy: the ranks matched (squeeze_or_expand_to_same_rank), y_true compared in
  // y_pred's dtype, element by element.
  detail::HostArray truth{y_true.shape(), {}}, pred{y_pred.shape(), {}};
  detail::squeeze_or_expand_to_same_rank(truth, pred);
  TANDEM_CHECK(truth.shape == pred.shape, name(), ": y_true has shape ", y_true.shape(),
               " but y_pred has shape ", y_pred.shape(), "; they must match");
  Tensor t = ops::reshape(y_true, truth.shape);
  if (t.dtype() != y_pred.dtype()) t = ops::cast(t, y_pred.dtype());
  const Tensor matches = ops::equal(t, ops::reshape(y_pred, pred.shape));
  const auto [total, count] = detail::samplewise_update(
      detail::to_host(matches), sample_weight, SampleReduction::kMean, name(), "the matches");
  accumulate(total, count);
}

void SparseCategoricalAccuracy::update_state(const Tensor& y_true, const Tensor& y_pred,
                                             const Tensor& sample_weight) {
  TANDEM_CHECK(y_true.defined() && y_pred.defined(), name(),
               ": update_state needs y_true and y_pred");
  TANDEM_CHECK(y_pred.rank() >= 2, name(), ": y_pred must be [batch, ..., classes], got shape ",
               y_pred.shape());
  autograd::NoRecordGuard no_record;
  Tensor predicted = ops::argmax(y_pred, -1);  // int64, y_pred's shape without the last axis
  Tensor labels = y_true;
  if (labels.rank() == y_pred.rank() && labels.dim(-1) == 1)
    labels = ops::reshape(labels, predicted.shape());
  TANDEM_CHECK(labels.shape() == predicted.shape(), name(), ": labels of shape ", y_true.shape(),
               " do not fit predictions of shape ", y_pred.shape(), " (want labels of shape ",
               predicted.shape(), ")");
  // Keras compares in y_pred's (floating) dtype: a label of 1.5 matches no class.
  const std::vector<double> label_values = labels.to_vector<double>();
  detail::HostArray matches = detail::to_host(predicted);
  for (size_t i = 0; i < matches.values.size(); ++i)
    matches.values[i] = matches.values[i] == label_values[i] ? 1.0 : 0.0;
  // Keras's matches drop a last axis of 1 ([N, 1] for y_pred [N, 1, C] weighs as [N]).
  if (matches.shape.rank() > 1 && matches.shape[-1] == 1) {
    std::vector<int64_t> dims = matches.shape.dims();
    dims.pop_back();
    matches.shape = Shape(std::move(dims));
  }
  const auto [total, count] = detail::samplewise_update(
      std::move(matches), sample_weight, SampleReduction::kMean, name(), "the matches");
  accumulate(total, count);
}

// ---- Keras's binary and categorical accuracy (host) ---------------------------------------------

BinaryAccuracy::BinaryAccuracy(std::string name, double threshold)
    : Mean(std::move(name)), threshold_(threshold) {
  TANDEM_CHECK(std::isfinite(threshold), this->name(), ": threshold ", threshold, " is not finite");
}

void BinaryAccuracy::update_state(const Tensor& y_true, const Tensor& y_pred,
                                  const Tensor& sample_weight) {
  TANDEM_CHECK(y_true.defined() && y_pred.defined(), name(),
               ": update_state needs y_true and y_pred");
  detail::HostArray truth = detail::to_host(y_true), pred = detail::to_host(y_pred);
  detail::squeeze_or_expand_to_same_rank(truth, pred);
  TANDEM_CHECK(truth.shape == pred.shape, name(), ": y_true has shape ", y_true.shape(),
               " but y_pred has shape ", y_pred.shape(), "; they must match");
  // Keras: equal(y_true, cast(y_pred > cast(threshold, y_pred.dtype), y_true.dtype)): the
  // threshold is first rounded to y_pred's dtype (0.3 in float32 is 0.300000012).
  const double threshold =
      ops::cast(Tensor::from_vector<double>({threshold_}, Shape{}), y_pred.dtype()).item<double>();
  for (size_t i = 0; i < pred.values.size(); ++i)
    pred.values[i] = truth.values[i] == (pred.values[i] > threshold ? 1.0 : 0.0) ? 1.0 : 0.0;
  const auto [total, count] = detail::samplewise_update(std::move(pred), sample_weight,
                                                        detail::SampleReduction::kMean, name());
  accumulate(total, count);
}

namespace {

/// argmax over the last axis of `x` (the first index of the largest value).
detail::HostArray argmax_last(const detail::HostArray& x) {
  std::vector<int64_t> dims = x.shape.dims();
  const int64_t classes = dims.back();
  dims.pop_back();
  detail::HostArray out{Shape(dims), {}};
  const int64_t rows = out.shape.numel();
  out.values.resize(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) {
    const double* row = x.values.data() + r * classes;
    int64_t best = 0;
    for (int64_t c = 1; c < classes; ++c)
      if (row[c] > row[best]) best = c;
    out.values[static_cast<size_t>(r)] = static_cast<double>(best);
  }
  return out;
}

}  // namespace

void CategoricalAccuracy::update_state(const Tensor& y_true, const Tensor& y_pred,
                                       const Tensor& sample_weight) {
  TANDEM_CHECK(y_true.defined() && y_pred.defined(), name(),
               ": update_state needs y_true and y_pred");
  TANDEM_CHECK(y_pred.rank() >= 1 && y_pred.dim(-1) >= 1 && y_true.shape() == y_pred.shape(),
               name(), ": y_true (one-hot) has shape ", y_true.shape(), " and y_pred ",
               y_pred.shape(), "; both must be [..., classes] of the same shape");
  const detail::HostArray labels = argmax_last(detail::to_host(y_true));
  detail::HostArray matches = argmax_last(detail::to_host(y_pred));
  for (size_t i = 0; i < matches.values.size(); ++i)
    matches.values[i] = matches.values[i] == labels.values[i] ? 1.0 : 0.0;
  const auto [total, count] = detail::samplewise_update(std::move(matches), sample_weight,
                                                        detail::SampleReduction::kMean, name());
  accumulate(total, count);
}

}  // namespace tandem::metrics
