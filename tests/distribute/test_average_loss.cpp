// Loss scaling outside strategy.run: with a strategy's scope open (cross-replica context),
// compute_average_loss without a global batch size and scale_regularization_loss raise, as
// TensorFlow does; outside any strategy they use one replica (the default strategy).
#include <catch2/catch.hpp>
#include <optional>
#include <vector>

#include "support/stderr_capture.h"
#include "tandem/tandem.h"

namespace td = tandem;

namespace {
td::Tensor vec(std::vector<float> values) { return td::Tensor::from_vector(values); }
}  // namespace

TEST_CASE("loss scaling in cross-replica context raises and says what to do", "[cpu][distribute]") {
  const td::Tensor per_example = vec({1, 2, 3, 4});
  auto strategy = td::MirroredStrategy::cpu(2);
  {
    auto scope = strategy.scope();
    // TensorFlow 2.21 raises here; a silent divide by one replica would give 2.5 and 2.
    REQUIRE_THROWS_WITH(td::compute_average_loss(per_example),
                        Catch::Contains("compute_average_loss without a global_batch_size") &&
                            Catch::Contains("cross-replica context") &&
                            Catch::Contains("MirroredStrategy with 2 replicas") &&
                            Catch::Contains("inside strategy.run") &&
                            Catch::Contains("pass global_batch_size"));
    REQUIRE_THROWS_WITH(
        td::scale_regularization_loss(vec({4})),
        Catch::Contains("scale_regularization_loss") && Catch::Contains("cross-replica context"));
    // An explicit global batch is unambiguous anywhere.
    CHECK(td::compute_average_loss(per_example, 8).item<float>() == 1.25f);
    // Inside run the scope's strategy gives the divisor: 10 / (4 x 2), 4 / 2.
    td::PerReplica<td::Tensor> losses =
        strategy.run([&](td::ReplicaContext&) { return td::compute_average_loss(per_example); });
    CHECK(losses[0].item<float>() == 1.25f);
    td::PerReplica<td::Tensor> regularization =
        strategy.run([](td::ReplicaContext&) { return td::scale_regularization_loss(vec({4})); });
    CHECK(regularization[1].item<float>() == 2.0f);
  }
  // No scope open: the default strategy's single replica.
  CHECK(td::compute_average_loss(per_example).item<float>() == 2.5f);
  CHECK(td::scale_regularization_loss(vec({4})).item<float>() == 4.0f);
}

TEST_CASE("compute_average_loss names a global batch smaller than the one the dataset delivered",
          "[cpu][distribute]") {
  // A porting slip: batches of 24 from the dataset, global_batch_size 12: the loss and the
  // gradients would be silently doubled. Said once, naming both numbers.
  auto strategy = td::MirroredStrategy::cpu(2);
  std::vector<float> values(48);
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i % 5);
  auto dist = strategy.distribute_dataset(td::data::from_tensor_slices({vec(values)}).batch(24));
  std::vector<float> losses;
  const std::string log = td::testing::stderr_of([&] {
    for (const auto& batch : dist) {
      td::PerReplica<td::Tensor> loss = strategy.run(
          [](td::ReplicaContext&, const td::data::Batch& b) {
            return td::compute_average_loss(b.features(), 12);
          },
          batch);
      losses.push_back(strategy.reduce(td::ReduceOp::kSum, loss).item<float>());
    }
  });
  INFO(log);
  CHECK(losses.size() == 2);
  size_t count = 0;
  for (size_t at = log.find("global_batch_size 12 but the distributed dataset delivered 24");
       at != std::string::npos;
       at = log.find("global_batch_size 12 but the distributed dataset delivered 24", at + 1))
    ++count;
  CHECK(count == 1);
  CHECK(log.find("2x their mean over the batch") != std::string::npos);
  // The right number, a larger one (accumulation, a short last batch) and no number: silent.
  for (const std::optional<int64_t> global :
       {std::optional<int64_t>(24), std::optional<int64_t>(48), std::optional<int64_t>()}) {
    dist.set_epoch(0);
    const std::string quiet = td::testing::stderr_of([&] {
      for (const auto& batch : dist)
        (void)strategy.run(
            [&](td::ReplicaContext&, const td::data::Batch& b) {
              return td::compute_average_loss(b.features(), global);
            },
            batch);
    });
    CHECK(quiet.find("compute_average_loss") == std::string::npos);
  }
}

TEST_CASE("a 16-bit per-example loss is averaged in float32, and strategy.reduce takes it",
          "[cpu][distribute]") {
  // 1000 losses of 1 and one of 256 in bfloat16: their bfloat16 sum would stop growing at 256
  // (256 + 1 rounds back to 256); in float32 the mean is exact.
  std::vector<float> values(1000, 1.0f);
  values.push_back(256.0f);
  const td::Tensor half = td::ops::cast(vec(values), td::DType::kBFloat16);
  const td::Tensor loss = td::compute_average_loss(half, 1001);
  CHECK(loss.dtype() == td::DType::kFloat32);
  CHECK(loss.item<float>() == Approx(1256.0 / 1001.0).epsilon(1e-6));
  // The replicas' bfloat16 values add up in float32, the result rounded once to bfloat16.
  auto strategy = td::MirroredStrategy::cpu(2);
  td::PerReplica<td::Tensor> per_replica = strategy.run([](td::ReplicaContext& ctx) {
    return td::ops::cast(vec({ctx.replica_id_in_sync_group() == 0 ? 256.0f : 1.0f}),
                         td::DType::kBFloat16);
  });
  const td::Tensor sum = strategy.reduce(td::ReduceOp::kSum, per_replica);
  CHECK(sum.dtype() == td::DType::kBFloat16);
  CHECK(td::ops::cast(sum, td::DType::kFloat32).to_vector<float>() == std::vector<float>{256.0f});
  const td::Tensor mean = strategy.reduce(td::ReduceOp::kMean, per_replica);
  CHECK(td::ops::cast(mean, td::DType::kFloat32).to_vector<float>() == std::vector<float>{128.0f});
}
