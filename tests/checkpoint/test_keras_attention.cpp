// MultiHeadAttention against Keras 3's (tests/interop/keras_attention.py, when TensorFlow and
// Keras 3 are installed; skipped otherwise): from the same weights, read by load_weights from
// Keras's .weights.h5 and from its legacy .h5, the outputs and the gradients (query, value and
// every weight) equal Keras's within 1e-5 of their largest magnitude, self-attention causal and
// not and cross-attention with value_dim, output_shape and an attention mask; and Keras's
// load_weights reads Tandem's checkpoint of the layer and computes Tandem's output.
#include <cstring>

#include "checkpoint_test_util.h"
#include "interop_test_util.h"
#include "support/compare.h"

namespace td = tandem;
namespace nn = tandem::nn;
using namespace tandem::checkpoint_testing;
using td::testing::relative_difference;

namespace {

struct Case {
  std::string name;
  int64_t heads, key_dim;
  nn::MultiHeadAttentionOptions options;
  bool causal, cross;
};

}  // namespace

TEST_CASE("MultiHeadAttention equals Keras 3's from the same weights, outputs and gradients",
          "[cpu][checkpoint][interop]") {
  const std::string python = tensorflow_python_or_skip();
  if (python.empty()) return;
  TempDir dir;
  const std::string script = python + " " + kInteropDir + "/keras_attention.py " + dir.str();
  const std::string log = dir.file("keras_attention.log");
  const int status = shell(script + " >" + log + " 2>&1");
  INFO("keras_attention.py output:\n" << read_text(log));
  if (status == 77) {
    WARN("keras_attention.py could not import TensorFlow and Keras 3; skipped");
    return;
  }
  REQUIRE(status == 0);

  const std::vector<Case> cases = {
      {"self_causal", 2, 4, {}, true, false},
      {"self", 2, 4, {}, false, false},
      {"cross", 3, 4, {.value_dim = 5, .output_shape = 8}, false, true},
  };
  for (const Case& c : cases) {
    for (const std::string& file : {c.name + ".weights.h5", c.name + "_legacy.h5"}) {
      INFO("case " << c.name << ", Keras's weights from " << file);
      const td::Tensor query = td::Tensor::from_vector(
          read_values<float>(dir.file(c.name + "_query.f32")), td::Shape{2, 7, 6});
      const td::Tensor value =
          c.cross ? td::Tensor::from_vector(read_values<float>(dir.file(c.name + "_value.f32")),
                                            td::Shape{2, 9, 5})
                  : query;
      td::Tensor mask;
      if (c.cross)
        mask = td::ops::cast(
            td::Tensor::from_vector(read_values<uint8_t>(dir.file(c.name + "_mask.u8")), {2, 7, 9}),
            td::DType::kBool);
      nn::MultiHeadAttention layer(c.heads, c.key_dim, c.options);
      layer(query, value);  // builds for these feature sizes
      nn::Sequential model({layer});
      model.build({7, 6});  // the layer is built already: the query's shape
      td::load_weights(model, dir.file(file));

      td::GradientTape tape;
      tape.watch(query);
      if (c.cross) tape.watch(value);
      const td::Tensor out =
          layer(query, value, td::Tensor(), {.attention_mask = mask, .use_causal_mask = c.causal});
      const td::Tensor w =
          td::Tensor::from_vector(read_values<float>(dir.file(c.name + "_w.f32")), out.shape());
      std::vector<td::Variable> weights = layer.weights();
      REQUIRE(weights.size() == 8);
      std::vector<td::Tensor> sources{query};
      if (c.cross) sources.push_back(value);
      for (const td::Variable& v : weights) sources.push_back(v.value());
      const std::vector<td::Tensor> grads =
          tape.gradient(td::ops::sum(td::ops::mul(out, w)), sources);

      CHECK(relative_difference(read_values<float>(dir.file(c.name + "_out.f32")),
                                out.to_vector<float>()) <= 1e-5);
      CHECK(relative_difference(read_values<float>(dir.file(c.name + "_dquery.f32")),
                                grads[0].to_vector<float>()) <= 1e-5);
      size_t next = 1;
      if (c.cross) {
        CHECK(relative_difference(read_values<float>(dir.file(c.name + "_dvalue.f32")),
                                  grads[1].to_vector<float>()) <= 1e-5);
        next = 2;
      }
      std::vector<float> mine;
      for (size_t i = next; i < grads.size(); ++i)
        for (float x : grads[i].to_vector<float>()) mine.push_back(x);
      CHECK(relative_difference(read_values<float>(dir.file(c.name + "_dweights.f32")), mine) <=
            1e-5);

      // Tandem -> Keras: Keras loads the checkpoint of the layer and computes Tandem's output.
      TempDir checkpoints;
      td::CheckpointManager manager(td::Checkpoint({{"model", &model}}), checkpoints.str());
      const std::string path = *manager.save();
      const int load_status =
          shell(script + " --load " + path + " " + c.name + " >" + log + " 2>&1");
      INFO("keras_attention.py --load output:\n" << read_text(log));
      REQUIRE(load_status == 0);
      CHECK(relative_difference(out.to_vector<float>(),
                                read_values<float>(dir.file(c.name + "_loaded.f32"))) <= 1e-5);
    }
  }
}
