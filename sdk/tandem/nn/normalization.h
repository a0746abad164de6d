// BatchNormalization and LayerNormalization with Keras's numerics, names and defaults.
// BatchNormalization's meaning under data
// parallelism: the moving statistics are variables synchronized on read (each replica keeps its
// own copy; outside strategy.run and in checkpoints they read as the replicas' mean), and
// `synchronized` computes the batch statistics over every replica of every worker (one
// all-reduce of [sum, sum of squares, count] per layer in the forward pass, and its gradient's
// in the backward pass), as tf.keras's BatchNormalization(synchronized=True).
#pragma once

#include <cstdint>
#include <memory>

#include "tandem/nn/activations.h"
#include "tandem/nn/module.h"

namespace tandem::nn {

struct BatchNormalizationOptions {
  /// moving = moving * momentum + batch statistic * (1 - momentum) (Keras's default 0.99).
  double momentum = 0.99;
  /// Added to the variance before its square root (Keras's default 1e-3).
  double epsilon = 1e-3;
  /// Learn beta (added) and gamma (multiplied).
  bool center = true;
  bool scale = true;
  /// Statistics over the global batch (every replica and worker) instead of the replica's.
  bool synchronized = false;
  /// kRelu applies a ReLU to the output (what BatchNormalization followed by Activation("relu")
  /// computes, with the same weights), in the normalizing pass and its gradient in the
  /// backward's where the one-op batch norm runs. kNone or kRelu. A Sequential fuses a
  /// BatchNormalization followed by ActivationLayer(kRelu) by itself.
  Activation activation = Activation::kNone;
};

class BatchNormalizationImpl : public ModuleImpl {
 public:
  explicit BatchNormalizationImpl(const BatchNormalizationOptions& options);
  std::string type_name() const override { return "BatchNormalization"; }
  Shape compute_output_shape(const Shape& input_shape) const override { return input_shape; }
  /// training: normalizes by the batch's mean and (biased) variance over every axis but the
  /// last (the features), and updates this replica's moving statistics; otherwise by the
  /// moving statistics. 16-bit inputs are normalized in float32 (as Keras does) and returned
  /// in their dtype.
  Tensor call(const Tensor& x, bool training) override;
  /// call(x, training) followed by a ReLU (options().activation kRelu does this in call); the
  /// input already in compute_dtype(). Sequential uses it for a BatchNormalization followed
  /// by ActivationLayer(kRelu).
  Tensor call_then_relu(const Tensor& x, bool training);

  const BatchNormalizationOptions& options() const { return options_; }
  /// "<name>/gamma", "<name>/beta" (undefined without scale / center), "<name>/moving_mean",
  /// "<name>/moving_variance" (synchronized on read, aggregated by their mean); built only.
  const Variable& gamma() const { return gamma_; }
  const Variable& beta() const { return beta_; }
  const Variable& moving_mean() const { return moving_mean_; }
  const Variable& moving_variance() const { return moving_variance_; }

 protected:
  void build_variables(const Shape& input_shape, Generator& generator) override;

 private:
  Tensor normalize(const Tensor& x, bool training, bool relu);

  BatchNormalizationOptions options_;
  Variable gamma_, beta_, moving_mean_, moving_variance_;
};

/// y = gamma * (x - mean) / sqrt(variance + epsilon) + beta over the last axis (Keras's axis=-1).
class BatchNormalization : public Module {
 public:
  using Impl = BatchNormalizationImpl;
  explicit BatchNormalization(const BatchNormalizationOptions& options = {});
  explicit BatchNormalization(std::shared_ptr<BatchNormalizationImpl> impl);
  BatchNormalizationImpl& layer() const { return static_cast<BatchNormalizationImpl&>(impl()); }
};

// ---- LayerNormalization ------------------------------------------------------------------------

struct LayerNormalizationOptions {
  /// Added to the variance before its square root (Keras's default 1e-3).
  double epsilon = 1e-3;
  /// Learn beta (added) and gamma (multiplied).
  bool center = true;
  bool scale = true;
};

class LayerNormalizationImpl : public ModuleImpl {
 public:
  explicit LayerNormalizationImpl(const LayerNormalizationOptions& options);
  std::string type_name() const override { return "LayerNormalization"; }
  Shape compute_output_shape(const Shape& input_shape) const override { return input_shape; }
  /// Each row (every axis but the last) normalized by its own mean and biased variance over the
  /// features; the same in training and inference, no state, and nothing shared between
  /// replicas. 16-bit inputs in float32, as Keras.
  Tensor call(const Tensor& x, bool training) override;
  const LayerNormalizationOptions& options() const { return options_; }

 protected:
  void build_variables(const Shape& input_shape, Generator& generator) override;

 private:
  LayerNormalizationOptions options_;
  Variable gamma_, beta_;
};

/// y = gamma * (x - mean) / sqrt(variance + epsilon) + beta, statistics over the last axis of
/// each example (Keras's axis=-1); weights "<name>/gamma", "<name>/beta".
class LayerNormalization : public Module {
 public:
  using Impl = LayerNormalizationImpl;
  explicit LayerNormalization(const LayerNormalizationOptions& options = {});
  explicit LayerNormalization(std::shared_ptr<LayerNormalizationImpl> impl);
};

}  // namespace tandem::nn
