// Metrics: update_state / result / reset_state of Mean, Sum, Accuracy and
// SparseCategoricalAccuracy, sample weights, and per-replica state summed on read.
#include <catch2/catch.hpp>
#include <cstdint>
#include <thread>
#include <vector>

#include "tandem/autograd/variable.h"
#include "tandem/metrics/metrics.h"

namespace td = tandem;
namespace metrics = tandem::metrics;

TEST_CASE("Mean and Sum accumulate until reset", "[cpu][metrics]") {
  metrics::Mean mean("loss");
  CHECK(mean.name() == "loss");
  CHECK(mean.result() == 0.0);  // nothing seen yet
  mean.update_state(td::Tensor::from_vector<float>({1, 2, 3}));
  mean.update_state(td::Tensor::scalar(6.0));
  CHECK(mean.result() == Approx(3.0));
  CHECK(mean.combined_state().scalar("count") == 4.0);
  mean.update_state(td::Tensor::from_vector<float>({10, 20}),
                    td::Tensor::from_vector<float>({0.5, 0}));
  CHECK(mean.result() == Approx((12.0 + 5.0) / 4.5));
  mean.reset_state();
  CHECK(mean.result() == 0.0);
  CHECK(mean.combined_state().scalar("count") == 0.0);

  metrics::Sum sum;
  CHECK(sum.name() == "sum");
  sum.update_state(td::Tensor::from_vector<double>({1.5, 2.5}));
  sum.update_state(td::Tensor::from_vector<int64_t>({4}));
  CHECK(sum.result() == 8.0);
  // Keras's rule: weights [N] weigh the rows of [N, C] values (the samples), not the columns.
  sum.update_state(td::Tensor::ones({2, 3}), td::Tensor::from_vector<float>({1, 2}));
  CHECK(sum.result() == 8.0 + 3 * 1 + 3 * 2);
  CHECK_THROWS_WITH(
      sum.update_state(td::Tensor::ones({2, 3}), td::Tensor::from_vector<float>({1, 2, 3})),
      Catch::Contains("sum") && Catch::Contains("sample_weight") && Catch::Contains("[3]") &&
          Catch::Contains("[2, 3]"));
}

TEST_CASE("Per-sample weights weigh the rows of [N, C] values even when N equals C",
          "[cpu][metrics]") {
  // values [[1, 2], [3, 5]]: row means 1.5 and 4, row sums 3 and 8.
  const td::Tensor values = td::Tensor::from_vector<float>({1, 2, 3, 5}, {2, 2});
  const td::Tensor rows = td::Tensor::from_vector<float>({1, 3});
  metrics::Mean mean;
  mean.update_state(values, rows);
  CHECK(mean.result() == Approx((1 * 1.5 + 3 * 4.0) / 4.0));
  CHECK(mean.combined_state().scalar("count") == 4.0);
  // [N, 1] weights are the same per-sample weights.
  metrics::Mean column;
  column.update_state(values, td::Tensor::from_vector<float>({1, 3}, {2, 1}));
  CHECK(column.result() == mean.result());
  // Unweighted: the mean of the per-sample means, counting samples.
  metrics::Mean unweighted;
  unweighted.update_state(values);
  CHECK(unweighted.result() == Approx(2.75));
  CHECK(unweighted.combined_state().scalar("count") == 2.0);
  // [N, C] weights weigh each element; count is the sum of the per-sample mean weights.
  metrics::Mean elements;
  elements.update_state(values, td::Tensor::from_vector<float>({1, 0, 0, 2}, {2, 2}));
  CHECK(elements.result() == Approx((0.5 + 5.0) / (0.5 + 1.0)));
  metrics::Sum sum;
  sum.update_state(values, rows);
  CHECK(sum.result() == 1 * 3 + 3 * 8);
  // Weights of more axes than the values raise, naming the metric and both shapes.
  CHECK_THROWS_WITH(mean.update_state(td::Tensor::ones({2}), td::Tensor::ones({2, 2})),
                    Catch::Contains("mean") && Catch::Contains("[2, 2]") && Catch::Contains("[2]"));
}

TEST_CASE("Accuracy compares predictions with targets", "[cpu][metrics]") {
  metrics::Accuracy accuracy;
  CHECK(accuracy.name() == "accuracy");
  accuracy.update_state(td::Tensor::from_vector<int64_t>({1, 2, 3, 4}),
                        td::Tensor::from_vector<float>({1, 2, 0, 4}));
  CHECK(accuracy.result() == Approx(0.75));
  accuracy.update_state(td::Tensor::from_vector<int64_t>({1, 1}, {2, 1}),
                        td::Tensor::from_vector<float>({1, 0}));
  CHECK(accuracy.result() == Approx(4.0 / 6.0));
  CHECK_THROWS_WITH(accuracy.update_state(td::Tensor::ones({3}), td::Tensor::ones({4})),
                    Catch::Contains("[3]") && Catch::Contains("[4]"));
}

TEST_CASE("SparseCategoricalAccuracy takes argmax over the last axis", "[cpu][metrics]") {
  metrics::SparseCategoricalAccuracy accuracy;
  CHECK(accuracy.name() == "sparse_categorical_accuracy");
  const td::Tensor logits = td::Tensor::from_vector<float>(
      {0.1f, 0.9f, 0.0f, 2.0f, 1.0f, 0.0f, 0.0f, 0.0f, 3.0f}, {3, 3});
  accuracy.update_state(td::Tensor::from_vector<int64_t>({1, 0, 1}), logits);
  CHECK(accuracy.result() == Approx(2.0 / 3.0));
  accuracy.update_state(td::Tensor::from_vector<uint8_t>({1, 0, 2}, {3, 1}), logits);
  CHECK(accuracy.result() == Approx(5.0 / 6.0));
  accuracy.update_state(td::Tensor::from_vector<int64_t>({1, 0, 1}), logits,
                        td::Tensor::from_vector<float>({0, 0, 1}));
  CHECK(accuracy.result() == Approx(5.0 / 7.0));
  // [N, 1] weights on [N, 1] labels weigh the samples too.
  accuracy.update_state(td::Tensor::from_vector<int64_t>({1, 1, 2}, {3, 1}), logits,
                        td::Tensor::from_vector<float>({2, 1, 1}, {3, 1}));
  CHECK(accuracy.result() == Approx(8.0 / 11.0));
  // An empty batch changes nothing.
  accuracy.update_state(td::Tensor::zeros({0}, td::DType::kInt64), td::Tensor::zeros({0, 3}));
  CHECK(accuracy.result() == Approx(8.0 / 11.0));
  CHECK_THROWS_WITH(accuracy.update_state(td::Tensor::from_vector<int64_t>({1, 0}), logits),
                    Catch::Contains("[2]") && Catch::Contains("[3, 3]"));
  accuracy.reset_state();
  CHECK(accuracy.result() == 0.0);
}

TEST_CASE("Each replica updates its own state and result() sums them", "[cpu][metrics]") {
  metrics::Mean mean("loss");
  metrics::SparseCategoricalAccuracy accuracy;
  const int replicas = 3;
  std::vector<std::thread> threads;
  for (int r = 0; r < replicas; ++r) {
    threads.emplace_back([&, r] {
      td::set_current_replica_binding({r, replicas});
      for (int step = 0; step < 50; ++step) {
        // Replica r sees r + 1 examples per step, of value r.
        mean.update_state(td::Tensor::full({r + 1}, static_cast<double>(r)));
        const std::vector<float> logits(static_cast<size_t>((r + 1) * 2), 0.0f);
        std::vector<int64_t> labels(static_cast<size_t>(r + 1), r == 0 ? 0 : 1);
        accuracy.update_state(td::Tensor::from_vector(labels),
                              td::Tensor::from_vector(logits, {r + 1, 2}));  // argmax = 0
      }
    });
  }
  for (auto& t : threads) t.join();
  const auto states = mean.replica_states();
  REQUIRE(states.size() == 3);
  CHECK(states[1].scalar("total") == 100.0);
  CHECK(states[2].scalar("count") == 150.0);
  // (0*1 + 1*2 + 2*3) / (1 + 2 + 3): partial batches combine exactly.
  CHECK(mean.result() == Approx(8.0 / 6.0));
  CHECK(accuracy.result() == Approx(1.0 / 6.0));
  // One process, no multi-worker strategy: the job is this process.
  CHECK(mean.num_workers() == 1);
  CHECK(mean.local_result() == mean.result());
  CHECK(mean.local_state().scalar("count") == mean.combined_state().scalar("count"));
  // Checkpoints store the combined state; restoring gives replica 0 all of it.
  const metrics::MetricState combined = mean.combined_state();
  metrics::Mean restored("loss");
  restored.set_combined_state(combined);
  CHECK(restored.result() == mean.result());
  CHECK(restored.replica_states().size() == 1);
}
