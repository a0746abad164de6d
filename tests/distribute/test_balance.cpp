// Splitting each global batch by the replicas' speed (SplitPolicy::kBySpeed): the split
// arithmetic, and a replica twice as slow per example getting a third of each batch, a shorter
// step, and the same weights as the even split.
#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <cmath>
#include <thread>
#include <vector>

#include "tandem/tandem.h"

namespace td = tandem;
using td::data::proportional_split;

TEST_CASE("proportional_split shares rows by weight, largest remainder, at least one each",
          "[cpu][data]") {
  CHECK(proportional_split(48, {2, 1}) == std::vector<int64_t>{32, 16});
  CHECK(proportional_split(10, {1, 1, 1}) == std::vector<int64_t>{4, 3, 3});  // tie: lower index
  CHECK(proportional_split(7, {1, 3}) == std::vector<int64_t>{2, 5});
  // Every replica keeps one example while there are enough, however slow it is.
  CHECK(proportional_split(4, {1000, 1, 1}) == std::vector<int64_t>{2, 1, 1});
  // Fewer rows than replicas, and none.
  CHECK(proportional_split(1, {1, 3}) == std::vector<int64_t>{0, 1});
  CHECK(proportional_split(0, {1, 2}) == std::vector<int64_t>{0, 0});
  for (int64_t rows : {1, 5, 63, 64, 1000}) {
    const std::vector<int64_t> sizes = proportional_split(rows, {0.3, 1.7, 2.9, 0.1});
    int64_t total = 0;
    for (int64_t s : sizes) total += s;
    CHECK(total == rows);
  }
  CHECK_THROWS_WITH(proportional_split(8, {1, 0}),
                    Catch::Contains("weight 1 is 0") && Catch::Contains("positive"));
  CHECK_THROWS_WITH(proportional_split(8, {1, NAN}), Catch::Contains("weight 1 is nan"));
  CHECK_THROWS_WITH(proportional_split(8, {}), Catch::Contains("no weights"));
}

TEST_CASE("kBySpeed needs a global batch to split", "[cpu][data]") {
  td::MirroredStrategy strategy = td::MirroredStrategy::cpu(2);
  td::data::DistributeOptions options;
  options.split = td::data::SplitPolicy::kBySpeed;
  CHECK_THROWS_WITH(
      strategy.distribute_datasets_from_function(
          [](const td::data::InputContext&) { return td::data::range(8).batch(2); }, options),
      Catch::Contains("kBySpeed needs a global batch"));
}

namespace {

constexpr int64_t kGlobalBatch = 48;
constexpr int kSteps = 12;

struct Run {
  double step_ms = 0;               // median over the steps after the first three
  std::vector<int64_t> slow_share;  // replica 1's examples per step
  std::vector<float> weights;
};

/// Linear regression on 2 CPU replicas where replica 1 takes 6 ms per example and replica 0
/// 3 ms (a sleep before the real forward and backward), SGD, the loss divided by the global batch.
/// The sleeps are long enough that a thread losing its core for a few milliseconds on a busy
/// machine (a sleep overshooting by a scheduler tick or two) moves a measured speed by a few
/// percent, not by a quarter.
Run train(td::data::SplitPolicy policy) {
  td::MirroredStrategy strategy = td::MirroredStrategy::cpu(2);
  td::Generator generator(7);
  const td::Tensor x = td::Tensor::uniform({kGlobalBatch * kSteps, 4}, generator, -1, 1);
  const td::Tensor y = td::Tensor::uniform({kGlobalBatch * kSteps, 1}, generator, -1, 1);
  td::data::DistributeOptions options;
  options.split = policy;
  td::data::DistributedDataset batches = strategy.distribute_dataset(
      td::data::from_tensor_slices({x, y}).batch(kGlobalBatch), options);

  auto scope = strategy.scope();
  td::Variable w =
      td::make_variable("w", td::Tensor::from_vector<float>({0.5f, -0.25f, 1, 0}, {4, 1}));
  td::optim::SGD sgd;
  auto step = [&](td::ReplicaContext& ctx, const td::data::Batch& batch) {
    const int64_t examples = batch[0].dim(0);
    const int ms_per_example = ctx.replica_id_in_sync_group() == 1 ? 6 : 3;
    std::this_thread::sleep_for(std::chrono::milliseconds(ms_per_example * examples));
    td::GradientTape tape;
    const td::Tensor error = td::ops::sub(td::ops::matmul(batch[0], w.value()), batch[1]);
    const td::Tensor loss =
        td::compute_average_loss(td::ops::sum(td::ops::square(error), 1), kGlobalBatch);
    sgd.apply_gradients(ctx, tape.gradient(loss, {w}), {w});
  };

  Run run;
  std::vector<double> step_ms;
  for (const td::PerReplica<td::data::Batch>& batch : batches) {
    const auto start = std::chrono::steady_clock::now();
    strategy.run(step, batch);
    step_ms.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
            .count());
    run.slow_share.push_back(batches.last_split()[1]);
  }
  REQUIRE(step_ms.size() == static_cast<size_t>(kSteps));
  std::vector<double> settled(step_ms.begin() + 3, step_ms.end());
  std::sort(settled.begin(), settled.end());
  run.step_ms = settled[settled.size() / 2];
  run.weights = w.value().to_vector<float>();
  return run;
}

}  // namespace

TEST_CASE(
    "a replica twice as slow per example gets a third of each batch, and nothing else changes",
    "[cpu][distribute]") {
  const Run even = train(td::data::SplitPolicy::kEven);
  const Run balanced = train(td::data::SplitPolicy::kBySpeed);
  INFO("step even " << even.step_ms << " ms, balanced " << balanced.step_ms << " ms");
  for (int64_t share : even.slow_share) CHECK(share == kGlobalBatch / 2);
  // The first step is even (nothing measured yet); from the second, replica 1 gets ~1/3 (16 of
  // 48): the median share within 10%, and no step's share off by a quarter (a step's share follows
  // the speeds measured in the steps before it, which a busy machine's scheduling can skew).
  CHECK(balanced.slow_share[0] == kGlobalBatch / 2);
  std::vector<int64_t> shares(balanced.slow_share.begin() + 2, balanced.slow_share.end());
  for (size_t i = 0; i < shares.size(); ++i) {
    CAPTURE(i + 2, shares[i]);
    CHECK(static_cast<double>(shares[i]) == Approx(kGlobalBatch / 3.0).epsilon(0.25));
  }
  std::sort(shares.begin(), shares.end());
  CHECK(static_cast<double>(shares[shares.size() / 2]) == Approx(kGlobalBatch / 3.0).epsilon(0.1));
  // Ideally 2/3 of the even step; 0.8 leaves room for the fixed costs of a step, which do not
  // shrink with the slow replica's share and weigh more under ThreadSanitizer or a busy machine.
  CHECK(balanced.step_ms <= 0.8 * even.step_ms);
  // Same global batches, same loss scaling: the same weights, up to the summation order.
  REQUIRE(balanced.weights.size() == even.weights.size());
  float largest = 0;
  for (size_t i = 0; i < even.weights.size(); ++i)
    largest = std::max(largest, std::abs(balanced.weights[i] - even.weights[i]));
  INFO("largest weight difference " << largest);
  CHECK(largest <= 1e-5f);
}
