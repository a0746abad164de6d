// Losses: Keras parity of every loss (tests/fixtures/keras_parity.txt), reductions and sample
// weights, the kSumOverBatchSize rule inside strategies, label handling and clear errors.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <vector>

#include "support/keras_fixtures.h"
#include "tandem/autograd/tape.h"
#include "tandem/autograd/variable.h"
#include "tandem/losses/losses.h"
#include "tandem/ops/ops.h"

namespace td = tandem;
namespace losses = tandem::losses;
using tandem::testing::KerasFixtures;
using tandem::testing::max_abs_error;

namespace {
constexpr double kTolerance = 1e-5;
constexpr auto kNone = losses::Reduction::kNone;

/// Sets the calling thread's replica binding for the scope (as a strategy's replica thread).
class BindingGuard {
 public:
  explicit BindingGuard(td::ReplicaBinding binding) : saved_(td::current_replica_binding()) {
    td::set_current_replica_binding(binding);
  }
  ~BindingGuard() { td::set_current_replica_binding(saved_); }

 private:
  td::ReplicaBinding saved_;
};
}  // namespace

TEST_CASE("Keras parity: per-example losses", "[cpu][losses][keras]") {
  const KerasFixtures& f = KerasFixtures::get();
  const td::Tensor labels = f.tensor("scce.labels");
  SECTION("sparse categorical crossentropy") {
    losses::SparseCategoricalCrossentropy from_logits({.from_logits = true, .reduction = kNone});
    losses::SparseCategoricalCrossentropy from_probs({.reduction = kNone});
    CHECK(max_abs_error(from_logits(labels, f.tensor("scce.logits")),
                        f.tensor("scce.loss_logits")) <= kTolerance);
    CHECK(max_abs_error(from_probs(labels, f.tensor("scce.probs")), f.tensor("scce.loss_probs")) <=
          kTolerance);
    losses::SparseCategoricalCrossentropy mean({.from_logits = true});  // kSumOverBatchSize
    CHECK(max_abs_error(mean(labels, f.tensor("scce.logits")), f.tensor("scce.loss_logits_mean")) <=
          kTolerance);
  }
  SECTION("categorical crossentropy") {
    const td::Tensor onehot = f.tensor("cce.onehot");
    losses::CategoricalCrossentropy from_logits({.from_logits = true, .reduction = kNone});
    losses::CategoricalCrossentropy from_probs({.reduction = kNone});
    CHECK(max_abs_error(from_logits(onehot, f.tensor("scce.logits")),
                        f.tensor("cce.loss_logits")) <= kTolerance);
    CHECK(max_abs_error(from_probs(onehot, f.tensor("scce.probs")), f.tensor("cce.loss_probs")) <=
          kTolerance);
  }
  SECTION("binary crossentropy") {
    const td::Tensor y = f.tensor("bce.y_true");
    losses::BinaryCrossentropy from_logits({.from_logits = true, .reduction = kNone});
    losses::BinaryCrossentropy from_probs({.reduction = kNone});
    CHECK(max_abs_error(from_logits(y, f.tensor("bce.logits")), f.tensor("bce.loss_logits")) <=
          kTolerance);
    CHECK(max_abs_error(from_probs(y, f.tensor("bce.probs")), f.tensor("bce.loss_probs")) <=
          kTolerance);
  }
  SECTION("mean squared error") {
    losses::MeanSquaredError mse({.reduction = kNone});
    CHECK(max_abs_error(mse(f.tensor("mse.y_true"), f.tensor("mse.y_pred")),
                        f.tensor("mse.loss")) <= kTolerance);
  }
}

TEST_CASE("Reductions: none, sum, sum over batch size, with sample weights", "[cpu][losses]") {
  const td::Tensor y_true = td::Tensor::from_vector<float>({1, 2, 3, 4}, {4, 1});
  const td::Tensor y_pred = td::Tensor::from_vector<float>({1, 0, 3, 2}, {4, 1});
  losses::MeanSquaredError none({.reduction = kNone});
  losses::MeanSquaredError sum({.reduction = losses::Reduction::kSum});
  losses::MeanSquaredError mean;
  CHECK(mean.reduction() == losses::Reduction::kSumOverBatchSize);
  CHECK(mean.name() == "mean_squared_error");
  CHECK(none(y_true, y_pred).to_vector<float>() == std::vector<float>{0, 4, 0, 4});
  CHECK(sum(y_true, y_pred).item<float>() == 8.0f);
  CHECK(mean(y_true, y_pred).item<float>() == 2.0f);
  const td::Tensor w = td::Tensor::from_vector<float>({1, 0.5, 1, 2});
  CHECK(none(y_true, y_pred, w).to_vector<float>() == std::vector<float>{0, 2, 0, 8});
  CHECK(sum(y_true, y_pred, w).item<float>() == 10.0f);
  CHECK(mean(y_true, y_pred, w).item<float>() == 2.5f);  // Keras: divides by the element count
  CHECK_THROWS_WITH(none(y_true, y_pred, td::Tensor::ones({3})),
                    Catch::Contains("sample_weight") && Catch::Contains("[3]"));
  // An empty batch reduces to 0 (no division by zero).
  CHECK(mean(td::Tensor::zeros({0, 1}), td::Tensor::zeros({0, 1})).item<float>() == 0.0f);
}

TEST_CASE("kSumOverBatchSize is refused inside a multi-replica run, allowed outside",
          "[cpu][losses]") {
  const td::Tensor labels = td::Tensor::from_vector<int64_t>({0, 1});
  const td::Tensor logits = td::Tensor::zeros({2, 3});
  losses::SparseCategoricalCrossentropy mean({.from_logits = true});
  losses::SparseCategoricalCrossentropy none({.from_logits = true, .reduction = kNone});
  CHECK(mean(labels, logits).item<float>() == Approx(std::log(3.0f)));
  {
    BindingGuard one_replica({/*replica_id=*/0, /*num_replicas=*/1});
    CHECK_NOTHROW(mean(labels, logits));
  }
  BindingGuard two_replicas({/*replica_id=*/1, /*num_replicas=*/2});
  CHECK_THROWS_WITH(mean(labels, logits), Catch::Contains("kSumOverBatchSize") &&
                                              Catch::Contains("Reduction::kNone") &&
                                              Catch::Contains("compute_average_loss"));
  CHECK(none(labels, logits).shape() == td::Shape{2});
  losses::SparseCategoricalCrossentropy sum(
      {.from_logits = true, .reduction = losses::Reduction::kSum});
  CHECK_NOTHROW(sum(labels, logits));
}

TEST_CASE("Sparse labels: shapes and dtypes Keras accepts, clear errors otherwise",
          "[cpu][losses]") {
  const td::Tensor logits = td::Tensor::from_vector<float>({1, 2, 3, 3, 2, 1}, {2, 3});
  losses::SparseCategoricalCrossentropy scce({.from_logits = true, .reduction = kNone});
  const auto want = scce(td::Tensor::from_vector<int64_t>({2, 0}), logits).to_vector<float>();
  CHECK(scce(td::Tensor::from_vector<int32_t>({2, 0}), logits).to_vector<float>() == want);
  CHECK(scce(td::Tensor::from_vector<uint8_t>({2, 0}), logits).to_vector<float>() == want);
  CHECK(scce(td::Tensor::from_vector<int64_t>({2, 0}, {2, 1}), logits).to_vector<float>() == want);
  CHECK(scce(td::Tensor::from_vector<float>({2, 0}), logits).to_vector<float>() == want);
  CHECK(want[0] == Approx(std::log(std::exp(1.0) + std::exp(2.0) + std::exp(3.0)) - 3.0));
  CHECK_THROWS_WITH(scce(td::Tensor::from_vector<int64_t>({2, 7}), logits), Catch::Contains("7"));
  CHECK_THROWS_WITH(scce(td::Tensor::from_vector<int64_t>({2, -1}), logits), Catch::Contains("-1"));
  CHECK_THROWS_WITH(scce(td::Tensor::from_vector<int64_t>({0, 1, 2}), logits),
                    Catch::Contains("[3]") && Catch::Contains("[2, 3]"));
  // Sequence-shaped predictions keep their leading axes.
  const td::Tensor seq_logits = td::Tensor::zeros({2, 3, 4});
  const td::Tensor seq_labels = td::Tensor::from_vector<int64_t>({0, 1, 2, 3, 0, 1}, {2, 3});
  CHECK(scce(seq_labels, seq_logits).shape() == td::Shape{2, 3});
}

TEST_CASE("Dense targets must match predictions", "[cpu][losses]") {
  losses::CategoricalCrossentropy cce({.reduction = kNone});
  CHECK_THROWS_WITH(cce(td::Tensor::ones({2, 4}), td::Tensor::ones({2, 3})),
                    Catch::Contains("[2, 4]") && Catch::Contains("[2, 3]"));
  // [N] targets against [N, 1] predictions are accepted (Keras squeezes/expands).
  losses::BinaryCrossentropy bce({.from_logits = true, .reduction = kNone});
  const td::Tensor z = td::Tensor::from_vector<float>({0.5f, -2.0f}, {2, 1});
  const td::Tensor t = td::Tensor::from_vector<int64_t>({1, 0});
  const auto v = bce(t, z).to_vector<float>();
  REQUIRE(v.size() == 2);
  CHECK(v[0] == Approx(std::log1p(std::exp(-0.5))));
  CHECK(v[1] == Approx(std::log1p(std::exp(-2.0))));
  // Rank-1 predictions: one value per example.
  CHECK(bce(td::Tensor::from_vector<float>({1, 0}), td::Tensor::from_vector<float>({0.5f, -2.0f}))
            .to_vector<float>() == v);
}

TEST_CASE("Label smoothing follows Keras", "[cpu][losses]") {
  const td::Tensor logits = td::Tensor::from_vector<float>({0.3f, -1.0f, 2.0f}, {1, 3});
  const td::Tensor onehot = td::Tensor::from_vector<float>({0, 0, 1}, {1, 3});
  losses::CategoricalCrossentropy smooth(
      {.from_logits = true, .label_smoothing = 0.3, .reduction = kNone});
  const double lse = std::log(std::exp(0.3) + std::exp(-1.0) + std::exp(2.0));
  const double want = -(0.1 * (0.3 - lse) + 0.1 * (-1.0 - lse) + 0.8 * (2.0 - lse));
  CHECK(smooth(onehot, logits).item<float>() == Approx(want).epsilon(1e-6));
  losses::BinaryCrossentropy bce_smooth(
      {.from_logits = true, .label_smoothing = 0.2, .reduction = kNone});
  const double z = 0.7, t = 1.0 * 0.8 + 0.1;
  const double bce = std::max(z, 0.0) - z * t + std::log1p(std::exp(-std::abs(z)));
  CHECK(bce_smooth(td::Tensor::from_vector<float>({1}, {1, 1}),
                   td::Tensor::from_vector<float>({0.7f}, {1, 1}))
            .item<float>() == Approx(bce).epsilon(1e-6));
}

TEST_CASE("Losses are differentiable: SCCE from logits gives softmax - onehot", "[cpu][losses]") {
  td::Tensor logits = td::Tensor::from_vector<double>({0.1, 0.5, -0.3, 1.0, 0.0, -1.0}, {2, 3});
  const td::Tensor labels = td::Tensor::from_vector<int64_t>({1, 2});
  losses::SparseCategoricalCrossentropy sum(
      {.from_logits = true, .reduction = losses::Reduction::kSum});
  td::GradientTape tape;
  tape.watch(logits);
  const td::Tensor g = tape.gradient(sum(labels, logits), logits);
  const auto p = td::ops::softmax(logits).to_vector<double>();
  const auto gv = g.to_vector<double>();
  for (int i = 0; i < 6; ++i) {
    const double onehot = (i == 1 || i == 5) ? 1.0 : 0.0;
    CHECK(gv[i] == Approx(p[i] - onehot).margin(1e-12));
  }
}
