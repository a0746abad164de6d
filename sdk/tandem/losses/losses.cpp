// Per-example losses on ops (Keras formulas and clipping), and their reductions.
#include "tandem/losses/losses.h"

#include <algorithm>

#include "tandem/autograd/variable.h"
#include "tandem/core/error.h"
#include "tandem/ops/ops.h"

namespace tandem::losses {

namespace {

bool is_integer(DType dtype) {
  return dtype == DType::kInt32 || dtype == DType::kInt64 || dtype == DType::kUInt8 ||
         dtype == DType::kBool;
}

/// Shape without the last axis.
Shape drop_last(const Shape& shape) {
  std::vector<int64_t> dims(shape.begin(), shape.end());
  dims.pop_back();
  return Shape(std::move(dims));
}

/// Brings y_true to y_pred's shape and dtype (Keras' squeeze_or_expand_to_same_rank: a
/// trailing axis of size 1 may be missing or extra), or raises naming both shapes.
Tensor match_targets(const char* loss, const Tensor& y_true, const Tensor& y_pred) {
  TANDEM_CHECK(y_true.defined() && y_pred.defined(), loss, ": y_true and y_pred must be defined");
  TANDEM_CHECK(is_floating(y_pred.dtype()), loss, ": y_pred must be floating point, got ",
               y_pred.dtype());
  Tensor t = y_true;
  if (t.shape() != y_pred.shape() && t.numel() == y_pred.numel()) {
    const int64_t diff = t.rank() - y_pred.rank();
    if ((diff == 1 && t.dim(-1) == 1) || (diff == -1 && y_pred.dim(-1) == 1))
      t = ops::reshape(t, y_pred.shape());
  }
  TANDEM_CHECK(t.shape() == y_pred.shape(), loss, ": y_true has shape ", y_true.shape(),
               " but y_pred has shape ", y_pred.shape(), "; they must match");
  if (t.dtype() != y_pred.dtype()) t = ops::cast(t, y_pred.dtype());
  return t;
}

/// [N] -> [N, 1] so that "mean over the last axis" leaves one value per example.
Tensor with_feature_axis(const Tensor& x) {
  return x.rank() == 1 ? ops::reshape(x, Shape{x.dim(0), 1}) : x;
}

Tensor one_minus(const Tensor& x) { return ops::add(ops::neg(x), 1.0); }

/// True when `from` broadcasts to exactly `to` (numpy rules).
bool broadcasts_to(const Shape& from, const Shape& to) {
  try {
    return ops::broadcast_shapes(from, to) == to;
  } catch (const Error&) {
    return false;
  }
}

}  // namespace

// ---- per-example functions ---------------------------------------------------------------------

Tensor sparse_categorical_crossentropy(const Tensor& y_true, const Tensor& y_pred,
                                       bool from_logits) {
  const char* loss = "sparse_categorical_crossentropy";
  TANDEM_CHECK(y_true.defined() && y_pred.defined(), loss, ": y_true and y_pred must be defined");
  TANDEM_CHECK(y_pred.rank() >= 2, loss, ": y_pred must be [batch, ..., classes], got shape ",
               y_pred.shape());
  TANDEM_CHECK(is_floating(y_pred.dtype()), loss, ": y_pred must be floating point, got ",
               y_pred.dtype());
  const Shape example_shape = drop_last(y_pred.shape());
  Tensor labels = y_true;
  if (labels.rank() == y_pred.rank() && labels.dim(-1) == 1)
    labels = ops::reshape(labels, example_shape);
  TANDEM_CHECK(labels.shape() == example_shape, loss, ": labels of shape ", y_true.shape(),
               " do not fit predictions of shape ", y_pred.shape(), " (want labels of shape ",
               example_shape, ": one class id per example)");
  if (labels.dtype() != DType::kInt32 && labels.dtype() != DType::kInt64) {
    TANDEM_CHECK(is_integer(labels.dtype()) || is_floating(labels.dtype()), loss,
                 ": labels must be class ids, got dtype ", labels.dtype());
    labels = ops::cast(labels, DType::kInt64);
  }
  const int64_t classes = y_pred.dim(-1);
  const int64_t rows = example_shape.numel();
  Tensor logits = y_pred;
  if (!from_logits) {
    // Keras: log of the clipped probabilities, then the (normalising) softmax crossentropy,
    // i.e. -log(p'[label] / sum(p')).
    logits = ops::log(ops::clip(y_pred, kEpsilon, 1.0 - kEpsilon));
  }
  if (y_pred.rank() != 2) {
    logits = ops::reshape(logits, Shape{rows, classes});
    labels = ops::reshape(labels, Shape{rows});
  }
  Tensor out = ops::sparse_softmax_cross_entropy(logits, labels);
  return y_pred.rank() != 2 ? ops::reshape(out, example_shape) : out;
}

Tensor categorical_crossentropy(const Tensor& y_true, const Tensor& y_pred, bool from_logits,
                                double label_smoothing) {
  const char* loss = "categorical_crossentropy";
  TANDEM_CHECK(y_pred.defined() && y_pred.rank() >= 2, loss,
               ": y_pred must be [batch, ..., classes], got shape ",
               y_pred.defined() ? y_pred.shape() : Shape{});
  TANDEM_CHECK(label_smoothing >= 0.0 && label_smoothing <= 1.0, loss,
               ": label_smoothing must be in [0, 1], got ", label_smoothing);
  Tensor t = match_targets(loss, y_true, y_pred);
  if (label_smoothing > 0.0) {
    const double classes = static_cast<double>(y_pred.dim(-1));
    t = ops::add(ops::mul(t, 1.0 - label_smoothing), label_smoothing / classes);
  }
  Tensor log_p;
  if (from_logits) {
    log_p = ops::log_softmax(y_pred, -1);
  } else {
    Tensor p = ops::div(y_pred, ops::sum(y_pred, -1, /*keepdims=*/true));
    log_p = ops::log(ops::clip(p, kEpsilon, 1.0 - kEpsilon));
  }
  return ops::neg(ops::sum(ops::mul(t, log_p), -1));
}

Tensor binary_crossentropy(const Tensor& y_true, const Tensor& y_pred, bool from_logits,
                           double label_smoothing) {
  const char* loss = "binary_crossentropy";
  TANDEM_CHECK(label_smoothing >= 0.0 && label_smoothing <= 1.0, loss,
               ": label_smoothing must be in [0, 1], got ", label_smoothing);
  TANDEM_CHECK(y_pred.defined() && y_pred.rank() >= 1, loss,
               ": y_pred needs a batch axis, got a scalar");
  Tensor t = with_feature_axis(match_targets(loss, y_true, y_pred));
  Tensor z = with_feature_axis(y_pred);
  if (label_smoothing > 0.0)
    t = ops::add(ops::mul(t, 1.0 - label_smoothing), 0.5 * label_smoothing);
  Tensor elementwise;
  if (from_logits) {
    // max(z, 0) - z * t + log1p(exp(-|z|)): stable for large |z|.
    elementwise = ops::add(ops::sub(ops::relu(z), ops::mul(z, t)),
                           ops::log1p(ops::exp(ops::neg(ops::abs(z)))));
  } else {
    Tensor p = ops::clip(z, kEpsilon, 1.0 - kEpsilon);
    Tensor bce = ops::add(ops::mul(t, ops::log(p)), ops::mul(one_minus(t), ops::log(one_minus(p))));
    elementwise = ops::neg(bce);
  }
  return ops::mean(elementwise, -1);
}

Tensor mean_squared_error(const Tensor& y_true, const Tensor& y_pred) {
  const char* loss = "mean_squared_error";
  TANDEM_CHECK(y_pred.defined() && y_pred.rank() >= 1, loss,
               ": y_pred needs a batch axis, got a scalar");
  Tensor t = with_feature_axis(match_targets(loss, y_true, y_pred));
  return ops::mean(ops::square(ops::sub(t, with_feature_axis(y_pred))), -1);
}

// ---- reduction ---------------------------------------------------------------------------------

Tensor reduce_loss(const Tensor& per_example, Reduction reduction, const Tensor& sample_weight,
                   const std::string& loss_name) {
  Tensor values = per_example;
  if (sample_weight.defined()) {
    Tensor w = sample_weight;
    if (w.shape() != values.shape() && w.numel() == values.numel())
      w = ops::reshape(w, values.shape());  // [N, 1] weights for [N] losses
    TANDEM_CHECK(broadcasts_to(w.shape(), values.shape()), loss_name, ": sample_weight of shape ",
                 sample_weight.shape(), " does not broadcast to the per-example losses of shape ",
                 values.shape());
    if (w.dtype() != values.dtype()) w = ops::cast(w, values.dtype());
    values = ops::mul(values, w);
  }
  switch (reduction) {
    case Reduction::kNone:
      return values;
    case Reduction::kSum:
      return ops::sum(values);
    case Reduction::kSumOverBatchSize: {
      const ReplicaBinding binding = current_replica_binding();
      // The job's replicas (every worker's), at least this process's.
      const int replicas = std::max(binding.num_replicas, binding.num_replicas_in_sync);
      TANDEM_CHECK(replicas <= 1, loss_name,
                   ": Reduction::kSumOverBatchSize inside a strategy.run of ", replicas,
                   " replicas would divide by this replica's batch instead of the global "
                   "batch; create the loss with .reduction = tandem::losses::Reduction::kNone "
                   "and reduce it with tandem::compute_average_loss(per_example_loss, "
                   "global_batch_size)");
      const int64_t n = values.numel();
      if (n == 0) return ops::sum(values);  // an empty batch contributes 0, as divide_no_nan
      return ops::div(ops::sum(values),
                      Tensor::scalar(static_cast<double>(n), values.dtype(), values.device()));
    }
  }
  TANDEM_THROW(loss_name, ": unknown reduction ", static_cast<int>(reduction));
}

// ---- loss objects ------------------------------------------------------------------------------

Tensor Loss::operator()(const Tensor& y_true, const Tensor& y_pred,
                        const Tensor& sample_weight) const {
  return reduce_loss(per_example(y_true, y_pred), reduction_, sample_weight, name_);
}

SparseCategoricalCrossentropy::SparseCategoricalCrossentropy()
    : SparseCategoricalCrossentropy(Options{}) {}
SparseCategoricalCrossentropy::SparseCategoricalCrossentropy(Options options)
    : Loss("sparse_categorical_crossentropy", options.reduction), options_(options) {}
Tensor SparseCategoricalCrossentropy::per_example(const Tensor& y_true,
                                                  const Tensor& y_pred) const {
  return sparse_categorical_crossentropy(y_true, y_pred, options_.from_logits);
}

CategoricalCrossentropy::CategoricalCrossentropy() : CategoricalCrossentropy(Options{}) {}
CategoricalCrossentropy::CategoricalCrossentropy(Options options)
    : Loss("categorical_crossentropy", options.reduction), options_(options) {}
Tensor CategoricalCrossentropy::per_example(const Tensor& y_true, const Tensor& y_pred) const {
  return categorical_crossentropy(y_true, y_pred, options_.from_logits, options_.label_smoothing);
}

BinaryCrossentropy::BinaryCrossentropy() : BinaryCrossentropy(Options{}) {}
BinaryCrossentropy::BinaryCrossentropy(Options options)
    : Loss("binary_crossentropy", options.reduction), options_(options) {}
Tensor BinaryCrossentropy::per_example(const Tensor& y_true, const Tensor& y_pred) const {
  return binary_crossentropy(y_true, y_pred, options_.from_logits, options_.label_smoothing);
}

MeanSquaredError::MeanSquaredError() : MeanSquaredError(Options{}) {}
MeanSquaredError::MeanSquaredError(Options options)
    : Loss("mean_squared_error", options.reduction) {}
Tensor MeanSquaredError::per_example(const Tensor& y_true, const Tensor& y_pred) const {
  return mean_squared_error(y_true, y_pred);
}

}  // namespace tandem::losses
