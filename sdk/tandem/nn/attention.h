// MultiHeadAttention with Keras's names, weight layouts and numerics, and the EinsumDense
// projections it is made of.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tandem/nn/module.h"

namespace tandem::nn {

// ---- EinsumDense ----------------------------------------------------------------------------

/// The projections of MultiHeadAttention, as Keras's EinsumDense writes them: the last
/// `contracted_axes` axes of the input against a kernel [those axes..., output_dims...], plus a
/// bias [output_dims...]. Keras's equations "abc,cde->abde" (query, key and value: one input
/// axis into [heads, depth]) and "abcd,cde->abe" (attention_output: [heads, depth] into one).
/// It runs as one ops::dense over the flattened axes, so any leading axes (batch, sequence) go
/// through one GEMM.
class EinsumDenseImpl : public ModuleImpl {
 public:
  /// See EinsumDense's constructor.
  EinsumDenseImpl(std::vector<int64_t> output_dims, int64_t contracted_axes, bool use_bias);
  std::string type_name() const override { return "EinsumDense"; }
  Shape compute_output_shape(const Shape& input_shape) const override;
  Tensor call(const Tensor& x, bool training) override;
  /// Any leading axes; the contracted ones must be the built ones.
  void check_input(const Tensor& x) const override;
  /// "<name>/kernel" [contracted..., output...]; built layers only.
  const Variable& kernel() const { return kernel_; }
  /// "<name>/bias" [output...]; undefined without bias.
  const Variable& bias() const { return bias_; }

 protected:
  void build_variables(const Shape& input_shape, Generator& generator) override;

 private:
  std::vector<int64_t> output_dims_;
  int64_t contracted_axes_;
  bool use_bias_;
  Variable kernel_;
  Variable bias_;
};

/// A handle to an EinsumDenseImpl.
class EinsumDense : public Module {
 public:
  /// The implementation class (what Module::as<EinsumDense>() casts to).
  using Impl = EinsumDenseImpl;
  /// An undefined handle.
  EinsumDense() = default;
  /// Contracts the input's last `contracted_axes` axes into `output_dims`.
  EinsumDense(std::vector<int64_t> output_dims, int64_t contracted_axes, bool use_bias = true);
  /// Wraps an existing implementation.
  explicit EinsumDense(std::shared_ptr<EinsumDenseImpl> impl);
  /// See EinsumDenseImpl::kernel().
  const Variable& kernel() const { return layer().kernel(); }
  /// See EinsumDenseImpl::bias().
  const Variable& bias() const { return layer().bias(); }

 private:
  EinsumDenseImpl& layer() const { return static_cast<EinsumDenseImpl&>(impl()); }
};

// ---- MultiHeadAttention ---------------------------------------------------------------------

/// MultiHeadAttention's options: Keras's arguments with Keras's defaults.
struct MultiHeadAttentionOptions {
  /// Depth of each head's values; key_dim when unset.
  std::optional<int64_t> value_dim{};
  /// Dropout on the attention probabilities while training.
  double dropout = 0.0;
  /// Whether the four projections have biases.
  bool use_bias = true;
  /// The output's last axis; the query's when unset.
  std::optional<int64_t> output_shape{};
};

/// What one call of MultiHeadAttention attends with (Keras's call arguments).
struct AttendOptions {
  /// [B, Tq, Tk] (or anything broadcasting to [B, heads, Tq, Tk] once a head axis is added):
  /// query i attends key j where it is true (nonzero).
  Tensor attention_mask{};
  /// Query i attends key j only when j <= i (Keras's use_causal_mask).
  bool use_causal_mask = false;
  /// Dropout on (when the layer's rate is not 0).
  bool training = false;
};

/// MultiHeadAttention's implementation.
class MultiHeadAttentionImpl : public ModuleImpl {
 public:
  /// See MultiHeadAttention's constructor.
  MultiHeadAttentionImpl(int64_t num_heads, int64_t key_dim, MultiHeadAttentionOptions options);
  std::string type_name() const override { return "MultiHeadAttention"; }
  /// [Tq, C] -> [Tq, output_shape].
  Shape compute_output_shape(const Shape& input_shape) const override;
  /// Self-attention, no mask: attend(x, x, x).
  Tensor call(const Tensor& x, bool training) override;
  /// Any sequence length; the feature axis must be the built one.
  void check_input(const Tensor& x) const override;
  void set_random_source(std::shared_ptr<ReplicaGenerators> source) override;
  /// "query_dense", "key_dense", "value_dense", "output_dense": where Keras 3 keeps them.
  std::string keras_child_key(const Module& child) const override;
  /// query [B, Tq, Cq], value [B, Tk, Cv], key [B, Tk, Ck] (undefined: value) -> [B, Tq, out].
  /// Builds on first use from the three feature sizes.
  Tensor attend(const Tensor& query, const Tensor& value, const Tensor& key,
                const AttendOptions& options);

  /// The number of heads.
  int64_t num_heads() const { return num_heads_; }
  /// The depth of each head's queries and keys.
  int64_t key_dim() const { return key_dim_; }
  /// The depth of each head's values.
  int64_t value_dim() const { return value_dim_; }
  /// The dropout rate on the attention probabilities while training.
  double dropout() const { return dropout_; }
  /// The query projection, Keras's "query" ([C, heads, key_dim]).
  const EinsumDense& query_dense() const { return query_; }
  /// The key projection, Keras's "key".
  const EinsumDense& key_dense() const { return key_; }
  /// The value projection, Keras's "value" ([C, heads, value_dim]).
  const EinsumDense& value_dense() const { return value_; }
  /// The output projection, Keras's "attention_output" ([heads, value_dim, out]); built only.
  const EinsumDense& output_dense() const { return output_; }

 protected:
  void build_variables(const Shape& input_shape, Generator& generator) override;

 private:
  int64_t num_heads_, key_dim_, value_dim_;
  double dropout_;
  std::optional<int64_t> output_size_;
  bool use_bias_;
  // The key's and value's feature sizes for build_variables (the query's is the input shape).
  int64_t key_features_ = 0, value_features_ = 0;
  EinsumDense query_, key_, value_, output_;
  std::shared_ptr<ReplicaGenerators> generators_;
};

/// Keras's MultiHeadAttention: the query, key and value projected to `num_heads` heads of
/// key_dim (values: value_dim), scaled dot-product attention per head
/// (ops::scaled_dot_product_attention: fused, memory linear in the sequence) with an optional
/// mask and causal mask, dropout on the probabilities, and the heads projected back to the
/// output size. Weights as Keras's: "query/kernel" [C, heads, key_dim], "query/bias"
/// [heads, key_dim], the same for "key" and "value" (value_dim), "attention_output/kernel"
/// [heads, value_dim, out] and "attention_output/bias" [out], each Glorot-uniform and zeros, in
/// that order (Keras's weights order: query, key, value, attention_output).
class MultiHeadAttention : public Module {
 public:
  /// The implementation class.
  using Impl = MultiHeadAttentionImpl;
  /// `num_heads` heads attending with keys and queries of depth `key_dim`.
  MultiHeadAttention(int64_t num_heads, int64_t key_dim, MultiHeadAttentionOptions options = {});
  /// Wraps an existing implementation.
  explicit MultiHeadAttention(std::shared_ptr<MultiHeadAttentionImpl> impl);
  /// Module's call: self-attention without a mask, layer(x, training).
  using Module::operator();
  /// Keras's layer(query, value, key=None, attention_mask=None, use_causal_mask=False).
  Tensor operator()(const Tensor& query, const Tensor& value, const Tensor& key = Tensor(),
                    const AttendOptions& options = {}) const;
  /// Self-attention with these options: layer(x, x, x, ...).
  Tensor operator()(const Tensor& x, const AttendOptions& options) const;
  /// The implementation.
  MultiHeadAttentionImpl& layer() const { return static_cast<MultiHeadAttentionImpl&>(impl()); }
};

}  // namespace tandem::nn
