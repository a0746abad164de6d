// The GPT of samples/shakespeare_gpt, nanoGPT's model written with Tandem's layers: token and
// learned position embeddings, pre-norm blocks (LayerNormalization, causal MultiHeadAttention,
// LayerNormalization, Dense 4C with GELU, Dense C, each added to the residual stream), a final
// LayerNormalization and the output layer tied to the token embedding. No biases (nanoGPT's
// bias=False); weights drawn as nanoGPT draws them (normal, standard deviation 0.02; the two
// projections into the residual stream 0.02 / sqrt(2 * layers)); LayerNormalization's epsilon
// 1e-5 (PyTorch's). Header-only: the sample, its bench and its tests share it.
#pragma once

#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tandem/tandem.h"

namespace samples::gpt {

namespace td = tandem;
namespace nn = tandem::nn;

struct Config {
  int64_t vocabulary = 0;  ///< distinct tokens (the tokenizer's)
  int64_t block = 64;      ///< context length: the position table's rows
  int64_t layers = 4;
  int64_t heads = 4;
  int64_t embed = 128;   ///< C, a multiple of heads
  double dropout = 0.0;  ///< after the embeddings, on the attention and in each block's MLP
};

/// One pre-norm transformer block.
class BlockImpl : public nn::ModuleImpl {
 public:
  BlockImpl(const Config& c)
      : nn::ModuleImpl("block"),
        ln_1_(add_child("ln_1", nn::LayerNormalization({.epsilon = 1e-5, .center = false}))),
        attention_(add_child("attention",
                             nn::MultiHeadAttention(c.heads, c.embed / c.heads,
                                                    {.dropout = c.dropout, .use_bias = false}))),
        ln_2_(add_child("ln_2", nn::LayerNormalization({.epsilon = 1e-5, .center = false}))),
        expand_(add_child("expand", nn::Dense(4 * c.embed, nn::Activation::kGelu, false))),
        project_(add_child("project", nn::Dense(c.embed, nn::Activation::kNone, false))),
        dropout_(add_child("dropout", nn::Dropout(c.dropout))) {}
  std::string type_name() const override { return "Block"; }
  td::Shape compute_output_shape(const td::Shape& input_shape) const override {
    return input_shape;
  }
  td::Tensor call(const td::Tensor& x, bool training) override {
    const td::Tensor attended =
        attention_(ln_1_(x, training), {.use_causal_mask = true, .training = training});
    const td::Tensor h = td::ops::add(x, attended);
    return td::ops::add(
        h, dropout_(project_(expand_(ln_2_(h, training), training), training), training));
  }
  void check_input(const td::Tensor& x) const override {
    TANDEM_CHECK(x.rank() == 3 && x.dim(2) == input_shape()[1], describe(), " needs [batch, T, ",
                 input_shape()[1], "], got ", x.shape());
  }
  /// The two projections into the residual stream (nanoGPT's c_proj weights).
  std::vector<td::Variable> residual_projections() const {
    return {attention_.layer().output_dense().kernel(), project_.kernel()};
  }

 protected:
  void build_variables(const td::Shape& input_shape, td::Generator& generator) override {
    build_child(ln_1_, input_shape, generator);
    build_child(attention_, input_shape, generator);
    build_child(ln_2_, input_shape, generator);
    std::vector<int64_t> wide = input_shape.dims();
    wide.back() *= 4;
    build_child(expand_, input_shape, generator);
    build_child(project_, td::Shape(wide), generator);
    build_child(dropout_, input_shape, generator);
  }

 private:
  nn::LayerNormalization ln_1_;
  nn::MultiHeadAttention attention_;
  nn::LayerNormalization ln_2_;
  nn::Dense expand_, project_;
  nn::Dropout dropout_;
};

/// The whole model: token ids [batch, T] (T <= block) -> logits [batch, T, vocabulary].
class GptImpl : public nn::ModuleImpl {
 public:
  explicit GptImpl(const Config& c) : nn::ModuleImpl("gpt"), config_(c) {
    TANDEM_CHECK(
        c.vocabulary > 0 && c.block > 0 && c.layers > 0 && c.heads > 0 && c.embed % c.heads == 0,
        "GPT: needs a vocabulary, a block, layers and heads, and an embedding that the "
        "heads divide; got vocabulary ",
        c.vocabulary, ", block ", c.block, ", layers ", c.layers, ", heads ", c.heads, ", embed ",
        c.embed);
    tokens_ = add_child("token_embedding", nn::Embedding(c.vocabulary, c.embed));
    positions_ = add_child("position_embedding", nn::PositionEmbedding(c.block));
    dropout_ = add_child("dropout", nn::Dropout(c.dropout));
    for (int64_t i = 0; i < c.layers; ++i)
      blocks_.push_back(
          add_child("block_" + std::to_string(i), nn::Module(std::make_shared<BlockImpl>(c))));
    ln_f_ = add_child("ln_f", nn::LayerNormalization({.epsilon = 1e-5, .center = false}));
  }
  std::string type_name() const override { return "GPT"; }
  td::Shape compute_output_shape(const td::Shape& input_shape) const override {
    return td::Shape{input_shape[0], config_.vocabulary};
  }
  void check_input(const td::Tensor& ids) const override {
    TANDEM_CHECK(ids.rank() == 2 && ids.dim(1) >= 1 && ids.dim(1) <= config_.block, describe(),
                 " needs token ids [batch, T] with 1 <= T <= ", config_.block, ", got ",
                 ids.shape());
  }
  td::Tensor call(const td::Tensor& ids, bool training) override {
    const td::Tensor tokens = tokens_(ids, training);
    td::Tensor x = dropout_(td::ops::add(tokens, positions_(tokens, training)), training);
    for (const nn::Module& block : blocks_) x = block(x, training);
    // The output layer is the token embedding reversed: one table, used twice.
    return tokens_.reverse(ln_f_(x, training));
  }
  const Config& config() const { return config_; }

 protected:
  void build_variables(const td::Shape& input_shape, td::Generator& generator) override {
    const int64_t t = input_shape[0];
    build_child(tokens_, td::Shape{t}, generator);
    const td::Shape hidden{t, config_.embed};
    build_child(positions_, hidden, generator);
    build_child(dropout_, hidden, generator);
    for (const nn::Module& block : blocks_) build_child(block, hidden, generator);
    build_child(ln_f_, hidden, generator);
    // nanoGPT's initialisation: N(0, 0.02) for the tables and the dense kernels, the residual
    // projections N(0, 0.02 / sqrt(2 * layers)); the layer norms' gains stay 1.
    const double residual = 0.02 / std::sqrt(2.0 * static_cast<double>(config_.layers));
    std::vector<const void*> scaled;
    for (const nn::Module& block : blocks_)
      for (const td::Variable& v :
           static_cast<const BlockImpl&>(block.impl()).residual_projections())
        scaled.push_back(v.id());
    for (const td::Variable& v : weights()) {
      if (v.value().rank() < 2) continue;
      const bool is_residual = std::find(scaled.begin(), scaled.end(), v.id()) != scaled.end();
      // Every replica's copy (a mirrored variable's copies must stay identical).
      v.assign_all(td::Tensor::normal(v.value().shape(), generator, 0.0,
                                      is_residual ? residual : 0.02, v.value().dtype()));
    }
  }

 private:
  Config config_;
  nn::Embedding tokens_{1, 1};
  nn::PositionEmbedding positions_{1};
  nn::Dropout dropout_{0.0};
  std::vector<nn::Module> blocks_;
  nn::LayerNormalization ln_f_;
};

/// A GPT of `config`, not built (Module::build({block}) or the first call builds it).
inline nn::Module make_gpt(const Config& config) {
  return nn::Module(std::make_shared<GptImpl>(config));
}

/// The variables AdamW should not decay: those of rank < 2 (the layer norms' gains), as
/// nanoGPT decays only matrices.
inline std::vector<td::Variable> undecayed(const nn::Module& model) {
  std::vector<td::Variable> out;
  for (const td::Variable& v : model.trainable_variables())
    if (v.value().rank() < 2) out.push_back(v);
  return out;
}

/// Mean cross-entropy per sequence [batch] of next-token logits [batch, T, V] against the next
/// tokens [batch, T] (in float32 whatever the logits' dtype).
inline td::Tensor sequence_losses(const td::Tensor& logits, const td::Tensor& targets) {
  return td::ops::mean(td::ops::sparse_softmax_cross_entropy(logits, targets), 1);
}

}  // namespace samples::gpt
