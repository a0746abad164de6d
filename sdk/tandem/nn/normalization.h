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

/// BatchNormalization's options, Keras's arguments with Keras's defaults:
/// `BatchNormalization({.momentum = 0.9, .synchronized = true})`.
struct BatchNormalizationOptions {
  /// moving = moving * momentum + batch statistic * (1 - momentum) (Keras's default 0.99).
  double momentum = 0.99;
  /// Added to the variance before its square root (Keras's default 1e-3).
  double epsilon = 1e-3;
  /// Learn beta, the offset added after normalizing ("<name>/beta", zeros at first).
  bool center = true;
  /// Learn gamma, the factor applied after normalizing ("<name>/gamma", ones at first).
  bool scale = true;
  /// Statistics over the global batch (every replica and worker) instead of the replica's.
  bool synchronized = false;
  /// kRelu applies a ReLU to the output (what BatchNormalization followed by Activation("relu")
  /// computes, with the same weights), in the normalizing pass and its gradient in the
  /// backward's where the one-op batch norm runs. kNone or kRelu. A Sequential fuses a
  /// BatchNormalization followed by ActivationLayer(kRelu) by itself.
  Activation activation = Activation::kNone;
};

/// BatchNormalization's implementation; reach it through BatchNormalization::layer().
class BatchNormalizationImpl : public ModuleImpl {
 public:
  /// See BatchNormalization's constructor.
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

  /// The options the layer was made with.
  const BatchNormalizationOptions& options() const { return options_; }
  /// "<name>/gamma", "<name>/beta" (undefined without scale / center), "<name>/moving_mean",
  /// "<name>/moving_variance" (synchronized on read, aggregated by their mean); built only.
  const Variable& gamma() const { return gamma_; }
  /// See gamma().
  const Variable& beta() const { return beta_; }
  /// See gamma().
  const Variable& moving_mean() const { return moving_mean_; }
  /// See gamma().
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
  /// The implementation class (what Module::as<BatchNormalization>() casts to).
  using Impl = BatchNormalizationImpl;
  /// A batch normalization layer; its variables are sized by the input's last axis at build.
  explicit BatchNormalization(const BatchNormalizationOptions& options = {});
  /// Wraps an existing implementation (another handle to the same layer).
  explicit BatchNormalization(std::shared_ptr<BatchNormalizationImpl> impl);
  /// The implementation: options(), gamma(), beta(), moving_mean(), moving_variance().
  BatchNormalizationImpl& layer() const { return static_cast<BatchNormalizationImpl&>(impl()); }
};

// ---- LayerNormalization ------------------------------------------------------------------------

/// LayerNormalization's options, Keras's arguments with Keras's defaults.
struct LayerNormalizationOptions {
  /// Added to the variance before its square root (Keras's default 1e-3).
  double epsilon = 1e-3;
  /// Learn beta, the offset added after normalizing ("<name>/beta", zeros at first).
  bool center = true;
  /// Learn gamma, the factor applied after normalizing ("<name>/gamma", ones at first).
  bool scale = true;
};

/// LayerNormalization's implementation.
class LayerNormalizationImpl : public ModuleImpl {
 public:
  /// See LayerNormalization's constructor.
  explicit LayerNormalizationImpl(const LayerNormalizationOptions& options);
  std::string type_name() const override { return "LayerNormalization"; }
  Shape compute_output_shape(const Shape& input_shape) const override { return input_shape; }
  /// Each row (every axis but the last) normalized by its own mean and biased variance over the
  /// features; the same in training and inference, no state, and nothing shared between
  /// replicas. 16-bit inputs in float32, as Keras.
  Tensor call(const Tensor& x, bool training) override;
  /// Any leading axes (a sequence of any length); the last must be the built one.
  void check_input(const Tensor& x) const override;
  /// The options the layer was made with.
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
  /// The implementation class (what Module::as<LayerNormalization>() casts to).
  using Impl = LayerNormalizationImpl;
  /// A layer normalization layer; its variables are sized by the input's last axis at build.
  explicit LayerNormalization(const LayerNormalizationOptions& options = {});
  /// Wraps an existing implementation (another handle to the same layer).
  explicit LayerNormalization(std::shared_ptr<LayerNormalizationImpl> impl);
};

}  // namespace tandem::nn
