// Dense, Conv2D, MaxPool2D, AvgPool2D, Add, Embedding, Flatten, Dropout, GlobalAveragePooling2D
// and Activation: shapes, variables and forward passes on ops.
#include "tandem/nn/layers.h"

#include <utility>

#include "tandem/nn/initializers.h"

namespace tandem::nn {

namespace {

const char* padding_name(Padding padding) { return padding == Padding::kSame ? "same" : "valid"; }

/// Output [OH, OW] of a window sliding over [H, W]; raises when the window does not fit.
std::array<int64_t, 2> window_output(const std::string& who, const Shape& input, Size2 window,
                                     Size2 strides, Padding padding) {
  const bool fits = input[0] > 0 && input[1] > 0 &&
                    (padding == Padding::kSame || (input[0] >= window.h && input[1] >= window.w));
  TANDEM_CHECK(fits, who, ": a ", window.h, "x", window.w, " window with padding '",
               padding_name(padding), "' does not fit inputs of shape ", input);
  const int64_t oh = ops::conv_output_size(input[0], window.h, strides.h, padding);
  const int64_t ow = ops::conv_output_size(input[1], window.w, strides.w, padding);
  return {oh, ow};
}

}  // namespace

// ---- Dense -----------------------------------------------------------------------------------

DenseImpl::DenseImpl(int64_t units, Activation activation, bool use_bias)
    : ModuleImpl("dense"), units_(units), activation_(activation), use_bias_(use_bias) {
  TANDEM_CHECK(units > 0, "Dense: units must be positive, got ", units);
}

Shape DenseImpl::compute_output_shape(const Shape& input_shape) const {
  TANDEM_CHECK(input_shape.rank() >= 1 && input_shape[-1] > 0, describe(),
               ": needs inputs with a non-empty last axis, got shape ", input_shape,
               " (without batch)");
  Shape out = input_shape;
  out[-1] = units_;
  return out;
}

void DenseImpl::check_input(const Tensor& x) const {
  TANDEM_CHECK(x.rank() >= 2 && x.dim(-1) == input_shape()[-1], describe(),
               " was built for inputs [batch, ..., ", input_shape()[-1],
               "] but got an input of shape ", x.shape());
}

void DenseImpl::build_variables(const Shape& input_shape, Generator& generator) {
  kernel_ = add_weight("kernel", glorot_uniform({input_shape[-1], units_}, generator, dtype()));
  if (use_bias_) bias_ = add_weight("bias", zeros_initializer({units_}, dtype()));
}

const Variable& DenseImpl::kernel() const {
  TANDEM_CHECK(built(), describe(), " has no kernel before build");
  return kernel_;
}

const Variable& DenseImpl::bias() const {
  TANDEM_CHECK(built(), describe(), " has no bias before build");
  return bias_;
}

Tensor DenseImpl::call(const Tensor& x, bool training) {
  (void)training;
  const int64_t in = x.dim(-1);
  Tensor flat = x;
  if (x.rank() != 2) flat = ops::reshape(x, {x.numel() / in, in});
  // ReLU runs inside the fused op; other activations follow it as their own op.
  const bool fused_relu = activation_ == Activation::kRelu;
  Tensor y =
      ops::dense(flat, autocast(kernel_.value()), use_bias_ ? autocast(bias_.value()) : Tensor(),
                 fused_relu ? ops::FusedActivation::kRelu : ops::FusedActivation::kLinear);
  if (x.rank() != 2) {
    std::vector<int64_t> dims = x.shape().dims();
    dims.back() = units_;
    y = ops::reshape(y, Shape(std::move(dims)));
  }
  return fused_relu ? y : apply_activation(y, activation_);
}

Dense::Dense(int64_t units, Activation activation, bool use_bias)
    : Module(std::make_shared<DenseImpl>(units, activation, use_bias)) {}
Dense::Dense(std::shared_ptr<DenseImpl> impl) : Module(std::move(impl)) {}

// ---- Conv2D ----------------------------------------------------------------------------------

Conv2DImpl::Conv2DImpl(int64_t filters, Size2 kernel_size, Size2 strides, Padding padding,
                       Activation activation, bool use_bias)
    : ModuleImpl("conv2d"),
      filters_(filters),
      kernel_size_(kernel_size),
      strides_(strides),
      padding_(padding),
      activation_(activation),
      use_bias_(use_bias) {
  TANDEM_CHECK(filters > 0, "Conv2D: filters must be positive, got ", filters);
  TANDEM_CHECK(kernel_size.h > 0 && kernel_size.w > 0, "Conv2D: kernel_size must be positive, got ",
               kernel_size.h, "x", kernel_size.w);
  TANDEM_CHECK(strides.h > 0 && strides.w > 0, "Conv2D: strides must be positive, got ", strides.h,
               "x", strides.w);
}

Shape Conv2DImpl::compute_output_shape(const Shape& input_shape) const {
  TANDEM_CHECK(input_shape.rank() == 3, describe(),
               ": needs NHWC inputs, [height, width, channels] without batch; got ", input_shape);
  const auto [oh, ow] = window_output(describe(), input_shape, kernel_size_, strides_, padding_);
  return Shape{oh, ow, filters_};
}

void Conv2DImpl::build_variables(const Shape& input_shape, Generator& generator) {
  kernel_ = add_weight("kernel",
                       glorot_uniform({kernel_size_.h, kernel_size_.w, input_shape[2], filters_},
                                      generator, dtype()));
  if (use_bias_) bias_ = add_weight("bias", zeros_initializer({filters_}, dtype()));
}

const Variable& Conv2DImpl::kernel() const {
  TANDEM_CHECK(built(), describe(), " has no kernel before build");
  return kernel_;
}

const Variable& Conv2DImpl::bias() const {
  TANDEM_CHECK(built(), describe(), " has no bias before build");
  return bias_;
}

Tensor Conv2DImpl::call(const Tensor& x, bool training) {
  (void)training;
  // The bias and ReLU run inside the fused op; other activations follow it as their own op.
  const bool fused_relu = activation_ == Activation::kRelu;
  Tensor y = ops::conv2d(x, autocast(kernel_.value()),
                         use_bias_ ? autocast(bias_.value()) : Tensor(), strides_.array(), padding_,
                         fused_relu ? ops::FusedActivation::kRelu : ops::FusedActivation::kLinear);
  return fused_relu ? y : apply_activation(y, activation_);
}

Conv2D::Conv2D(int64_t filters, Size2 kernel_size, Size2 strides, Padding padding,
               Activation activation, bool use_bias)
    : Module(std::make_shared<Conv2DImpl>(filters, kernel_size, strides, padding, activation,
                                          use_bias)) {}
Conv2D::Conv2D(std::shared_ptr<Conv2DImpl> impl) : Module(std::move(impl)) {}

// ---- MaxPool2D, AvgPool2D --------------------------------------------------------------------

Pool2DImpl::Pool2DImpl(std::string name, const char* layer, Size2 pool_size, Size2 strides,
                       Padding padding)
    : ModuleImpl(std::move(name)),
      pool_size_(pool_size),
      strides_(strides == Size2(0) ? pool_size : strides),
      padding_(padding) {
  TANDEM_CHECK(pool_size.h > 0 && pool_size.w > 0, layer, ": pool_size must be positive, got ",
               pool_size.h, "x", pool_size.w);
  TANDEM_CHECK(strides_.h > 0 && strides_.w > 0, layer, ": strides must be positive, got ",
               strides_.h, "x", strides_.w);
}

Shape Pool2DImpl::compute_output_shape(const Shape& input_shape) const {
  TANDEM_CHECK(input_shape.rank() == 3, describe(),
               ": needs NHWC inputs, [height, width, channels] without batch; got ", input_shape);
  const auto [oh, ow] = window_output(describe(), input_shape, pool_size_, strides_, padding_);
  return Shape{oh, ow, input_shape[2]};
}

MaxPool2DImpl::MaxPool2DImpl(Size2 pool_size, Size2 strides, Padding padding)
    : Pool2DImpl("max_pooling2d", "MaxPool2D", pool_size, strides, padding) {}

Tensor MaxPool2DImpl::call(const Tensor& x, bool training) {
  (void)training;
  return ops::max_pool2d(x, pool_size().array(), strides().array(), padding());
}

MaxPool2D::MaxPool2D(Size2 pool_size, Size2 strides, Padding padding)
    : Module(std::make_shared<MaxPool2DImpl>(pool_size, strides, padding)) {}
MaxPool2D::MaxPool2D(std::shared_ptr<MaxPool2DImpl> impl) : Module(std::move(impl)) {}

// ---- AvgPool2D -------------------------------------------------------------------------------

AvgPool2DImpl::AvgPool2DImpl(Size2 pool_size, Size2 strides, Padding padding)
    : Pool2DImpl("average_pooling2d", "AvgPool2D", pool_size, strides, padding) {}

Tensor AvgPool2DImpl::call(const Tensor& x, bool training) {
  (void)training;
  return ops::avg_pool2d(x, pool_size().array(), strides().array(), padding());
}

AvgPool2D::AvgPool2D(Size2 pool_size, Size2 strides, Padding padding)
    : Module(std::make_shared<AvgPool2DImpl>(pool_size, strides, padding)) {}
AvgPool2D::AvgPool2D(std::shared_ptr<AvgPool2DImpl> impl) : Module(std::move(impl)) {}

// ---- Add -------------------------------------------------------------------------------------

Tensor Add::operator()(const std::vector<Tensor>& inputs) const {
  TANDEM_CHECK(inputs.size() >= 2, "Add '", name_, "': needs at least 2 inputs, got ",
               inputs.size());
  Tensor sum = inputs[0];
  for (size_t i = 1; i < inputs.size(); ++i) {
    TANDEM_CHECK(inputs[i].dtype() == sum.dtype(), "Add '", name_, "': input ", i, " is ",
                 inputs[i].dtype(), ", input 0 is ", inputs[0].dtype());
    sum = ops::add(sum, inputs[i]);
  }
  return sum;
}

// ---- Embedding -------------------------------------------------------------------------------

EmbeddingImpl::EmbeddingImpl(int64_t input_dim, int64_t output_dim)
    : ModuleImpl("embedding"), input_dim_(input_dim), output_dim_(output_dim) {
  TANDEM_CHECK(input_dim > 0, "Embedding: input_dim (the vocabulary size) must be positive, got ",
               input_dim);
  TANDEM_CHECK(output_dim > 0, "Embedding: output_dim must be positive, got ", output_dim);
}

Shape EmbeddingImpl::compute_output_shape(const Shape& input_shape) const {
  std::vector<int64_t> dims = input_shape.dims();
  dims.push_back(output_dim_);
  return Shape(std::move(dims));
}

void EmbeddingImpl::build_variables(const Shape&, Generator& generator) {
  const Tensor initial =
      Tensor::uniform(Shape{input_dim_, output_dim_}, generator, -0.05, 0.05, dtype());
  embeddings_ = add_weight("embeddings", initial, {.row_sparse_gradient = true});
}

Tensor EmbeddingImpl::call(const Tensor& indices, bool training) {
  (void)training;
  TANDEM_CHECK(indices.dtype() == DType::kInt32 || indices.dtype() == DType::kInt64, describe(),
               ": needs int32 or int64 indices, got ", indices.dtype());
  return autocast(ops::embedding(embeddings_.value(), indices));
}

void EmbeddingImpl::check_input(const Tensor& x) const {
  TANDEM_CHECK(x.rank() >= 1, describe(), ": needs indices with a leading batch axis, got shape ",
               x.shape());
}

Tensor EmbeddingImpl::reverse(const Tensor& x) const {
  TANDEM_CHECK(built(), describe(), ": reverse() before the layer is built");
  TANDEM_CHECK(x.rank() >= 2 && x.dim(-1) == output_dim_, describe(),
               ": reverse() needs inputs [..., ", output_dim_, "], got shape ", x.shape());
  return ops::matmul(autocast(x), autocast(embeddings_.value()), false, /*transpose_b=*/true);
}

Embedding::Embedding(int64_t input_dim, int64_t output_dim)
    : Module(std::make_shared<EmbeddingImpl>(input_dim, output_dim)) {}
Embedding::Embedding(std::shared_ptr<EmbeddingImpl> impl) : Module(std::move(impl)) {}

// ---- PositionEmbedding -----------------------------------------------------------------------

PositionEmbeddingImpl::PositionEmbeddingImpl(int64_t sequence_length)
    : ModuleImpl("position_embedding"), sequence_length_(sequence_length) {
  TANDEM_CHECK(sequence_length > 0, "PositionEmbedding: sequence_length must be positive, got ",
               sequence_length);
}

Shape PositionEmbeddingImpl::compute_output_shape(const Shape& input_shape) const {
  TANDEM_CHECK(input_shape.rank() == 2 && input_shape[0] <= sequence_length_, describe(),
               " needs inputs [batch, T, features] with T <= ", sequence_length_,
               ", got an input shape ", input_shape, " without the batch axis");
  return input_shape;
}

void PositionEmbeddingImpl::check_input(const Tensor& x) const {
  TANDEM_CHECK(x.rank() == 3 && x.dim(1) <= sequence_length_ && x.dim(2) == input_shape()[1],
               describe(), " needs inputs [batch, T, ", input_shape()[1],
               "] with T <= ", sequence_length_, ", got shape ", x.shape());
}

void PositionEmbeddingImpl::build_variables(const Shape& input_shape, Generator& generator) {
  embeddings_ = add_weight(
      "embeddings", glorot_uniform(Shape{sequence_length_, input_shape[1]}, generator, dtype()));
}

Tensor PositionEmbeddingImpl::call(const Tensor& x, bool training) {
  (void)training;
  return ops::slice(autocast(embeddings_.value()), 0, x.dim(1));
}

PositionEmbedding::PositionEmbedding(int64_t sequence_length)
    : Module(std::make_shared<PositionEmbeddingImpl>(sequence_length)) {}
PositionEmbedding::PositionEmbedding(std::shared_ptr<PositionEmbeddingImpl> impl)
    : Module(std::move(impl)) {}

// ---- Flatten ---------------------------------------------------------------------------------

FlattenImpl::FlattenImpl() : ModuleImpl("flatten") {}

Shape FlattenImpl::compute_output_shape(const Shape& input_shape) const {
  return Shape{input_shape.numel()};
}

Tensor FlattenImpl::call(const Tensor& x, bool training) {
  (void)training;
  return ops::reshape(x, Shape{x.dim(0), output_shape()[0]});
}

Flatten::Flatten() : Module(std::make_shared<FlattenImpl>()) {}
Flatten::Flatten(std::shared_ptr<FlattenImpl> impl) : Module(std::move(impl)) {}

// ---- Dropout ---------------------------------------------------------------------------------

DropoutImpl::DropoutImpl(double rate)
    : ModuleImpl("dropout"), rate_(rate), generators_(std::make_shared<ReplicaGenerators>()) {
  TANDEM_CHECK(rate >= 0.0 && rate < 1.0, "Dropout: rate must be in [0, 1), got ", rate);
}

void DropoutImpl::set_seed(uint64_t seed) {
  ModuleImpl::set_seed(seed);
  generators_->reseed(seed);
}

void DropoutImpl::set_random_source(std::shared_ptr<ReplicaGenerators> source) {
  TANDEM_CHECK(source != nullptr, describe(), ": null random source");
  generators_ = std::move(source);
}

Tensor DropoutImpl::call(const Tensor& x, bool training) {
  if (!training || rate_ == 0.0) return x;
  return ops::dropout(x, rate_, generators_->local(), /*training=*/true);
}

Dropout::Dropout(double rate) : Module(std::make_shared<DropoutImpl>(rate)) {}
Dropout::Dropout(std::shared_ptr<DropoutImpl> impl) : Module(std::move(impl)) {}

// ---- GlobalAveragePooling2D -----------------------------------------------------------------

Shape GlobalAveragePooling2DImpl::compute_output_shape(const Shape& input_shape) const {
  TANDEM_CHECK(input_shape.rank() == 3, describe(),
               " needs inputs [batch, height, width, channels], got an input shape ", input_shape,
               " without the batch axis");
  return Shape{input_shape[2]};
}

Tensor GlobalAveragePooling2DImpl::call(const Tensor& x, bool) {
  const int64_t batch = x.dim(0), pixels = x.dim(1) * x.dim(2), channels = x.dim(3);
  return ops::mean(ops::reshape(x, Shape{batch, pixels, channels}), 1);
}

GlobalAveragePooling2D::GlobalAveragePooling2D()
    : Module(std::make_shared<GlobalAveragePooling2DImpl>()) {}
GlobalAveragePooling2D::GlobalAveragePooling2D(std::shared_ptr<GlobalAveragePooling2DImpl> impl)
    : Module(std::move(impl)) {}

// ---- Activation ------------------------------------------------------------------------------

Tensor ActivationLayerImpl::call(const Tensor& x, bool) { return apply_activation(x, activation_); }

ActivationLayer::ActivationLayer(Activation activation)
    : Module(std::make_shared<ActivationLayerImpl>(activation)) {}
ActivationLayer::ActivationLayer(std::shared_ptr<ActivationLayerImpl> impl)
    : Module(std::move(impl)) {}

}  // namespace tandem::nn
