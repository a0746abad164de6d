// MultiHeadAttention without Keras at hand: Keras's weight names, shapes and order; the output
// against the same attention written with ops from the layer's own weights (projections as
// matrix products, per-head softmax with the causal mask); a mask given per batch; dropout only
// while training; and the shapes it refuses. Parity with Keras itself:
// tests/checkpoint/test_keras_attention.cpp.
#include <catch2/catch.hpp>
#include <cmath>

#include "support/compare.h"
#include "tandem/tandem.h"

namespace td = tandem;
namespace nn = tandem::nn;
using td::testing::relative_difference;

namespace {

/// Keras's computation from the weights, head by head, in float64.
td::Tensor reference(nn::MultiHeadAttention& layer, const td::Tensor& x, bool causal) {
  const std::vector<td::Variable> w = layer.weights();
  auto f64 = [](const td::Tensor& t) { return td::ops::cast(t, td::DType::kFloat64); };
  const int64_t heads = layer.layer().num_heads(), depth = layer.layer().key_dim();
  const int64_t batch = x.dim(0), t = x.dim(1), c = x.dim(2);
  auto project = [&](size_t k) {  // [B, T, C] x [C, H, D] + [H, D] -> [B, H, T, D]
    const td::Tensor kernel = td::ops::reshape(f64(w[k].value()), {c, heads * depth});
    const td::Tensor bias = td::ops::reshape(f64(w[k + 1].value()), {heads * depth});
    const td::Tensor y = td::ops::add(td::ops::matmul(f64(x), kernel), bias);
    return td::ops::transpose(td::ops::reshape(y, {batch, t, heads, depth}), {0, 2, 1, 3});
  };
  const td::Tensor q = td::ops::mul(project(0), 1.0 / std::sqrt(double(depth)));
  const td::Tensor k = project(2), v = project(4);
  td::Tensor scores = td::ops::matmul(q, k, false, true);
  if (causal)
    scores = td::ops::where(td::ops::tril(td::Tensor::full({t, t}, 1.0, td::DType::kFloat64)),
                            scores, td::Tensor::full({}, -INFINITY, td::DType::kFloat64));
  const td::Tensor heads_out = td::ops::matmul(td::ops::softmax(scores, -1), v);  // [B, H, T, D]
  const td::Tensor merged =
      td::ops::reshape(td::ops::transpose(heads_out, {0, 2, 1, 3}), {batch * t, heads * depth});
  const td::Tensor out_kernel = td::ops::reshape(f64(w[6].value()), {heads * depth, c});
  return td::ops::reshape(td::ops::add(td::ops::matmul(merged, out_kernel), f64(w[7].value())),
                          {batch, t, c});
}

}  // namespace

TEST_CASE("MultiHeadAttention has Keras's weights: names, shapes, order", "[cpu][nn]") {
  nn::MultiHeadAttention layer(3, 4, {.value_dim = 5, .output_shape = 7});
  td::Generator g(1);
  const td::Tensor x = td::Tensor::uniform({2, 6, 10}, g, -1, 1);
  const td::Tensor out = layer(x, x);
  CHECK(out.shape() == td::Shape{2, 6, 7});
  const std::vector<td::Variable> w = layer.weights();
  REQUIRE(w.size() == 8);
  const std::vector<std::pair<std::string, td::Shape>> expected = {
      {"multi_head_attention/query/kernel", {10, 3, 4}},
      {"multi_head_attention/query/bias", {3, 4}},
      {"multi_head_attention/key/kernel", {10, 3, 4}},
      {"multi_head_attention/key/bias", {3, 4}},
      {"multi_head_attention/value/kernel", {10, 3, 5}},
      {"multi_head_attention/value/bias", {3, 5}},
      {"multi_head_attention/attention_output/kernel", {3, 5, 7}},
      {"multi_head_attention/attention_output/bias", {7}}};
  for (size_t i = 0; i < w.size(); ++i) {
    CHECK(w[i].name() == expected[i].first);
    CHECK(w[i].value().shape() == expected[i].second);
  }
  CHECK(layer.count_params() == (10 * 12 + 12) * 2 + (10 * 15 + 15) + (15 * 7 + 7));
}

TEST_CASE("MultiHeadAttention computes Keras's attention from its weights", "[cpu][nn]") {
  td::Generator g(2);
  const td::Tensor x = td::Tensor::uniform({2, 9, 8}, g, -1, 1);
  for (const bool causal : {false, true}) {
    INFO("causal " << causal);
    nn::MultiHeadAttention layer(2, 4);
    layer.set_seed(5);
    const td::Tensor out = layer(x, {.use_causal_mask = causal});
    const td::Tensor expected = reference(layer, x, causal);
    CHECK(relative_difference(expected.to_vector<float>(), out.to_vector<float>()) <= 1e-5);
    // The causal mask is top-left: positions 0..4 attend only to 0..4, so changing the later
    // positions leaves their outputs as they were.
    if (causal) {
      const td::Tensor early = td::ops::less(
          td::Tensor::from_vector<float>({0, 1, 2, 3, 4, 5, 6, 7, 8}, {1, 9, 1}), 5.0);
      const td::Tensor changed = td::ops::where(early, x, td::Tensor::uniform({2, 9, 8}, g, -1, 1));
      const std::vector<float> a = out.to_vector<float>();
      const std::vector<float> b = layer(changed, {.use_causal_mask = true}).to_vector<float>();
      for (int64_t b_i = 0; b_i < 2; ++b_i)
        for (int64_t i = 0; i < 9 * 8; ++i) {
          const size_t at = static_cast<size_t>(b_i * 72 + i);
          if (i < 5 * 8) CHECK(a[at] == b[at]);
        }
      CHECK(a != b);
    }
  }
  // Self-attention through Module's call is the unmasked one.
  nn::MultiHeadAttention layer(2, 4);
  CHECK(relative_difference(layer(x).to_vector<float>(), layer(x, x).to_vector<float>()) == 0);
}

TEST_CASE("MultiHeadAttention's mask, dropout and errors", "[cpu][nn]") {
  td::Generator g(3);
  const td::Tensor x = td::Tensor::uniform({2, 5, 6}, g, -1, 1);
  nn::MultiHeadAttention layer(2, 3, {.dropout = 0.5});
  // A [B, Tq, Tk] mask of the lower triangle is the causal mask.
  const td::Tensor lower = td::ops::greater(td::ops::tril(td::Tensor::full({2, 5, 5}, 1.0)), 0.0);
  CHECK(layer(x, x, td::Tensor(), {.attention_mask = lower}).to_vector<float>() ==
        layer(x, {.use_causal_mask = true}).to_vector<float>());
  // Dropout only while training.
  CHECK(layer(x, {.training = false}).to_vector<float>() == layer(x).to_vector<float>());
  CHECK(layer(x, {.training = true}).to_vector<float>() != layer(x).to_vector<float>());
  CHECK_THROWS_WITH(layer(td::Tensor::zeros({2, 5, 7})),
                    Catch::Contains("built for queries of 6 features"));
  CHECK_THROWS_WITH(layer(x, td::Tensor::zeros({3, 5, 6})), Catch::Contains("one batch size"));
  CHECK_THROWS_WITH(nn::MultiHeadAttention(0, 4), Catch::Contains("num_heads must be positive"));
  CHECK_THROWS_WITH(nn::MultiHeadAttention(2, 4, {.dropout = 1.0}),
                    Catch::Contains("dropout must be in [0, 1)"));
}
