// The layers a language model adds: PositionEmbedding (the first T rows of its table, gradients
// to those rows only), Embedding over indices of any shape, and Embedding::reverse, the output
// layer tied to the input embedding: its table's gradient is the sum of both uses (finite
// differences), and on two replicas a tied model steps as on one replica with the global batch.
#include <catch2/catch.hpp>
#include <cmath>

#include "ops/gradcheck.h"
#include "support/compare.h"
#include "tandem/tandem.h"

namespace td = tandem;
namespace nn = tandem::nn;
using td::testing::relative_difference;

TEST_CASE("PositionEmbedding gives the first T rows of its table", "[cpu][nn]") {
  nn::PositionEmbedding positions(8);
  td::Generator g(1);
  const td::Tensor x = td::Tensor::uniform({2, 8, 4}, g, -1, 1);
  const td::Tensor all = positions(x);
  const td::Variable table = positions.embeddings();
  CHECK(table.name() == "position_embedding/embeddings");
  REQUIRE(table.value().shape() == td::Shape{8, 4});
  CHECK(all.to_vector<float>() == table.value().to_vector<float>());
  // A shorter sequence: its first rows; the gradient reaches those rows only.
  const td::Tensor short_x = td::Tensor::uniform({3, 5, 4}, g, -1, 1);
  td::GradientTape tape;
  const td::Tensor rows = positions(short_x);
  REQUIRE(rows.shape() == td::Shape{5, 4});
  const std::vector<float> t = table.value().to_vector<float>();
  CHECK(rows.to_vector<float>() == std::vector<float>(t.begin(), t.begin() + 20));
  const std::vector<float> grad =
      tape.gradient(td::ops::sum(td::ops::add(short_x, rows)), {table})[0].to_vector<float>();
  for (size_t i = 0; i < grad.size(); ++i) CHECK(grad[i] == (i < 20 ? 3.0f : 0.0f));
  CHECK_THROWS_WITH(positions(td::Tensor::zeros({1, 9, 4})), Catch::Contains("T <= 8"));
  CHECK_THROWS_WITH(positions(td::Tensor::zeros({1, 4, 3})), Catch::Contains("[batch, T, 4]"));
}

TEST_CASE("Embedding takes indices of any shape, and reverse() is x @ table^T", "[cpu][nn]") {
  nn::Embedding embedding(11, 4);
  const td::Tensor ids = td::Tensor::from_vector<int64_t>({1, 2, 3, 4, 5, 6}, {2, 3});
  const td::Tensor h = embedding(ids);
  REQUIRE(h.shape() == td::Shape{2, 3, 4});
  // A prompt of another length after the build.
  CHECK(embedding(td::Tensor::from_vector<int64_t>({7}, {1, 1})).shape() == td::Shape{1, 1, 4});
  const td::Tensor logits = embedding.reverse(h);
  REQUIRE(logits.shape() == td::Shape{2, 3, 11});
  const td::Tensor expected = td::ops::reshape(
      td::ops::matmul(td::ops::reshape(h, {6, 4}), embedding.embeddings().value(), false, true),
      {2, 3, 11});
  CHECK(relative_difference(expected.to_vector<float>(), logits.to_vector<float>()) == 0);
  CHECK_THROWS_WITH(embedding.reverse(td::Tensor::zeros({2, 5})), Catch::Contains("[..., 4]"));
}

TEST_CASE("a tied embedding's gradient is the sum of its two uses", "[cpu][nn][grad]") {
  nn::Embedding embedding(7, 3);
  embedding.set_dtype(td::DType::kFloat64);
  const td::Tensor ids = td::Tensor::from_vector<int64_t>({0, 3, 3, 6, 1}, {1, 5});
  embedding(ids);  // builds
  const td::Variable table = embedding.embeddings();
  const td::Tensor labels = td::Tensor::from_vector<int64_t>({3, 1, 0, 6, 2}, {1, 5});
  auto loss_of = [&](const td::Tensor& t) {
    // The same model on a given table: embedding, a tanh, the reversed embedding.
    const td::Tensor h = td::ops::tanh(td::ops::embedding(t, ids));
    return td::ops::sum(
        td::ops::sparse_softmax_cross_entropy(td::ops::matmul(h, t, false, true), labels));
  };
  td::GradientTape tape;
  const td::Tensor loss = td::ops::sum(td::ops::sparse_softmax_cross_entropy(
      embedding.reverse(td::ops::tanh(embedding(ids))), labels));
  const std::vector<double> grad = tape.gradient(loss, {table})[0].to_vector<double>();
  CHECK(std::abs(loss.item<double>() - loss_of(table.value()).item<double>()) < 1e-12);
  std::vector<double> values = table.value().to_vector<double>();
  for (size_t i = 0; i < values.size(); ++i) {
    auto at = [&](double delta) {
      std::vector<double> moved = values;
      moved[i] += delta;
      return loss_of(td::Tensor::from_vector(moved, {7, 3})).item<double>();
    };
    const double numeric = (at(1e-6) - at(-1e-6)) / 2e-6;
    INFO("element " << i);
    CHECK(std::abs(grad[i] - numeric) <= 1e-6 * (1 + std::abs(numeric)));
  }
}

namespace {

/// One SGD step of a tied model (embedding -> reversed embedding) on `replicas` replicas; the
/// 8 sequences split across them. Returns the table after the step.
std::vector<float> tied_step(int replicas) {
  auto strategy = td::MirroredStrategy::cpu(replicas);
  nn::Embedding embedding(13, 4);
  std::unique_ptr<td::optim::SGD> sgd;
  {
    auto scope = strategy.scope();
    embedding.set_seed(2);
    embedding.build({6});
    sgd = std::make_unique<td::optim::SGD>(td::optim::SGD::Options{.learning_rate = 0.5});
  }
  const std::vector<td::Variable> variables = embedding.trainable_variables();
  REQUIRE(variables.size() == 1);  // one variable, used twice
  const std::vector<float> initial = variables[0].value().to_vector<float>();
  std::vector<int64_t> all;
  for (int64_t i = 0; i < 8 * 7; ++i) all.push_back((i * i * 5 + 3) % 13);
  const td::Tensor tokens = td::Tensor::from_vector(all, {8, 7});
  std::vector<td::Tensor> xs, ys;
  const int64_t per = 8 / replicas;
  for (int r = 0; r < replicas; ++r) {
    const td::Tensor part = tokens.slice(r * per, (r + 1) * per);
    xs.push_back(td::ops::slice(part, 1, 0, 6));
    ys.push_back(td::ops::slice(part, 1, 1, 7));
  }
  strategy.run(
      [&](td::ReplicaContext& ctx, const td::Tensor& x, const td::Tensor& y) {
        td::GradientTape tape;
        const td::Tensor logits = embedding.reverse(embedding(x, true));
        const td::Tensor loss = td::compute_average_loss(
            td::ops::mean(td::ops::sparse_softmax_cross_entropy(logits, y), 1), 8);
        sgd->apply_gradients(ctx, tape.gradient(loss, variables), variables);
      },
      td::PerReplica<td::Tensor>(xs), td::PerReplica<td::Tensor>(ys));
  const std::vector<float> after = variables[0].value().to_vector<float>();
  CHECK(after != initial);  // the step did move the table
  return after;
}

}  // namespace

TEST_CASE("a tied embedding on two replicas steps as on one with the global batch",
          "[cpu][nn][distribute]") {
  const std::vector<float> one = tied_step(1), two = tied_step(2);
  CHECK(relative_difference(one, two) <= 1e-6);
}
