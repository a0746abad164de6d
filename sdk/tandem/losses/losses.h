// Losses with Keras numerics: per-example functions (sparse/categorical/binary crossentropy,
// mean squared error) and the Loss classes that reduce them (kNone, kSum, kSumOverBatchSize).
// In a multi-replica strategy use Reduction::kNone with tandem::compute_average_loss.
#pragma once

#include <string>

#include "tandem/tensor/tensor.h"

namespace tandem::losses {

/// Keras' backend epsilon: probabilities are clipped to [kEpsilon, 1 - kEpsilon].
inline constexpr double kEpsilon = 1e-7;

/// How a Loss object turns per-example losses into its result (Keras's reduction argument).
enum class Reduction {
  kNone,              ///< per-example losses, shape of y_pred without its last axis
  kSum,               ///< sum of the per-example losses
  kSumOverBatchSize,  ///< their mean (Keras' default); an error inside a multi-replica run
};

// ---- per-example functions (differentiable; they record on gradient tapes) ---------------------

/// y_true: integer class ids [N] (or [N, 1]; any integer dtype, or integral floats);
/// y_pred: [N, C] logits or probabilities -> [N]. Extra leading axes ([N, T] with [N, T, C])
/// are kept. A class id outside [0, C) raises naming the value.
Tensor sparse_categorical_crossentropy(const Tensor& y_true, const Tensor& y_pred,
                                       bool from_logits = false);
/// y_true: one-hot (or soft) targets of y_pred's shape [N, C] -> [N]. Probabilities are first
/// normalised to sum 1, then clipped. label_smoothing s replaces y by y * (1 - s) + s / C.
Tensor categorical_crossentropy(const Tensor& y_true, const Tensor& y_pred,
                                bool from_logits = false, double label_smoothing = 0.0);
/// Elementwise binary crossentropy averaged over the last axis: [N, K] -> [N]. A rank-1 input
/// [N] is taken as [N, 1] (one value per example). label_smoothing s: y * (1 - s) + s / 2.
Tensor binary_crossentropy(const Tensor& y_true, const Tensor& y_pred, bool from_logits = false,
                           double label_smoothing = 0.0);
/// (y_true - y_pred)^2 averaged over the last axis: [N, K] -> [N] ([N] is taken as [N, 1]).
Tensor mean_squared_error(const Tensor& y_true, const Tensor& y_pred);

/// Reduces per-example losses (after multiplying by sample_weight when it is defined; it
/// broadcasts against them). kSumOverBatchSize divides the sum by the number of per-example
/// values (0 for an empty batch) and raises inside a multi-replica strategy run. `loss_name`
/// goes into error messages.
Tensor reduce_loss(const Tensor& per_example, Reduction reduction,
                   const Tensor& sample_weight = Tensor(), const std::string& loss_name = "loss");

// ---- loss objects ------------------------------------------------------------------------------

/// A loss with a reduction: loss(y_true, y_pred[, sample_weight]).
class Loss {
 public:
  virtual ~Loss() = default;
  /// Per-example losses reduced as reduction() says.
  Tensor operator()(const Tensor& y_true, const Tensor& y_pred,
                    const Tensor& sample_weight = Tensor()) const;
  /// The per-example losses, whatever the reduction.
  virtual Tensor per_example(const Tensor& y_true, const Tensor& y_pred) const = 0;
  /// The reduction given at construction.
  Reduction reduction() const { return reduction_; }
  /// Keras name: "sparse_categorical_crossentropy", ...
  const std::string& name() const { return name_; }

 protected:
  /// For subclasses: `name` is the Keras name, `reduction` how operator() reduces.
  Loss(std::string name, Reduction reduction) : name_(std::move(name)), reduction_(reduction) {}

 private:
  std::string name_;
  Reduction reduction_;
};

/// Crossentropy against integer class ids (sparse_categorical_crossentropy): labels [N], logits
/// or probabilities [N, C].
class SparseCategoricalCrossentropy : public Loss {
 public:
  /// Keras's arguments, Keras's defaults: `{.from_logits = true, .reduction = Reduction::kNone}`.
  struct Options {
    /// y_pred holds logits (a softmax is applied inside, stably); false: probabilities.
    bool from_logits = false;
    /// How operator() reduces; use kNone with compute_average_loss under a strategy.
    Reduction reduction = Reduction::kSumOverBatchSize;
  };
  /// Keras's defaults: probabilities, kSumOverBatchSize.
  SparseCategoricalCrossentropy();
  /// With `options`.
  explicit SparseCategoricalCrossentropy(Options options);
  Tensor per_example(const Tensor& y_true, const Tensor& y_pred) const override;

 private:
  Options options_;
};

/// Crossentropy against one-hot (or soft) targets of y_pred's shape (categorical_crossentropy).
class CategoricalCrossentropy : public Loss {
 public:
  /// Keras's arguments, Keras's defaults.
  struct Options {
    /// y_pred holds logits (a softmax is applied inside, stably); false: probabilities.
    bool from_logits = false;
    /// In [0, 1]: targets become y * (1 - s) + s / C.
    double label_smoothing = 0.0;
    /// How operator() reduces; use kNone with compute_average_loss under a strategy.
    Reduction reduction = Reduction::kSumOverBatchSize;
  };
  /// Keras's defaults: probabilities, no smoothing, kSumOverBatchSize.
  CategoricalCrossentropy();
  /// With `options`.
  explicit CategoricalCrossentropy(Options options);
  Tensor per_example(const Tensor& y_true, const Tensor& y_pred) const override;

 private:
  Options options_;
};

/// Binary crossentropy of targets in [0, 1] against one probability (or logit) per value,
/// averaged over the last axis (binary_crossentropy).
class BinaryCrossentropy : public Loss {
 public:
  /// Keras's arguments, Keras's defaults.
  struct Options {
    /// y_pred holds logits (a sigmoid is applied inside, stably); false: probabilities.
    bool from_logits = false;
    /// In [0, 1]: targets become y * (1 - s) + s / 2.
    double label_smoothing = 0.0;
    /// How operator() reduces; use kNone with compute_average_loss under a strategy.
    Reduction reduction = Reduction::kSumOverBatchSize;
  };
  /// Keras's defaults: probabilities, no smoothing, kSumOverBatchSize.
  BinaryCrossentropy();
  /// With `options`.
  explicit BinaryCrossentropy(Options options);
  Tensor per_example(const Tensor& y_true, const Tensor& y_pred) const override;

 private:
  Options options_;
};

/// The squared error averaged over the last axis (mean_squared_error), for regression.
class MeanSquaredError : public Loss {
 public:
  /// Keras's arguments, Keras's defaults.
  struct Options {
    /// How operator() reduces; use kNone with compute_average_loss under a strategy.
    Reduction reduction = Reduction::kSumOverBatchSize;
  };
  /// Keras's default: kSumOverBatchSize.
  MeanSquaredError();
  /// With `options`.
  explicit MeanSquaredError(Options options);
  Tensor per_example(const Tensor& y_true, const Tensor& y_pred) const override;
};

}  // namespace tandem::losses
