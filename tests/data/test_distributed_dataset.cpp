// Tests of distributed input: splitting global batches across replicas, per-replica batches
// from a function of InputContext, InputContext arithmetic, auto-sharding across simulated
// workers, and saving/restoring a DistributedDataset's position.
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdio>
#include <set>
#include <string>

#include "data_test_util.h"
#include "support/stderr_capture.h"
#include "tandem/tandem.h"

using namespace tandem;
using namespace tandem::data;

namespace {

using Step = std::vector<std::vector<int64_t>>;  // per replica: tensor 0's values

std::vector<Step> all_steps(DistributedDataset& dist) {
  std::vector<Step> steps;
  for (const PerReplica<Batch>& per_replica : dist) {
    Step step;
    for (const Batch& b : per_replica) step.push_back(b.features().to_vector<int64_t>());
    steps.push_back(step);
  }
  return steps;
}

}  // namespace

TEST_CASE("a global batch splits across replicas in sizes differing by at most one",
          "[cpu][data]") {
  SECTION("7 on 2 -> 4 and 3") {
    DistributedDataset dist(range(7).batch(7), 2);
    std::vector<Batch> per_replica;
    REQUIRE(dist.next(per_replica));
    REQUIRE(per_replica.size() == 2);
    CHECK(per_replica[0].features().to_vector<int64_t>() == std::vector<int64_t>{0, 1, 2, 3});
    CHECK(per_replica[1].features().to_vector<int64_t>() == std::vector<int64_t>{4, 5, 6});
    CHECK_FALSE(dist.next(per_replica));
  }
  SECTION("1 on 2 -> 1 and an empty batch with the right trailing shape and dtype") {
    Tensor images = Tensor::ones({1, 2, 3});
    Tensor labels = Tensor::from_vector<int64_t>({4});
    DistributedDataset dist(from_tensor_slices({images, labels}).batch(8), 2);
    std::vector<Batch> per_replica;
    REQUIRE(dist.next(per_replica));
    CHECK(per_replica[0].batch_size() == 1);
    CHECK(per_replica[0].labels().to_vector<int64_t>() == std::vector<int64_t>{4});
    CHECK(per_replica[1].batch_size() == 0);
    CHECK(per_replica[1].empty());
    CHECK(per_replica[1].features().shape() == Shape{0, 2, 3});
    CHECK(per_replica[1].features().dtype() == DType::kFloat32);
    CHECK(per_replica[1].labels().shape() == Shape{0});
    CHECK(per_replica[1].labels().dtype() == DType::kInt64);
    CHECK_FALSE(dist.next(per_replica));
  }
  SECTION("range(6).batch(4) on 2 -> [0,1],[2,3] then [4],[5]") {
    DistributedDataset dist(range(6).batch(4), 2);
    CHECK(all_steps(dist) == std::vector<Step>{{{0, 1}, {2, 3}}, {{4}, {5}}});
  }
  SECTION("3 replicas: 10 -> 4, 3, 3 and 2 -> 1, 1, 0") {
    DistributedDataset dist(range(12).batch(10), 3);
    CHECK(all_steps(dist) ==
          std::vector<Step>{{{0, 1, 2, 3}, {4, 5, 6}, {7, 8, 9}}, {{10}, {11}, {}}});
  }
  SECTION("one replica gets the whole batch") {
    DistributedDataset dist(range(5).batch(2), 1);
    CHECK(all_steps(dist) == std::vector<Step>{{{0, 1}}, {{2, 3}}, {{4}}});
  }
  SECTION("the pieces are views of the global batch's rows") {
    Tensor x = Tensor::arange(8, DType::kFloat32).view_as({4, 2});
    DistributedDataset dist(from_tensor_slices({x}).batch(4), 2);
    std::vector<Batch> per_replica;
    REQUIRE(dist.next(per_replica));
    CHECK(per_replica[1].features().shape() == Shape{2, 2});
    CHECK(per_replica[1].features().to_vector<float>() == std::vector<float>{4, 5, 6, 7});
  }
  SECTION("unbatched elements are refused with a hint") {
    DistributedDataset dist(range(3), 2);
    std::vector<Batch> per_replica;
    CHECK_THROWS_WITH(dist.next(per_replica), Catch::Contains("batch(global_batch_size)"));
  }
  CHECK_THROWS_WITH(DistributedDataset(range(3).batch(2), 0),
                    Catch::Contains("num_replicas must be at least 1, got 0"));
}

TEST_CASE("a distributed dataset walks one epoch per loop and reshuffles", "[cpu][data]") {
  DistributedDataset dist(range(40).shuffle(40, 17).batch(8), 2);
  const std::vector<Step> epoch0 = all_steps(dist);
  CHECK(dist.epoch() == 1);
  const std::vector<Step> epoch1 = all_steps(dist);
  CHECK(epoch0.size() == 5);
  CHECK(epoch1.size() == 5);
  CHECK(epoch0 != epoch1);
  std::multiset<int64_t> seen;
  for (const Step& step : epoch0) {
    CHECK(step.size() == 2);
    for (const auto& replica : step) seen.insert(replica.begin(), replica.end());
  }
  CHECK(seen.size() == 40);
  CHECK(std::set<int64_t>(seen.begin(), seen.end()).size() == 40);
  // Copies share the position; empty_batches follows the dataset's shapes.
  DistributedDataset copy = dist;
  std::vector<Batch> per_replica;
  REQUIRE(copy.next(per_replica));
  CHECK(dist.save() == copy.save());
  const std::vector<Batch> empty = dist.empty_batches();
  REQUIRE(empty.size() == 2);
  CHECK(empty[0].features().shape() == Shape{0});
  CHECK(empty[0].features().dtype() == DType::kInt64);
  CHECK(DistributedDataset(range(4).batch(2), 3).empty_batches()[2].features().shape() == Shape{0});
}

TEST_CASE("a distributed dataset saves and restores its position", "[cpu][data]") {
  auto build = [] { return range(50).shuffle(50, 4).batch(6).prefetch(2); };
  DistributedDataset reference(build(), 2);
  const std::vector<Step> epoch0 = all_steps(reference);
  const std::vector<Step> epoch1 = all_steps(reference);

  DistributedDataset dist(build(), 2);
  std::vector<Batch> per_replica;
  for (int i = 0; i < 3; ++i) REQUIRE(dist.next(per_replica));
  const IteratorState mid = dist.save();
  CHECK(mid.get_scalar("distributed/in_epoch") == 1);

  // A new process: same pipeline, possibly another replica count.
  DistributedDataset resumed(build(), 2);
  resumed.restore(mid);
  std::vector<Step> rest = all_steps(resumed);
  CHECK(rest == std::vector<Step>(epoch0.begin() + 3, epoch0.end()));
  CHECK(all_steps(resumed) == epoch1);  // and the next epoch is the one it would have been

  DistributedDataset four(build(), 4);
  four.restore(mid);
  std::vector<int64_t> flat_rest, flat_expected;
  for (const Step& s : all_steps(four))
    for (const auto& r : s) flat_rest.insert(flat_rest.end(), r.begin(), r.end());
  for (auto s = epoch0.begin() + 3; s != epoch0.end(); ++s)
    for (const auto& r : *s) flat_expected.insert(flat_expected.end(), r.begin(), r.end());
  CHECK(flat_rest == flat_expected);

  // Saved at an epoch boundary: the restored dataset starts the next epoch.
  const IteratorState boundary = resumed.save();
  CHECK(boundary.get_scalar("distributed/in_epoch") == 0);
  CHECK(boundary.get_scalar("distributed/epoch") == 2);
  DistributedDataset after(build(), 2);
  after.restore(boundary);
  CHECK(after.epoch() == 2);
  DistributedDataset reference2(build(), 2);
  all_steps(reference2);
  all_steps(reference2);
  CHECK(all_steps(after) == all_steps(reference2));

  // set_epoch drops the epoch under way and starts the given one.
  DistributedDataset jump(build(), 2);
  REQUIRE(jump.next(per_replica));
  jump.set_epoch(1);
  CHECK(all_steps(jump) == epoch1);
  CHECK(jump.epoch() == 2);
}

TEST_CASE("InputContext arithmetic", "[cpu][data]") {
  const InputContext single;
  CHECK(single.num_input_pipelines() == 1);
  CHECK(single.input_pipeline_id() == 0);
  CHECK(single.num_replicas_in_sync() == 1);
  CHECK(single.get_per_replica_batch_size(64) == 64);
  const InputContext context(2, 1, 8);
  CHECK(context.get_per_replica_batch_size(256) == 32);
  CHECK_THROWS_WITH(context.get_per_replica_batch_size(100),
                    Catch::Contains("global batch size 100 is not divisible by the 8 replicas"));
  CHECK_THROWS_WITH(context.get_per_replica_batch_size(0), Catch::Contains("must be positive"));
  CHECK_THROWS_WITH(InputContext(2, 2, 4), Catch::Contains("input_pipeline_id 2 is out of range"));
  CHECK_THROWS_WITH(InputContext(0, 0, 4), Catch::Contains("num_input_pipelines must be at least"));
  CHECK_THROWS_WITH(InputContext(1, 0, 0),
                    Catch::Contains("num_replicas_in_sync must be at least"));
}

TEST_CASE("from_function: per-replica batches, one per replica per step", "[cpu][data]") {
  int calls = 0;
  auto fn = [&](const InputContext& context) {
    ++calls;
    CHECK(context.num_input_pipelines() == 1);
    CHECK(context.input_pipeline_id() == 0);
    CHECK(context.num_replicas_in_sync() == 2);
    return range(10).batch(context.get_per_replica_batch_size(4));
  };
  DistributedDataset dist = DistributedDataset::from_function(fn, 2);
  CHECK(calls == 1);
  CHECK(all_steps(dist) == std::vector<Step>{{{0, 1}, {2, 3}}, {{4, 5}, {6, 7}}, {{8, 9}, {}}});
  CHECK(all_steps(dist).size() == 3);  // the next epoch
  CHECK(calls == 1);

  // Simulated second worker of two: the context says so; the function shards by it.
  auto sharded = [](const InputContext& context) {
    CHECK(context.num_replicas_in_sync() == 4);
    return range(16)
        .shard(context.num_input_pipelines(), context.input_pipeline_id())
        .batch(context.get_per_replica_batch_size(8));
  };
  DistributedDataset worker1 = DistributedDataset::from_function(
      sharded, 2,
      {.auto_shard_policy = AutoShardPolicy::kAuto, .num_workers = 2, .worker_index = 1});
  CHECK(all_steps(worker1) == std::vector<Step>{{{1, 3}, {5, 7}}, {{9, 11}, {13, 15}}});

  // State round trip.
  DistributedDataset a = DistributedDataset::from_function(fn, 2);
  std::vector<Batch> per_replica;
  REQUIRE(a.next(per_replica));
  DistributedDataset b = DistributedDataset::from_function(fn, 2);
  b.restore(a.save());
  CHECK(all_steps(b) == std::vector<Step>{{{4, 5}, {6, 7}}, {{8, 9}, {}}});
  CHECK_THROWS_WITH(DistributedDataset::from_function(fn, 2, {.num_workers = 2, .worker_index = 2}),
                    Catch::Contains("worker_index 2 is out of range for 2 workers"));
}

TEST_CASE("auto-sharding across simulated workers", "[cpu][data]") {
  const Dataset global = range(16).shuffle(16, 5).batch(8);

  SECTION("one worker or kOff: unchanged") {
    for (AutoShardPolicy policy : {AutoShardPolicy::kOff, AutoShardPolicy::kFile,
                                   AutoShardPolicy::kData, AutoShardPolicy::kAuto})
      CHECK(auto_shard(global, policy, 1, 0).describe() == global.describe());
    CHECK(auto_shard(global, AutoShardPolicy::kOff, 2, 1).describe() == global.describe());
  }
  SECTION("kData: each worker keeps every W-th element and batches its share") {
    Iterator reference_it = global.iterator(0);
    const auto reference = data::testing::batches_of(reference_it);
    for (AutoShardPolicy policy : {AutoShardPolicy::kData, AutoShardPolicy::kAuto}) {
      Iterator w0 = auto_shard(global, policy, 2, 0).iterator(0);
      Iterator w1 = auto_shard(global, policy, 2, 1).iterator(0);
      const auto steps0 = data::testing::batches_of(w0);
      const auto steps1 = data::testing::batches_of(w1);
      REQUIRE(steps0.size() == reference.size());
      REQUIRE(steps1.size() == reference.size());
      for (size_t s = 0; s < reference.size(); ++s) {
        CHECK(steps0[s].size() == 4);
        CHECK(steps1[s].size() == 4);
        // Together the workers' batches are the global batch.
        std::multiset<int64_t> together(steps0[s].begin(), steps0[s].end());
        together.insert(steps1[s].begin(), steps1[s].end());
        CHECK(together == std::multiset<int64_t>(reference[s].begin(), reference[s].end()));
      }
    }
    CHECK(auto_shard(global, AutoShardPolicy::kData, 2, 1)
              .describe()
              .find("shard(2, 1) -> batch(4)") != std::string::npos);
    CHECK(data::testing::flat_values(auto_shard(range(6), AutoShardPolicy::kData, 3, 2)) ==
          std::vector<int64_t>{2, 5});
  }
  SECTION("a distributed dataset with worker options splits the worker's share") {
    DistributedDataset worker0(
        range(16).batch(8), 2,
        {.auto_shard_policy = AutoShardPolicy::kData, .num_workers = 2, .worker_index = 0});
    CHECK(all_steps(worker0) == std::vector<Step>{{{0, 2}, {4, 6}}, {{8, 10}, {12, 14}}});
  }
  SECTION("errors") {
    CHECK_THROWS_WITH(auto_shard(global, AutoShardPolicy::kFile, 2, 0),
                      Catch::Contains("kFile: the dataset reads no files"));
    CHECK_THROWS_WITH(auto_shard(range(9).batch(9), AutoShardPolicy::kData, 2, 0),
                      Catch::Contains("global batch size 9 is not divisible by 2 workers"));
    CHECK_THROWS_WITH(auto_shard(global, AutoShardPolicy::kData, 2, 5),
                      Catch::Contains("worker_index 5 is out of range for 2 workers"));
  }
}

using tandem::testing::stderr_of;

TEST_CASE("a loop that starts in the middle of an epoch says so", "[cpu][data]") {
  DistributedDataset dist(range(40).batch(8), 2);
  size_t steps_before_break = 0;
  for (const PerReplica<Batch>& per_replica : dist) {
    (void)per_replica;
    if (++steps_before_break == 2) break;  // as an exception in strategy.run would leave it
  }
  std::vector<Step> rest;
  const std::string log = stderr_of([&] { rest = all_steps(dist); });
  INFO(log);
  CHECK(rest.size() == 3);  // the epoch went on: 5 steps in all
  CHECK(log.find("distributed dataset: this loop continues epoch 0 after step 2, where the "
                 "previous loop over it stopped (a break or an exception); set_epoch(0) first "
                 "starts that epoch from its beginning") != std::string::npos);
  // A loop that starts an epoch afresh says nothing; set_epoch restarts an interrupted one.
  std::vector<Step> next_epoch;
  CHECK(stderr_of([&] { next_epoch = all_steps(dist); }).find("distributed dataset") ==
        std::string::npos);
  CHECK(next_epoch.size() == 5);
  std::vector<Batch> one;
  REQUIRE(dist.next(one));
  dist.set_epoch(2);
  CHECK(stderr_of([&] { CHECK(all_steps(dist).size() == 5); }).find("distributed dataset") ==
        std::string::npos);
  // After a restore: the first loop continues quietly (info level), a loop after it broke off
  // warns again, without a step number (the file holds the position, not the step).
  std::vector<Batch> two;
  REQUIRE(dist.next(two));
  REQUIRE(dist.next(two));
  const IteratorState saved = dist.save();
  DistributedDataset resumed(range(40).batch(8), 2);
  resumed.restore(saved);
  const std::string first_loop = stderr_of([&] {
    for (const PerReplica<Batch>& per_replica : resumed) {
      (void)per_replica;
      break;
    }
  });
  CHECK(first_loop.find("[warning]") == std::string::npos);
  std::vector<Step> remaining;
  const std::string second_loop = stderr_of([&] { remaining = all_steps(resumed); });
  INFO(second_loop);
  CHECK(remaining.size() == 2);
  CHECK(second_loop.find("this loop continues epoch 3, where the previous loop over it stopped") !=
        std::string::npos);
}

TEST_CASE("TensorFlow's steps-per-epoch loop over a repeated dataset runs without a warning",
          "[cpu][data]") {
  // for epoch: for batch in dist: ...; if ++step == steps_per_epoch: break. Over an endless
  // dataset every loop ends by break, and each continues where the last one stopped.
  DistributedDataset dist(range(10).repeat().batch(4), 2);
  std::vector<int64_t> firsts;
  const std::string log = stderr_of([&] {
    for (int epoch = 0; epoch < 3; ++epoch) {
      int steps = 0;
      for (const PerReplica<Batch>& per_replica : dist) {
        firsts.push_back(per_replica[0].features().to_vector<int64_t>().at(0));
        if (++steps == 2) break;
      }
    }
  });
  INFO(log);
  CHECK(log.find("distributed dataset") == std::string::npos);
  // Six steps of 4 from 0..9 repeated: each loop went on from where the previous one stopped.
  CHECK(firsts == std::vector<int64_t>{0, 4, 8, 2, 6, 0});
}
