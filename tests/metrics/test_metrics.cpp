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
  sum.update_state(td::Tensor::ones({2, 3}), td::Tensor::from_vector<float>({1, 2, 3}));
  CHECK(sum.result() == 8.0 + 2 * 6.0);
  CHECK_THROWS_WITH(sum.update_state(td::Tensor::ones({2, 3}), td::Tensor::ones({2})),
                    Catch::Contains("sample_weight"));
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
  // An empty batch changes nothing.
  accuracy.update_state(td::Tensor::zeros({0}, td::DType::kInt64), td::Tensor::zeros({0, 3}));
  CHECK(accuracy.result() == Approx(5.0 / 7.0));
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
