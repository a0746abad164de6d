// The built-in layers: Dense, Conv2D, MaxPool2D, Flatten, Dropout, GlobalAveragePooling2D and
// ActivationLayer (Keras's Activation; normalization layers: normalization.h). Each is a Module
// handle (pass it by value; copies alias one layer) over its *Impl class; names, weight names and
// initialisers follow Keras (kernel [in, out] / [kh, kw, in, out], Glorot uniform; zero bias).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tandem/nn/activations.h"
#include "tandem/nn/module.h"
#include "tandem/ops/ops.h"

namespace tandem::nn {

/// Padding of Conv2D and MaxPool2D (TensorFlow rules: kSame puts the extra row/column at the
/// bottom/right).
using Padding = ops::Padding;

/// A 2-D size (height, width); one integer means the same for both, as in Keras.
struct Size2 {
  /// The same size for both axes (Keras's `kernel_size=3`); implicit, so `3` converts.
  Size2(int64_t both) : h(both), w(both) {}  // NOLINT(google-explicit-constructor): Keras style
  /// `height` rows by `width` columns.
  Size2(int64_t height, int64_t width) : h(height), w(width) {}
  /// {h, w}, as the ops take window sizes and strides.
  std::array<int64_t, 2> array() const { return {h, w}; }
  friend bool operator==(const Size2& a, const Size2& b) { return a.h == b.h && a.w == b.w; }
  /// Height: the size along axis H of an NHWC tensor.
  int64_t h;
  /// Width: the size along axis W.
  int64_t w;
};

// ---- Dense -----------------------------------------------------------------------------------

/// Dense's implementation; reach it through Dense::layer().
class DenseImpl : public ModuleImpl {
 public:
  /// See Dense's constructor.
  DenseImpl(int64_t units, Activation activation, bool use_bias);
  std::string type_name() const override { return "Dense"; }
  Shape compute_output_shape(const Shape& input_shape) const override;
  Tensor call(const Tensor& x, bool training) override;
  /// Any rank >= 2 whose last axis is the built input size (like Keras' InputSpec).
  void check_input(const Tensor& x) const override;

  /// The output size: the last axis of the output.
  int64_t units() const { return units_; }
  /// The activation applied after the bias (Activation::kNone for none).
  Activation activation() const { return activation_; }
  /// Whether the layer has a bias.
  bool use_bias() const { return use_bias_; }
  /// "<name>/kernel" [in, units] and "<name>/bias" [units] (undefined without bias); built only.
  const Variable& kernel() const;
  /// See kernel().
  const Variable& bias() const;

 protected:
  void build_variables(const Shape& input_shape, Generator& generator) override;

 private:
  int64_t units_;
  Activation activation_;
  bool use_bias_;
  Variable kernel_;
  Variable bias_;
};

/// y = activation(x @ kernel + bias) over the last axis of x.
class Dense : public Module {
 public:
  /// The implementation class (what Module::as<Dense>() casts to).
  using Impl = DenseImpl;
  /// A layer of `units` outputs, its kernel Glorot-uniform and its bias zero (Keras's defaults);
  /// built from the first input's last axis.
  explicit Dense(int64_t units, Activation activation = Activation::kNone, bool use_bias = true);
  /// Wraps an existing implementation (another handle to the same layer).
  explicit Dense(std::shared_ptr<DenseImpl> impl);
  /// The implementation: units(), activation(), use_bias().
  DenseImpl& layer() const { return static_cast<DenseImpl&>(impl()); }
  /// "<name>/kernel", [in, units]; built layers only.
  const Variable& kernel() const { return layer().kernel(); }
  /// "<name>/bias", [units]; undefined without bias; built layers only.
  const Variable& bias() const { return layer().bias(); }
};

// ---- Conv2D ----------------------------------------------------------------------------------

/// Conv2D's implementation; reach it through Conv2D::layer().
class Conv2DImpl : public ModuleImpl {
 public:
  /// See Conv2D's constructor.
  Conv2DImpl(int64_t filters, Size2 kernel_size, Size2 strides, Padding padding,
             Activation activation, bool use_bias);
  std::string type_name() const override { return "Conv2D"; }
  Shape compute_output_shape(const Shape& input_shape) const override;
  Tensor call(const Tensor& x, bool training) override;

  /// The number of output channels.
  int64_t filters() const { return filters_; }
  /// The window's height and width.
  Size2 kernel_size() const { return kernel_size_; }
  /// The window's step along H and W.
  Size2 strides() const { return strides_; }
  /// kValid (no padding) or kSame (output size ceil(input / stride)).
  Padding padding() const { return padding_; }
  /// The activation applied after the bias (Activation::kNone for none).
  Activation activation() const { return activation_; }
  /// Whether the layer has a bias.
  bool use_bias() const { return use_bias_; }
  /// "<name>/kernel" [kh, kw, in, filters] and "<name>/bias" [filters]; built only.
  const Variable& kernel() const;
  /// See kernel().
  const Variable& bias() const;

 protected:
  void build_variables(const Shape& input_shape, Generator& generator) override;

 private:
  int64_t filters_;
  Size2 kernel_size_;
  Size2 strides_;
  Padding padding_;
  Activation activation_;
  bool use_bias_;
  Variable kernel_;
  Variable bias_;
};

/// 2-D cross-correlation over NHWC inputs ([H, W, C] without batch), plus bias, then
/// activation. Glorot fans: kh*kw*in and kh*kw*filters.
class Conv2D : public Module {
 public:
  /// The implementation class (what Module::as<Conv2D>() casts to).
  using Impl = Conv2DImpl;
  /// `filters` output channels from a `kernel_size` window moved by `strides`; kernel
  /// Glorot-uniform, bias zero (Keras's defaults).
  Conv2D(int64_t filters, Size2 kernel_size, Size2 strides = 1, Padding padding = Padding::kValid,
         Activation activation = Activation::kNone, bool use_bias = true);
  /// Wraps an existing implementation (another handle to the same layer).
  explicit Conv2D(std::shared_ptr<Conv2DImpl> impl);
  /// The implementation: filters(), kernel_size(), strides(), padding(), ...
  Conv2DImpl& layer() const { return static_cast<Conv2DImpl&>(impl()); }
  /// "<name>/kernel", [kh, kw, in, filters]; built layers only.
  const Variable& kernel() const { return layer().kernel(); }
  /// "<name>/bias", [filters]; undefined without bias; built layers only.
  const Variable& bias() const { return layer().bias(); }
};

// ---- MaxPool2D, AvgPool2D --------------------------------------------------------------------

/// What the pooling layers share: the window, its strides and padding, and the output shape.
class Pool2DImpl : public ModuleImpl {
 public:
  Shape compute_output_shape(const Shape& input_shape) const override;
  /// The window's height and width.
  Size2 pool_size() const { return pool_size_; }
  /// The window's step along H and W (pool_size() when constructed with 0).
  Size2 strides() const { return strides_; }
  /// kValid (windows inside the input only) or kSame (output size ceil(input / stride)).
  Padding padding() const { return padding_; }

 protected:
  /// `name`: the Keras auto-name prefix; `layer`: the C++ class named in errors. `strides` 0
  /// means pool_size.
  Pool2DImpl(std::string name, const char* layer, Size2 pool_size, Size2 strides, Padding padding);

 private:
  Size2 pool_size_;
  Size2 strides_;
  Padding padding_;
};

/// MaxPool2D's implementation.
class MaxPool2DImpl : public Pool2DImpl {
 public:
  /// See MaxPool2D's constructor.
  MaxPool2DImpl(Size2 pool_size, Size2 strides, Padding padding);
  std::string type_name() const override { return "MaxPooling2D"; }
  Tensor call(const Tensor& x, bool training) override;
};

/// Max pooling over NHWC inputs (Keras MaxPooling2D; its default name is max_pooling2d).
class MaxPool2D : public Module {
 public:
  /// The implementation class (what Module::as<MaxPool2D>() casts to).
  using Impl = MaxPool2DImpl;
  /// `strides` 0 (the default) means pool_size, as Keras' strides=None.
  explicit MaxPool2D(Size2 pool_size = 2, Size2 strides = 0, Padding padding = Padding::kValid);
  /// Wraps an existing implementation (another handle to the same layer).
  explicit MaxPool2D(std::shared_ptr<MaxPool2DImpl> impl);
};

/// AvgPool2D's implementation.
class AvgPool2DImpl : public Pool2DImpl {
 public:
  /// See AvgPool2D's constructor.
  AvgPool2DImpl(Size2 pool_size, Size2 strides, Padding padding);
  std::string type_name() const override { return "AveragePooling2D"; }
  Tensor call(const Tensor& x, bool training) override;
};

/// Average pooling over NHWC inputs (Keras AveragePooling2D; its default name is
/// average_pooling2d). With Padding::kSame a window at the border averages only the inputs inside
/// the image, as TensorFlow does.
class AvgPool2D : public Module {
 public:
  /// The implementation class (what Module::as<AvgPool2D>() casts to).
  using Impl = AvgPool2DImpl;
  /// `strides` 0 (the default) means pool_size, as Keras' strides=None.
  explicit AvgPool2D(Size2 pool_size = 2, Size2 strides = 0, Padding padding = Padding::kValid);
  /// Wraps an existing implementation (another handle to the same layer).
  explicit AvgPool2D(std::shared_ptr<AvgPool2DImpl> impl);
};
/// Keras's other name for the layer.
using AveragePooling2D = AvgPool2D;

// ---- Add -------------------------------------------------------------------------------------

/// Keras's Add merging layer: the sum of its inputs, added left to right (broadcasting as
/// ops::add). It has no weights, so it is a function object rather than a Module: in a user
/// module's call, `add_({y, shortcut})` reads as Keras's `Add()([y, shortcut])`.
class Add {
 public:
  /// `name` is the layer's Keras name (only descriptive: Add has no weights).
  explicit Add(std::string name = "add") : name_(std::move(name)) {}
  /// The name given to the constructor.
  const std::string& name() const { return name_; }
  /// Keras class name: "Add".
  std::string type_name() const { return "Add"; }
  /// inputs[0] + inputs[1] + ...; raises for fewer than two inputs, inputs of different
  /// dtypes, or shapes that do not broadcast. Records on active gradient tapes.
  Tensor operator()(const std::vector<Tensor>& inputs) const;

 private:
  std::string name_;
};

// ---- Embedding -------------------------------------------------------------------------------

/// Embedding's implementation.
class EmbeddingImpl : public ModuleImpl {
 public:
  /// See Embedding's constructor.
  EmbeddingImpl(int64_t input_dim, int64_t output_dim);
  std::string type_name() const override { return "Embedding"; }
  Shape compute_output_shape(const Shape& input_shape) const override;
  Tensor call(const Tensor& indices, bool training) override;
  /// Indices of any shape (the built one is only the first call's): a language model embeds a
  /// prompt shorter than its training windows.
  void check_input(const Tensor& x) const override;
  /// x [..., output_dim] against every row: x @ embeddings^T -> [..., input_dim], in the compute
  /// dtype. A language model's output layer tied to its input embedding (keras_hub's
  /// ReversibleEmbedding(reverse=True)): one variable, its gradient the sum of both uses.
  Tensor reverse(const Tensor& x) const;
  /// The number of rows: indices lie in [0, input_dim).
  int64_t input_dim() const { return input_dim_; }
  /// The length of each row: the size of the output's last axis.
  int64_t output_dim() const { return output_dim_; }
  /// "<name>/embeddings", [input_dim, output_dim]; built layers only.
  const Variable& embeddings() const { return embeddings_; }

 protected:
  void build_variables(const Shape& input_shape, Generator& generator) override;

 private:
  int64_t input_dim_, output_dim_;
  Variable embeddings_;
};

/// Keras's Embedding: integer indices [batch, ...] in [0, input_dim) -> their rows of the
/// weight "embeddings" [input_dim, output_dim] (initialised uniform in [-0.05, 0.05], Keras's
/// "uniform"), in the compute dtype. The table's gradient is row-sparse
/// (VariableOptions::row_sparse_gradient): across replicas the optimizer sums it by gathering
/// the rows the replicas touched or by one dense all-reduce, whichever moves fewer bytes, with
/// the same result bit for bit (docs/layers.md).
class Embedding : public Module {
 public:
  /// The implementation class (what Module::as<Embedding>() casts to).
  using Impl = EmbeddingImpl;
  /// A table of `input_dim` rows of `output_dim` values.
  Embedding(int64_t input_dim, int64_t output_dim);
  /// Wraps an existing implementation (another handle to the same layer).
  explicit Embedding(std::shared_ptr<EmbeddingImpl> impl);
  /// "<name>/embeddings", [input_dim, output_dim]; built layers only.
  const Variable& embeddings() const { return layer().embeddings(); }
  /// See EmbeddingImpl::reverse (built layers only).
  Tensor reverse(const Tensor& x) const { return layer().reverse(x); }

 private:
  EmbeddingImpl& layer() const { return static_cast<EmbeddingImpl&>(impl()); }
};

// ---- PositionEmbedding -----------------------------------------------------------------------

/// PositionEmbedding's implementation.
class PositionEmbeddingImpl : public ModuleImpl {
 public:
  /// See PositionEmbedding's constructor.
  explicit PositionEmbeddingImpl(int64_t sequence_length);
  std::string type_name() const override { return "PositionEmbedding"; }
  /// [T, C] -> [T, C] for T <= sequence_length.
  Shape compute_output_shape(const Shape& input_shape) const override;
  Tensor call(const Tensor& x, bool training) override;
  /// [batch, T, C] with T up to sequence_length and the built C.
  void check_input(const Tensor& x) const override;
  /// The longest sequence: the rows of the table.
  int64_t sequence_length() const { return sequence_length_; }
  /// "<name>/embeddings", [sequence_length, C]; built layers only.
  const Variable& embeddings() const { return embeddings_; }

 protected:
  void build_variables(const Shape& input_shape, Generator& generator) override;

 private:
  int64_t sequence_length_;
  Variable embeddings_;
};

/// Learned position embeddings, as keras_hub's PositionEmbedding: a table "embeddings"
/// [sequence_length, C] (Glorot-uniform) whose first T rows are position 0..T-1's. Called on
/// x [batch, T, C] it returns those rows, [T, C], to add to x (they broadcast over the batch):
/// `h = token_embedding(ids) + position_embedding(token_embedding(ids))`.
class PositionEmbedding : public Module {
 public:
  /// The implementation class (what Module::as<PositionEmbedding>() casts to).
  using Impl = PositionEmbeddingImpl;
  /// Positions 0 .. sequence_length - 1.
  explicit PositionEmbedding(int64_t sequence_length);
  /// Wraps an existing implementation (another handle to the same layer).
  explicit PositionEmbedding(std::shared_ptr<PositionEmbeddingImpl> impl);
  /// "<name>/embeddings", [sequence_length, C]; built layers only.
  const Variable& embeddings() const { return layer().embeddings(); }

 private:
  PositionEmbeddingImpl& layer() const { return static_cast<PositionEmbeddingImpl&>(impl()); }
};

// ---- Flatten ---------------------------------------------------------------------------------

/// Flatten's implementation.
class FlattenImpl : public ModuleImpl {
 public:
  /// A Flatten layer (Keras auto-name "flatten").
  FlattenImpl();
  std::string type_name() const override { return "Flatten"; }
  Shape compute_output_shape(const Shape& input_shape) const override;
  Tensor call(const Tensor& x, bool training) override;
};

/// [N, d1, d2, ...] -> [N, d1 * d2 * ...].
class Flatten : public Module {
 public:
  /// The implementation class (what Module::as<Flatten>() casts to).
  using Impl = FlattenImpl;
  /// A Flatten layer; it has no weights.
  Flatten();
  /// Wraps an existing implementation (another handle to the same layer).
  explicit Flatten(std::shared_ptr<FlattenImpl> impl);
};

// ---- Dropout ---------------------------------------------------------------------------------

/// Dropout's implementation.
class DropoutImpl : public ModuleImpl {
 public:
  /// See Dropout's constructor.
  explicit DropoutImpl(double rate);
  std::string type_name() const override { return "Dropout"; }
  Shape compute_output_shape(const Shape& input_shape) const override { return input_shape; }
  Tensor call(const Tensor& x, bool training) override;
  /// Any shape (as Keras's Dropout): it acts on each element.
  void check_input(const Tensor& x) const override { (void)x; }
  /// A standalone Dropout reseeds its own streams; inside a Sequential the model's seed rules.
  void set_seed(uint64_t seed) override;
  void set_random_source(std::shared_ptr<ReplicaGenerators> source) override;
  /// The fraction of values dropped while training, in [0, 1).
  double rate() const { return rate_; }
  /// The per-replica random streams the masks are drawn from.
  ReplicaGenerators& generators() const { return *generators_; }

 private:
  double rate_;
  std::shared_ptr<ReplicaGenerators> generators_;
};

/// Inverted dropout while training (kept values scaled by 1 / (1 - rate)); identity otherwise.
/// The mask comes from the calling replica's stream of the model's ReplicaGenerators.
class Dropout : public Module {
 public:
  /// The implementation class (what Module::as<Dropout>() casts to).
  using Impl = DropoutImpl;
  /// Drops each value with probability `rate`, in [0, 1), while training.
  explicit Dropout(double rate);
  /// Wraps an existing implementation (another handle to the same layer).
  explicit Dropout(std::shared_ptr<DropoutImpl> impl);
};

// ---- GlobalAveragePooling2D -----------------------------------------------------------------

/// GlobalAveragePooling2D's implementation.
class GlobalAveragePooling2DImpl : public ModuleImpl {
 public:
  GlobalAveragePooling2DImpl() : ModuleImpl("global_average_pooling2d") {}
  std::string type_name() const override { return "GlobalAveragePooling2D"; }
  /// [H, W, C] -> [C]; raises for another rank.
  Shape compute_output_shape(const Shape& input_shape) const override;
  Tensor call(const Tensor& x, bool training) override;
};

/// The mean over the two spatial axes of NHWC inputs: [N, H, W, C] -> [N, C].
class GlobalAveragePooling2D : public Module {
 public:
  /// The implementation class (what Module::as<GlobalAveragePooling2D>() casts to).
  using Impl = GlobalAveragePooling2DImpl;
  /// A GlobalAveragePooling2D layer; it has no weights.
  GlobalAveragePooling2D();
  /// Wraps an existing implementation (another handle to the same layer).
  explicit GlobalAveragePooling2D(std::shared_ptr<GlobalAveragePooling2DImpl> impl);
};

// ---- Activation ------------------------------------------------------------------------------

/// ActivationLayer's implementation.
class ActivationLayerImpl : public ModuleImpl {
 public:
  /// See ActivationLayer's constructor.
  explicit ActivationLayerImpl(Activation activation)
      : ModuleImpl("activation"), activation_(activation) {}
  std::string type_name() const override { return "Activation"; }
  Shape compute_output_shape(const Shape& input_shape) const override { return input_shape; }
  Tensor call(const Tensor& x, bool training) override;
  /// The function applied element-wise.
  Activation activation() const { return activation_; }

 private:
  Activation activation_;
};

/// Keras's Activation layer (the C++ name leaves `Activation` to the enum): applies
/// `activation` element-wise, e.g. after a BatchNormalization.
class ActivationLayer : public Module {
 public:
  /// The implementation class (what Module::as<ActivationLayer>() casts to).
  using Impl = ActivationLayerImpl;
  /// A layer that applies `activation`; it has no weights.
  explicit ActivationLayer(Activation activation);
  /// Wraps an existing implementation (another handle to the same layer).
  explicit ActivationLayer(std::shared_ptr<ActivationLayerImpl> impl);
};

}  // namespace tandem::nn
