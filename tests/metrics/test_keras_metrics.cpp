// Keras parity of BinaryAccuracy, CategoricalAccuracy, Precision, Recall and AUC (records of
// tests/fixtures/keras_parity.txt, to 1e-6 relative), their sync-on-read state over replicas,
// and the refusal of result()/reset_state() inside strategy.run.
#include <catch2/catch.hpp>
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "support/keras_fixtures.h"
#include "support/require_gpu.h"
#include "tandem/tandem.h"

namespace td = tandem;
namespace metrics = tandem::metrics;
using Catch::Matchers::Contains;
using td::testing::KerasFixtures;

namespace {

constexpr int kBatches = 3;

/// Feeds the fixture batches of `kind` ("bin" or "cat") to `metric`, with the per-sample
/// weights when `weighted`, and compares read(metric) after each with <tag>.result<b>.
template <typename M>
void check_parity(const std::string& tag, const std::string& kind, bool weighted, M& metric,
                  const std::function<std::vector<double>(const M&)>& read) {
  const KerasFixtures& f = KerasFixtures::get();
  for (int b = 0; b < kBatches; ++b) {
    const std::string n = std::to_string(b);
    const td::Tensor weight = weighted ? f.tensor("metric.weight" + n) : td::Tensor();
    metric.update_state(f.tensor("metric." + kind + "_true" + n),
                        f.tensor("metric." + kind + "_pred" + n), weight);
    const std::vector<double> want = f.tensor(tag + ".result" + n).template to_vector<double>();
    const std::vector<double> got = read(metric);
    INFO(tag << " after batch " << b);
    REQUIRE(got.size() == want.size());
    for (size_t i = 0; i < got.size(); ++i)
      CHECK(got[i] == Approx(want[i]).epsilon(1e-6).margin(1e-12));
  }
}

template <typename M>
std::vector<double> one_result(const M& m) {
  return {m.result()};
}

template <typename M>
std::vector<double> every_result(const M& m) {
  return m.results();
}

const char* suffix(bool weighted) { return weighted ? "_w" : ""; }

}  // namespace

TEST_CASE("BinaryAccuracy and CategoricalAccuracy match Keras", "[cpu][metrics][keras]") {
  for (bool weighted : {false, true}) {
    for (double threshold : {0.5, 0.7}) {
      metrics::BinaryAccuracy accuracy("binary_accuracy", threshold);
      const std::string tag =
          std::string(threshold == 0.5 ? "binary_accuracy_t0.5" : "binary_accuracy_t0.7") +
          suffix(weighted);
      check_parity<metrics::BinaryAccuracy>(tag, "bin", weighted, accuracy,
                                            one_result<metrics::BinaryAccuracy>);
    }
    metrics::CategoricalAccuracy categorical;
    CHECK(categorical.name() == "categorical_accuracy");
    check_parity<metrics::CategoricalAccuracy>(
        std::string("categorical_accuracy") + suffix(weighted), "cat", weighted, categorical,
        one_result<metrics::CategoricalAccuracy>);
  }
}

TEST_CASE("Precision and Recall match Keras at one or several thresholds and evenly spaced ones",
          "[cpu][metrics][keras]") {
  const std::vector<std::pair<std::string, std::vector<double>>> cases = {
      {"t05", {0.5}}, {"multi", {0.2, 0.45, 0.8}}, {"even", {0.0, 0.25, 0.5, 0.75, 1.0}}};
  for (bool weighted : {false, true}) {
    for (const auto& [name, thresholds] : cases) {
      metrics::Precision precision("precision", thresholds);
      metrics::Recall recall("recall", thresholds);
      check_parity<metrics::Precision>("precision_" + name + suffix(weighted), "bin", weighted,
                                       precision, every_result<metrics::Precision>);
      check_parity<metrics::Recall>("recall_" + name + suffix(weighted), "bin", weighted, recall,
                                    every_result<metrics::Recall>);
      if (thresholds.size() == 1) {
        CHECK(precision.result() == precision.results()[0]);
        CHECK(recall.result() == recall.results()[0]);
      } else {
        CHECK_THROWS_WITH(precision.result(), Contains("precision") && Contains("results()"));
      }
    }
  }
}

TEST_CASE("AUC matches Keras for ROC and PR curves and each summation method",
          "[cpu][metrics][keras]") {
  struct Case {
    metrics::AucCurve curve;
    metrics::AucSummationMethod method;
    int n;
    std::string tag;
  };
  using C = metrics::AucCurve;
  using S = metrics::AucSummationMethod;
  const std::vector<Case> cases = {{C::kRoc, S::kInterpolation, 200, "auc_roc_interpolation_200"},
                                   {C::kPr, S::kInterpolation, 200, "auc_pr_interpolation_200"},
                                   {C::kRoc, S::kInterpolation, 7, "auc_roc_interpolation_7"},
                                   {C::kPr, S::kInterpolation, 7, "auc_pr_interpolation_7"},
                                   {C::kRoc, S::kMinoring, 50, "auc_roc_minoring_50"},
                                   {C::kPr, S::kMajoring, 50, "auc_pr_majoring_50"}};
  for (bool weighted : {false, true}) {
    for (const Case& c : cases) {
      metrics::AUC auc("auc",
                       {.num_thresholds = c.n, .curve = c.curve, .summation_method = c.method});
      check_parity<metrics::AUC>(c.tag + suffix(weighted), "bin", weighted, auc,
                                 one_result<metrics::AUC>);
    }
  }
  // Keras's thresholds, end points included.
  metrics::AUC auc;
  REQUIRE(auc.thresholds().size() == 200);
  CHECK(auc.thresholds().front() == -1e-7);
  CHECK(auc.thresholds()[1] == 1.0 / 199);
  CHECK(auc.thresholds().back() == 1.0 + 1e-7);
  CHECK(auc.variables().size() == 4);
  CHECK(auc.variables()[0].name == "true_positives");
  CHECK(auc.variables()[0].shape == td::Shape{200});
}

TEST_CASE("AUC from logits equals AUC of the sigmoid", "[cpu][metrics]") {
  const td::Tensor labels = td::Tensor::from_vector<float>({1, 0, 1, 1, 0, 0});
  const std::vector<float> logits = {2.0f, -1.0f, 0.3f, -0.2f, 0.1f, -3.0f};
  std::vector<float> probabilities;
  for (float z : logits) probabilities.push_back(1.0f / (1.0f + std::exp(-z)));
  metrics::AUC from_logits("auc", {.from_logits = true}), plain;
  from_logits.update_state(labels, td::Tensor::from_vector(logits));
  plain.update_state(labels, td::Tensor::from_vector(probabilities));
  CHECK(from_logits.result() == Approx(plain.result()).epsilon(1e-12));
  CHECK(plain.result() == Approx(8.0 / 9.0));  // 8 of the 9 (positive, negative) pairs ordered
}

TEST_CASE("AUC drops a NaN prediction from every bucket as Keras does", "[cpu][metrics]") {
  // keras.metrics.AUC(num_thresholds=200, curve=...) on these values (Keras 3.x): a NaN
  // prediction lies below every threshold (counted as a false negative or true negative),
  // unlike a prediction of 0, which the epsilon threshold counts above -1e-7.
  const td::Tensor labels = td::Tensor::from_vector<float>({0, 1, 1, 0, 1, 0});
  const td::Tensor predictions =
      td::Tensor::from_vector<float>({0.1f, 0.8f, std::nanf(""), 0.3f, 0.6f, 0.7f});
  metrics::AUC roc("roc"), pr("pr", {.curve = metrics::AucCurve::kPr});
  roc.update_state(labels, predictions);
  pr.update_state(labels, predictions);
  CHECK(roc.result() == Approx(0.5555555820465088).epsilon(1e-6));
  CHECK(pr.result() == Approx(0.531511664390564).epsilon(1e-6));
}

TEST_CASE("BinaryAccuracy rounds its threshold to the predictions' dtype as Keras does",
          "[cpu][metrics]") {
  // float(0.3) is 0.300000012: in Keras it is not above a threshold of 0.3 cast to float32.
  metrics::BinaryAccuracy accuracy("binary_accuracy", /*threshold=*/0.3);
  accuracy.update_state(td::Tensor::from_vector<float>({0, 1}),
                        td::Tensor::from_vector<float>({0.3f, 0.31f}));
  CHECK(accuracy.result() == 1.0);
}

TEST_CASE("New metrics check their inputs and name themselves", "[cpu][metrics]") {
  CHECK_THROWS_WITH(metrics::Precision("p", {1.5}), Contains("p") && Contains("1.5"));
  CHECK_THROWS_WITH(metrics::Recall("r", {}), Contains("r") && Contains("threshold"));
  CHECK_THROWS_WITH(metrics::AUC("a", {.num_thresholds = 1}), Contains("num_thresholds"));
  metrics::BinaryAccuracy binary;
  CHECK_THROWS_WITH(binary.update_state(td::Tensor::ones({4, 2}), td::Tensor::ones({4, 3})),
                    Contains("binary_accuracy") && Contains("[4, 2]") && Contains("[4, 3]"));
  CHECK_THROWS_WITH(binary.update_state(td::Tensor::ones({4, 2}), td::Tensor::ones({4, 2}),
                                        td::Tensor::ones({3})),
                    Contains("sample_weight") && Contains("[3]"));
  metrics::CategoricalAccuracy categorical;
  CHECK_THROWS_WITH(categorical.update_state(td::Tensor::ones({4}), td::Tensor::ones({4, 3})),
                    Contains("categorical_accuracy") && Contains("[4, 3]"));
  // Keras's rules for weights: [N] weighs the rows of [N, C] (one mean per row).
  binary.update_state(td::Tensor::from_vector<float>({1, 0, 0, 0}, {2, 2}),
                      td::Tensor::from_vector<float>({0.9f, 0.1f, 0.9f, 0.9f}, {2, 2}),
                      td::Tensor::from_vector<float>({3, 1}));
  CHECK(binary.result() == Approx(3.0 / 4.0));  // (3 * 1 + 1 * 0) / (3 + 1)
}

TEST_CASE("A metric updated on 2 replicas reads as one replica over the whole batch",
          "[cpu][metrics]") {
  const KerasFixtures& f = KerasFixtures::get();
  td::MirroredStrategy strategy = td::MirroredStrategy::cpu(2);
  metrics::BinaryAccuracy binary_2, binary_1;
  metrics::CategoricalAccuracy categorical_2, categorical_1;
  metrics::Precision precision_2("precision", {0.3, 0.6}), precision_1("precision", {0.3, 0.6});
  metrics::Recall recall_2, recall_1;
  metrics::AUC auc_2("auc", {.curve = metrics::AucCurve::kPr}),
      auc_1("auc", {.curve = metrics::AucCurve::kPr});
  for (int b = 0; b < kBatches; ++b) {
    const std::string n = std::to_string(b);
    const td::Tensor t = f.tensor("metric.bin_true" + n), p = f.tensor("metric.bin_pred" + n);
    const td::Tensor ct = f.tensor("metric.cat_true" + n), cp = f.tensor("metric.cat_pred" + n);
    const td::Tensor w = f.tensor("metric.weight" + n);
    // Replica 0 takes rows [0, 5), replica 1 rows [5, 8): an uneven split.
    strategy.run([&](td::ReplicaContext& ctx) {
      const int64_t begin = ctx.replica_id_in_sync_group() == 0 ? 0 : 5;
      const int64_t end = ctx.replica_id_in_sync_group() == 0 ? 5 : 8;
      binary_2.update_state(t.slice(begin, end), p.slice(begin, end), w.slice(begin, end));
      categorical_2.update_state(ct.slice(begin, end), cp.slice(begin, end), w.slice(begin, end));
      precision_2.update_state(t.slice(begin, end), p.slice(begin, end), w.slice(begin, end));
      recall_2.update_state(t.slice(begin, end), p.slice(begin, end));
      auc_2.update_state(t.slice(begin, end), p.slice(begin, end), w.slice(begin, end));
    });
    binary_1.update_state(t, p, w);
    categorical_1.update_state(ct, cp, w);
    precision_1.update_state(t, p, w);
    recall_1.update_state(t, p);
    auc_1.update_state(t, p, w);
  }
  REQUIRE(binary_2.replica_states().size() == 2);
  CHECK(binary_2.result() == Approx(binary_1.result()).epsilon(1e-12));
  CHECK(categorical_2.result() == Approx(categorical_1.result()).epsilon(1e-12));
  CHECK(precision_2.results()[0] == Approx(precision_1.results()[0]).epsilon(1e-12));
  CHECK(precision_2.results()[1] == Approx(precision_1.results()[1]).epsilon(1e-12));
  CHECK(recall_2.result() == Approx(recall_1.result()).epsilon(1e-12));
  CHECK(auc_2.result() == Approx(auc_1.result()).epsilon(1e-12));
  CHECK(auc_2.combined_state().at("true_positives") == auc_1.combined_state().at("true_positives"));
}

TEST_CASE("result() and reset_state() inside strategy.run raise naming the metric",
          "[cpu][metrics]") {
  for (int replicas : {1, 2}) {
    INFO(replicas << " replicas");
    td::MirroredStrategy strategy = td::MirroredStrategy::cpu(replicas);
    metrics::Mean loss("train_loss");
    metrics::AUC auc("val_auc");
    CHECK_THROWS_WITH(
        strategy.run([&](td::ReplicaContext&) { return loss.result(); }),
        Contains("train_loss") && Contains("result()") && Contains("inside strategy.run"));
    CHECK_THROWS_WITH(strategy.run([&](td::ReplicaContext&) { auc.reset_state(); }),
                      Contains("val_auc") && Contains("reset_state()"));
    // Updating inside and reading outside is the way.
    strategy.run([&](td::ReplicaContext&) { loss.update_state(td::Tensor::scalar(2.0)); });
    CHECK(loss.result() == 2.0);
    loss.reset_state();
    CHECK(loss.result() == 0.0);
  }
}

TEST_CASE("New metrics take CUDA tensors and agree with the CPU", "[cuda][metrics]") {
  TANDEM_REQUIRE_GPU();
  const KerasFixtures& f = KerasFixtures::get();
  const td::Device gpu = td::Device::cuda(0);
  const td::Tensor t = f.tensor("metric.bin_true0"), p = f.tensor("metric.bin_pred0");
  const td::Tensor w = f.tensor("metric.weight0");
  metrics::AUC cpu_auc, gpu_auc;
  metrics::Precision cpu_precision, gpu_precision;
  metrics::BinaryAccuracy cpu_binary, gpu_binary;
  cpu_auc.update_state(t, p, w);
  gpu_auc.update_state(t.to(gpu), p.to(gpu), w.to(gpu));
  cpu_precision.update_state(t, p);
  gpu_precision.update_state(t.to(gpu), p.to(gpu));
  cpu_binary.update_state(t, p, w);
  gpu_binary.update_state(t.to(gpu), p.to(gpu), w.to(gpu));
  CHECK(gpu_auc.result() == cpu_auc.result());
  CHECK(gpu_precision.result() == cpu_precision.result());
  CHECK(gpu_binary.result() == cpu_binary.result());
}
