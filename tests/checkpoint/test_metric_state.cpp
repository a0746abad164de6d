// Metrics with general state in checkpoints: BinaryAccuracy, CategoricalAccuracy, Precision,
// Recall and AUC saved mid-way on 2 replicas resume exactly in fresh objects; the layout
// (metrics/<name>/<variable>, Mean's total and count unchanged); restore checks each variable
// against the tracked metric and names the metric and the dataset.
#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "checkpoint_test_util.h"
#include "support/keras_fixtures.h"
#include "tandem/tandem.h"

namespace td = tandem;
namespace metrics = tandem::metrics;
using Catch::Matchers::Contains;
using td::checkpoint_testing::TempDir;
using td::testing::KerasFixtures;

namespace {

/// One of each new metric, as a training loop keeps them.
struct Metrics {
  metrics::BinaryAccuracy binary{"binary_accuracy", 0.6};
  metrics::CategoricalAccuracy categorical;
  metrics::Precision precision{"precision", {0.25, 0.5, 0.75}};
  metrics::Recall recall;
  metrics::AUC auc{"auc", {.num_thresholds = 50, .curve = metrics::AucCurve::kPr}};

  td::Checkpoint checkpoint() {
    return td::Checkpoint({{"binary_accuracy", &binary},
                           {"categorical_accuracy", &categorical},
                           {"precision", &precision},
                           {"recall", &recall},
                           {"auc", &auc}});
  }

  /// Batch `b` of the fixtures, split 5/3 over the strategy's 2 replicas, weighted.
  void update(td::MirroredStrategy& strategy, int b) {
    const KerasFixtures& f = KerasFixtures::get();
    const std::string n = std::to_string(b);
    const td::Tensor t = f.tensor("metric.bin_true" + n), p = f.tensor("metric.bin_pred" + n);
    const td::Tensor ct = f.tensor("metric.cat_true" + n), cp = f.tensor("metric.cat_pred" + n);
    const td::Tensor w = f.tensor("metric.weight" + n);
    strategy.run([&](td::ReplicaContext& ctx) {
      const int64_t begin = ctx.replica_id_in_sync_group() == 0 ? 0 : 5;
      const int64_t end = ctx.replica_id_in_sync_group() == 0 ? 5 : 8;
      binary.update_state(t.slice(begin, end), p.slice(begin, end), w.slice(begin, end));
      categorical.update_state(ct.slice(begin, end), cp.slice(begin, end), w.slice(begin, end));
      precision.update_state(t.slice(begin, end), p.slice(begin, end), w.slice(begin, end));
      recall.update_state(t.slice(begin, end), p.slice(begin, end));
      auc.update_state(t.slice(begin, end), p.slice(begin, end), w.slice(begin, end));
    });
  }

  std::vector<double> results() const {
    std::vector<double> out = {binary.result(), categorical.result(), recall.result(),
                               auc.result()};
    for (double v : precision.results()) out.push_back(v);
    return out;
  }
};

}  // namespace

TEST_CASE("Each new metric saved mid-way resumes in fresh objects as if never interrupted",
          "[cpu][checkpoint][metrics]") {
  TempDir dir;
  const std::string path = dir.file("ckpt-1.h5");
  td::MirroredStrategy strategy = td::MirroredStrategy::cpu(2);
  Metrics straight;
  for (int b = 0; b < 3; ++b) straight.update(strategy, b);

  {
    Metrics first;
    first.update(strategy, 0);
    first.update(strategy, 1);
    first.checkpoint().write(path);
  }
  Metrics resumed;
  resumed.update(strategy, 2);  // a state the restore replaces
  resumed.checkpoint().restore(path);
  REQUIRE(resumed.auc.replica_states().size() == 1);  // replica 0 took the whole sum
  resumed.update(strategy, 2);
  const std::vector<double> want = straight.results(), got = resumed.results();
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) CHECK(got[i] == Approx(want[i]).epsilon(1e-12));
  // Weights in quarter steps: every count is exact, so the states are equal bit for bit.
  for (const char* name :
       {"true_positives", "true_negatives", "false_positives", "false_negatives"})
    CHECK(resumed.auc.combined_state().at(name) == straight.auc.combined_state().at(name));

  // The layout: one float64 dataset per variable, of its shape; the means keep total and count.
  td::h5::File file = td::h5::File::open(path);
  const td::h5::Group state = file.root().open_group("training_state");
  CHECK(state.dataset_shape("metrics/auc/true_positives") == td::Shape{50});
  CHECK(state.dataset_dtype("metrics/auc/false_negatives") == td::DType::kFloat64);
  CHECK(state.dataset_shape("metrics/precision/false_positives") == td::Shape{3});
  CHECK(state.dataset_shape("metrics/binary_accuracy/total") == td::Shape{});
  CHECK(state.dataset_shape("metrics/categorical_accuracy/count") == td::Shape{});
  CHECK(state.open_group("metrics/recall").children() ==
        std::vector<std::string>{"false_negatives", "true_positives"});
  CHECK(td::verify_checkpoint(path).empty());
  CHECK_THAT(td::inspect_checkpoint(path),
             Contains("metrics/auc") && Contains("true_positives [50]"));
}

TEST_CASE("Restoring a metric checks its variables and names the metric and the dataset",
          "[cpu][checkpoint][metrics]") {
  TempDir dir;
  const std::string path = dir.file("ckpt-1.h5");
  metrics::AUC auc("score", {.num_thresholds = 20});
  auc.update_state(td::Tensor::from_vector<float>({1, 0, 1}),
                   td::Tensor::from_vector<float>({0.8f, 0.3f, 0.4f}));
  td::Checkpoint({{"score", &auc}}).write(path);

  SECTION("another number of thresholds") {
    metrics::AUC other("score", {.num_thresholds = 30});
    CHECK_THROWS_AS(td::Checkpoint({{"score", &other}}).restore(path), td::CheckpointMismatchError);
    CHECK_THROWS_WITH(td::Checkpoint({{"score", &other}}).restore(path),
                      Contains(path) && Contains("metrics/score/true_positives") &&
                          Contains("[20]") && Contains("[30]") && Contains("\"score\""));
  }
  SECTION("another kind of metric") {
    metrics::Precision precision("score");
    CHECK_THROWS_WITH(td::Checkpoint({{"score", &precision}}).restore(path),
                      Contains("metric \"score\"") && Contains("metrics/score/true_positives"));
    metrics::Mean mean("score");
    CHECK_THROWS_WITH(td::Checkpoint({{"score", &mean}}).restore(path),
                      Contains("metric \"score\"") && Contains("metrics/score/total"));
  }
  SECTION("a negative or non-finite count") {
    {
      td::h5::File file = td::h5::File::open_for_update(path);
      file.root().remove("training_state/metrics/score/false_positives");
      std::vector<double> values(20, 1.0);
      values[7] = -2.0;
      file.root().write_tensor("training_state/metrics/score/false_positives",
                               td::Tensor::from_vector(values, {20}));
      file.close();
    }
    metrics::AUC fresh("score", {.num_thresholds = 20});
    fresh.update_state(td::Tensor::from_vector<float>({1}), td::Tensor::from_vector<float>({1}));
    CHECK_THROWS_WITH(td::Checkpoint({{"score", &fresh}}).restore(path),
                      Contains(path) && Contains("metrics/score/false_positives[7] is -2") &&
                          Contains("count >= 0"));
    CHECK(fresh.combined_state().at("true_positives")[0] == 1.0);  // unchanged
    CHECK_THAT(td::verify_checkpoint(path), Contains("metrics/score/false_positives[7]"));
  }
}

TEST_CASE("A mean's total and count in the older layout (no variable attributes) still restore",
          "[cpu][checkpoint][metrics]") {
  TempDir dir;
  const std::string path = dir.file("ckpt-1.h5");
  metrics::SparseCategoricalAccuracy saved("train_accuracy");
  saved.update_state(td::Tensor::from_vector<int64_t>({1, 1, 1}),  // argmax: 1, 0, 1
                     td::Tensor::from_vector<float>({0, 1, 1, 0, 0, 1}, {3, 2}));
  td::Checkpoint({{"train_accuracy", &saved}}).write(path);
  {
    // What files written before metrics had general state hold: total and count, no attributes
    // listing the variables.
    td::h5::File file = td::h5::File::open_for_update(path);
    const td::h5::Group m = file.root().open_group("training_state/metrics/train_accuracy");
    m.remove_attr("variable_names");
    m.remove_attr("non_negative");
    CHECK(m.children() == std::vector<std::string>{"count", "total"});
    file.close();
  }
  CHECK(td::verify_checkpoint(path).empty());
  metrics::SparseCategoricalAccuracy restored("train_accuracy");
  td::Checkpoint({{"train_accuracy", &restored}}).restore(path);
  CHECK(restored.combined_state().scalar("total") == 2.0);
  CHECK(restored.combined_state().scalar("count") == 3.0);
  CHECK(restored.result() == Approx(2.0 / 3.0));
}
