// Metric state handling (per replica, summed on read) and the updates of each metric.
#include "tandem/metrics/metrics.h"

#include <cstdlib>

#include "tandem/autograd/tape.h"
#include "tandem/core/error.h"
#include "tandem/ops/ops.h"

namespace tandem::metrics {

namespace {

/// sample_weight broadcast to `shape` as float64 (ones when undefined).
Tensor broadcast_weights(const std::string& metric, const Tensor& sample_weight,
                         const Tensor& values) {
  Tensor w = sample_weight;
  if (w.shape() != values.shape() && w.numel() == values.numel())
    w = ops::reshape(w, values.shape());  // [N, 1] weights for [N] values
  bool ok = false;
  try {
    ok = ops::broadcast_shapes(w.shape(), values.shape()) == values.shape();
  } catch (const Error&) {
  }
  TANDEM_CHECK(ok, metric, ": sample_weight of shape ", sample_weight.shape(),
               " does not broadcast to values of shape ", values.shape());
  return ops::mul(Tensor::ones(values.shape(), DType::kFloat64, values.device()),
                  ops::cast(w, DType::kFloat64));
}

double sum_as_double(const Tensor& x) {
  return ops::sum(ops::cast(x, DType::kFloat64)).item<double>();
}

}  // namespace

// ---- Metric ------------------------------------------------------------------------------------

void Metric::accumulate(double total, double count) {
  MetricState& state = states_.local();
  state.total += total;
  state.count += count;
}

Metric::Metric(std::string name) : name_(std::move(name)), workers_(worker_group()) {}

MetricState Metric::local_state() const {
  MetricState sum;
  states_.for_each([&](int, const MetricState& s) {
    sum.total += s.total;
    sum.count += s.count;
  });
  return sum;
}

MetricState Metric::combined_state() const {
  const MetricState mine = local_state();
  if (!workers_) return mine;
  TANDEM_CHECK(current_replica_binding().num_replicas <= 1, name(),
               ": result() of a metric of a multi-worker job combines every worker's state, a "
               "collective: call it outside strategy.run, on every worker");
  std::vector<double> values = {mine.total, mine.count};
  workers_->sum(values, "metric result (every worker reads its metrics together)");
  return {values[0], values[1]};
}

double Metric::result() const { return compute(combined_state()); }

double Metric::local_result() const { return compute(local_state()); }

int Metric::num_workers() const { return workers_ ? workers_->num_workers() : 1; }

void Metric::reset_state() { states_.clear(); }

void Metric::set_combined_state(const MetricState& state) {
  states_.clear();
  if (!workers_ || workers_->worker_index() == 0) states_.at(0) = state;
}

std::vector<MetricState> Metric::replica_states() const {
  std::vector<MetricState> out;
  states_.for_each([&](int, const MetricState& s) { out.push_back(s); });
  return out;
}

// ---- Mean and Sum ------------------------------------------------------------------------------

void Mean::update_state(const Tensor& values, const Tensor& sample_weight) {
  TANDEM_CHECK(values.defined(), name(), ": update_state with undefined values");
  autograd::NoRecordGuard no_record;  // metrics are never differentiated
  if (!sample_weight.defined()) {
    accumulate(sum_as_double(values), static_cast<double>(values.numel()));
    return;
  }
  Tensor w = broadcast_weights(name(), sample_weight, values);
  accumulate(sum_as_double(ops::mul(ops::cast(values, DType::kFloat64), w)), sum_as_double(w));
}

double Mean::compute(const MetricState& combined) const {
  return combined.count == 0.0 ? 0.0 : combined.total / combined.count;
}

void Sum::update_state(const Tensor& values, const Tensor& sample_weight) {
  TANDEM_CHECK(values.defined(), name(), ": update_state with undefined values");
  autograd::NoRecordGuard no_record;
  if (!sample_weight.defined()) {
    accumulate(sum_as_double(values), static_cast<double>(values.numel()));
    return;
  }
  Tensor w = broadcast_weights(name(), sample_weight, values);
  accumulate(sum_as_double(ops::mul(ops::cast(values, DType::kFloat64), w)), sum_as_double(w));
}

// ---- accuracies --------------------------------------------------------------------------------

void Accuracy::update_state(const Tensor& y_true, const Tensor& y_pred,
                            const Tensor& sample_weight) {
  TANDEM_CHECK(y_true.defined() && y_pred.defined(), name(),
               ": update_state needs y_true and y_pred");
  autograd::NoRecordGuard no_record;
  Tensor t = y_true;
  if (t.shape() != y_pred.shape() && t.numel() == y_pred.numel() &&
      std::abs(t.rank() - y_pred.rank()) == 1)
    t = ops::reshape(t, y_pred.shape());
  TANDEM_CHECK(t.shape() == y_pred.shape(), name(), ": y_true has shape ", y_true.shape(),
               " but y_pred has shape ", y_pred.shape(), "; they must match");
  if (t.dtype() != y_pred.dtype()) t = ops::cast(t, y_pred.dtype());
  Mean::update_state(ops::cast(ops::equal(t, y_pred), DType::kFloat64), sample_weight);
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
  if (labels.dtype() != DType::kInt64) labels = ops::cast(labels, DType::kInt64);
  Mean::update_state(ops::cast(ops::equal(labels, predicted), DType::kFloat64), sample_weight);
}

}  // namespace tandem::metrics
