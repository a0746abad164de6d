#include "tandem/nn/attention.h"

#include <cmath>
#include <utility>

#include "tandem/nn/initializers.h"
#include "tandem/ops/ops.h"

namespace tandem::nn {

namespace {

int64_t product(const std::vector<int64_t>& dims, size_t begin, size_t end) {
  int64_t p = 1;
  for (size_t i = begin; i < end; ++i) p *= dims[i];
  return p;
}

/// num_heads, once every argument of MultiHeadAttention is checked (before the projections are
/// made from them).
int64_t checked(int64_t num_heads, int64_t key_dim, const MultiHeadAttentionOptions& options) {
  TANDEM_CHECK(num_heads > 0, "MultiHeadAttention: num_heads must be positive, got ", num_heads);
  TANDEM_CHECK(key_dim > 0, "MultiHeadAttention: key_dim must be positive, got ", key_dim);
  TANDEM_CHECK(options.value_dim.value_or(1) > 0,
               "MultiHeadAttention: value_dim must be positive, got ", *options.value_dim);
  TANDEM_CHECK(options.dropout >= 0.0 && options.dropout < 1.0,
               "MultiHeadAttention: dropout must be in [0, 1), got ", options.dropout);
  TANDEM_CHECK(options.output_shape.value_or(1) > 0,
               "MultiHeadAttention: output_shape must be positive, got ", *options.output_shape);
  return num_heads;
}

}  // namespace

// ---- EinsumDense ----------------------------------------------------------------------------

EinsumDenseImpl::EinsumDenseImpl(std::vector<int64_t> output_dims, int64_t contracted_axes,
                                 bool use_bias)
    : ModuleImpl("einsum_dense"),
      output_dims_(std::move(output_dims)),
      contracted_axes_(contracted_axes),
      use_bias_(use_bias) {
  TANDEM_CHECK(contracted_axes >= 1, "EinsumDense: needs at least one contracted axis, got ",
               contracted_axes);
  TANDEM_CHECK(!output_dims_.empty(), "EinsumDense: needs at least one output axis");
  for (int64_t d : output_dims_)
    TANDEM_CHECK(d > 0, "EinsumDense: output axes must be positive, got ", Shape(output_dims_));
}

Shape EinsumDenseImpl::compute_output_shape(const Shape& input_shape) const {
  TANDEM_CHECK(input_shape.rank() >= contracted_axes_, describe(), " contracts the last ",
               contracted_axes_, " axes of its input, got an input shape ", input_shape,
               " without the batch axis");
  std::vector<int64_t> dims(input_shape.dims().begin(),
                            input_shape.dims().end() - contracted_axes_);
  dims.insert(dims.end(), output_dims_.begin(), output_dims_.end());
  return Shape(std::move(dims));
}

void EinsumDenseImpl::check_input(const Tensor& x) const {
  const std::vector<int64_t>& in = input_shape().dims();
  const auto n = static_cast<size_t>(contracted_axes_);
  bool ok = x.rank() >= contracted_axes_ + 1;
  for (size_t i = 0; ok && i < n; ++i)
    ok = x.dim(x.rank() - contracted_axes_ + static_cast<int64_t>(i)) == in[in.size() - n + i];
  TANDEM_CHECK(ok, describe(), " was built to contract axes ",
               Shape(std::vector<int64_t>(in.end() - static_cast<ptrdiff_t>(n), in.end())),
               " but got an input of shape ", x.shape());
}

void EinsumDenseImpl::build_variables(const Shape& input_shape, Generator& generator) {
  std::vector<int64_t> kernel_dims(input_shape.dims().end() - contracted_axes_,
                                   input_shape.dims().end());
  kernel_dims.insert(kernel_dims.end(), output_dims_.begin(), output_dims_.end());
  kernel_ = add_weight("kernel", glorot_uniform(Shape(kernel_dims), generator, dtype()));
  if (use_bias_) bias_ = add_weight("bias", zeros_initializer(Shape(output_dims_), dtype()));
}

Tensor EinsumDenseImpl::call(const Tensor& x, bool training) {
  (void)training;
  const std::vector<int64_t>& kernel_dims = kernel_.value().shape().dims();
  const auto n = static_cast<size_t>(contracted_axes_);
  const int64_t depth = product(kernel_dims, 0, n);
  const int64_t width = product(kernel_dims, n, kernel_dims.size());
  const Tensor kernel = ops::reshape(autocast(kernel_.value()), Shape{depth, width});
  const Tensor bias = use_bias_ ? ops::reshape(autocast(bias_.value()), Shape{width}) : Tensor();
  const Tensor rows = ops::reshape(x, Shape{x.numel() / depth, depth});
  std::vector<int64_t> dims(x.shape().dims().begin(), x.shape().dims().end() - contracted_axes_);
  dims.insert(dims.end(), output_dims_.begin(), output_dims_.end());
  return ops::reshape(ops::dense(rows, kernel, bias), Shape(std::move(dims)));
}

EinsumDense::EinsumDense(std::vector<int64_t> output_dims, int64_t contracted_axes, bool use_bias)
    : Module(std::make_shared<EinsumDenseImpl>(std::move(output_dims), contracted_axes, use_bias)) {
}
EinsumDense::EinsumDense(std::shared_ptr<EinsumDenseImpl> impl) : Module(std::move(impl)) {}

// ---- MultiHeadAttention ---------------------------------------------------------------------

MultiHeadAttentionImpl::MultiHeadAttentionImpl(int64_t num_heads, int64_t key_dim,
                                               MultiHeadAttentionOptions options)
    : ModuleImpl("multi_head_attention"),
      num_heads_(checked(num_heads, key_dim, options)),
      key_dim_(key_dim),
      value_dim_(options.value_dim.value_or(key_dim)),
      dropout_(options.dropout),
      output_size_(options.output_shape),
      use_bias_(options.use_bias),
      query_(std::vector<int64_t>{num_heads, key_dim}, 1, options.use_bias),
      key_(std::vector<int64_t>{num_heads, key_dim}, 1, options.use_bias),
      value_(std::vector<int64_t>{num_heads, options.value_dim.value_or(key_dim)}, 1,
             options.use_bias),
      generators_(std::make_shared<ReplicaGenerators>()) {
  // Keras's sub-layer names; the output projection is made at build, once the output size is
  // known (the query's features unless output_shape was given), and comes last, as in Keras.
  query_ = add_child("query", query_);
  key_ = add_child("key", key_);
  value_ = add_child("value", value_);
}

Shape MultiHeadAttentionImpl::compute_output_shape(const Shape& input_shape) const {
  TANDEM_CHECK(input_shape.rank() >= 2, describe(),
               " needs inputs [batch, sequence, features], got an input shape ", input_shape,
               " without the batch axis");
  std::vector<int64_t> dims = input_shape.dims();
  dims.back() = output_size_.value_or(input_shape[-1]);
  return Shape(std::move(dims));
}

void MultiHeadAttentionImpl::check_input(const Tensor& x) const {
  const Shape& in = input_shape();
  TANDEM_CHECK(x.rank() == in.rank() + 1 && x.dim(-1) == in[-1], describe(),
               " was built for queries of ", in[-1], " features ([batch, sequence, ", in[-1],
               "]) but got a query of shape ", x.shape());
}

void MultiHeadAttentionImpl::set_random_source(std::shared_ptr<ReplicaGenerators> source) {
  TANDEM_CHECK(source != nullptr, describe(), ": null random source");
  generators_ = std::move(source);
  ModuleImpl::set_random_source(generators_);
}

std::string MultiHeadAttentionImpl::keras_child_key(const Module& child) const {
  return child.name() == "attention_output" ? "output_dense" : child.name() + "_dense";
}

void MultiHeadAttentionImpl::build_variables(const Shape& input_shape, Generator& generator) {
  const int64_t query_features = input_shape[-1];
  const int64_t key_features = key_features_ > 0 ? key_features_ : query_features;
  const int64_t value_features = value_features_ > 0 ? value_features_ : query_features;
  std::vector<int64_t> sequence(input_shape.dims().begin(), input_shape.dims().end() - 1);
  auto with_features = [&](int64_t features) {
    std::vector<int64_t> dims = sequence;
    dims.push_back(features);
    return Shape(std::move(dims));
  };
  build_child(query_, with_features(query_features), generator);
  build_child(key_, with_features(key_features), generator);
  build_child(value_, with_features(value_features), generator);
  output_ = add_child("attention_output",
                      EinsumDense({output_size_.value_or(query_features)}, 2, use_bias_));
  std::vector<int64_t> heads = sequence;
  heads.push_back(num_heads_);
  heads.push_back(value_dim_);
  build_child(output_, Shape(std::move(heads)), generator);
}

Tensor MultiHeadAttentionImpl::call(const Tensor& x, bool training) {
  return attend(x, x, x, {.training = training});
}

Tensor MultiHeadAttentionImpl::attend(const Tensor& query, const Tensor& value,
                                      const Tensor& key_in, const AttendOptions& options) {
  const Tensor& key = key_in.defined() ? key_in : value;
  for (const Tensor* t : {&query, &value, &key})
    TANDEM_CHECK(t->defined() && t->rank() == 3, describe(),
                 " needs query, value and key [batch, sequence, features], got shapes ",
                 query.defined() ? query.shape() : Shape{}, ", ",
                 value.defined() ? value.shape() : Shape{}, " and ",
                 key.defined() ? key.shape() : Shape{});
  TANDEM_CHECK(
      query.dim(0) == value.dim(0) && key.dim(0) == value.dim(0) && key.dim(1) == value.dim(1),
      describe(), ": query ", query.shape(), ", value ", value.shape(), " and key ", key.shape(),
      " need one batch size, and key and value one sequence length");
  if (!built()) {
    key_features_ = key.dim(-1);
    value_features_ = value.dim(-1);
    Generator generator(seed(), kInitializerStream);
    build(Shape{query.dim(1), query.dim(2)}, generator);
  }
  check_input(query);
  // [B, T, heads, depth] -> [B, heads, T, depth] for the attention, and back.
  const std::vector<int64_t> to_heads{0, 2, 1, 3};
  const Tensor q = ops::transpose(query_(autocast(query), options.training), to_heads);
  const Tensor k = ops::transpose(key_(autocast(key), options.training), to_heads);
  const Tensor v = ops::transpose(value_(autocast(value), options.training), to_heads);
  Tensor mask = options.attention_mask;
  if (mask.defined() && mask.rank() == 3)  // [B, Tq, Tk]: the same for every head
    mask = ops::reshape(mask, Shape{mask.dim(0), 1, mask.dim(1), mask.dim(2)});
  const bool dropping = options.training && dropout_ > 0.0;
  const Tensor attended =
      ops::scaled_dot_product_attention(q, k, v,
                                        {.causal = options.use_causal_mask,
                                         .mask = mask,
                                         .dropout_rate = dropping ? dropout_ : 0.0,
                                         .generator = dropping ? &generators_->local() : nullptr,
                                         .scale = 1.0 / std::sqrt(static_cast<double>(key_dim_))});
  return output_(ops::transpose(attended, to_heads), options.training);
}

MultiHeadAttention::MultiHeadAttention(int64_t num_heads, int64_t key_dim,
                                       MultiHeadAttentionOptions options)
    : Module(std::make_shared<MultiHeadAttentionImpl>(num_heads, key_dim, options)) {}
MultiHeadAttention::MultiHeadAttention(std::shared_ptr<MultiHeadAttentionImpl> impl)
    : Module(std::move(impl)) {}

Tensor MultiHeadAttention::operator()(const Tensor& query, const Tensor& value, const Tensor& key,
                                      const AttendOptions& options) const {
  return layer().attend(query, value, key, options);
}

Tensor MultiHeadAttention::operator()(const Tensor& x, const AttendOptions& options) const {
  return layer().attend(x, x, x, options);
}

}  // namespace tandem::nn
