// What strategy.run gives back: several values per step unpacked into per-replica values, and
// one error for replicas that failed alike.
#include <catch2/catch.hpp>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "tandem/tandem.h"

namespace td = tandem;

namespace {

td::Tensor scalar(float value) { return td::Tensor::from_vector(std::vector<float>{value}); }

struct StepResult {
  td::Tensor loss;
  td::Tensor correct;
  td::Tensor count;
};

}  // namespace

TEST_CASE("a step that returns a pair unpacks into two per-replica values", "[cpu][distribute]") {
  auto strategy = td::MirroredStrategy::cpu(2);
  auto step = [](td::ReplicaContext& ctx) {
    const auto id = static_cast<float>(ctx.replica_id_in_sync_group());
    return std::make_pair(scalar(1.0f + id), scalar(10.0f * (id + 1.0f)));
  };
  auto [losses, correct] = strategy.run(step);
  static_assert(std::is_same_v<decltype(losses), td::PerReplica<td::Tensor>>);
  REQUIRE(losses.size() == 2);
  REQUIRE(correct.size() == 2);
  REQUIRE(losses[1].item<float>() == 2.0f);
  REQUIRE(strategy.reduce(td::ReduceOp::kSum, losses).item<float>() == 3.0f);
  REQUIRE(strategy.reduce(td::ReduceOp::kMean, correct).item<float>() == 15.0f);
}

TEST_CASE("a step that returns a tuple or a struct unpacks field by field", "[cpu][distribute]") {
  auto strategy = td::MirroredStrategy::cpu(3);
  auto [a, b, c] = strategy.run([](td::ReplicaContext& ctx) {
    const int id = ctx.replica_id_in_sync_group();
    return std::make_tuple(scalar(static_cast<float>(id)), id * 2, std::string(1, 'x'));
  });
  REQUIRE(strategy.reduce(td::ReduceOp::kSum, a).item<float>() == 3.0f);
  REQUIRE(b.values() == std::vector<int>{0, 2, 4});
  REQUIRE(c[2] == "x");

  auto [loss, correct, count] = strategy.run([](td::ReplicaContext& ctx) {
    const auto id = static_cast<float>(ctx.replica_id_in_sync_group());
    return StepResult{scalar(0.5f * id), scalar(id + 1.0f), scalar(4.0f)};
  });
  const float total_correct = strategy.reduce(td::ReduceOp::kSum, correct).item<float>();
  const float total_count = strategy.reduce(td::ReduceOp::kSum, count).item<float>();
  REQUIRE(total_correct == 6.0f);
  REQUIRE(total_count == 12.0f);
  REQUIRE(strategy.reduce(td::ReduceOp::kSum, loss).item<float>() == 1.5f);
  // The whole struct stays reachable too.
  auto whole = strategy.run([](td::ReplicaContext&) {
    return StepResult{scalar(1.0f), scalar(2.0f), scalar(3.0f)};
  });
  REQUIRE(whole[0].count.item<float>() == 3.0f);
}

TEST_CASE("replicas that raise the same error raise it once, naming them", "[cpu][distribute]") {
  auto strategy = td::MirroredStrategy::cpu(3);
  try {
    strategy.run([](td::ReplicaContext&) { TANDEM_CHECK(false, "the batch is empty"); });
    FAIL("run did not raise");
  } catch (const td::Error& e) {
    const std::string message = e.what();
    INFO(message);
    REQUIRE(message == "replicas 0, 1, 2: the batch is empty");
  }
  // Different errors: the first replica's, then each other's once.
  try {
    strategy.run([](td::ReplicaContext& ctx) {
      const int id = ctx.replica_id_in_sync_group();
      TANDEM_CHECK(false, id == 1 ? "bad labels" : "bad features");
    });
    FAIL("run did not raise");
  } catch (const td::Error& e) {
    const std::string message = e.what();
    INFO(message);
    REQUIRE(message == "replicas 0, 2: bad features [replica 1 also failed: bad labels]");
  }
}

TEST_CASE("an error raised in strategy.run keeps where the library raised it",
          "[cpu][distribute]") {
  auto strategy = td::MirroredStrategy::cpu(2);
  try {
    strategy.run([](td::ReplicaContext&) { TANDEM_CHECK(1 > 2, "the batch is empty"); });
    FAIL("run did not raise");
  } catch (const td::Error& e) {
    CHECK(std::string(e.what()) == "replicas 0, 1: the batch is empty");
    CHECK_THAT(e.location(), Catch::StartsWith("test_run_results.cpp:") &&
                                 Catch::EndsWith(", check failed: 1 > 2"));
  }
}
