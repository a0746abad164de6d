// A position saved by a multi-worker job (kData auto-sharding: each worker reads its share of
// every global batch) restored at another number of workers: over several TFRecord files, the
// examples before the save and after the restore are every example of the epoch, once each.
#include <catch2/catch.hpp>
#include <set>

#include "data/data_test_util.h"
#include "tandem/tandem.h"

namespace td = tandem;
namespace data = tandem::data;
using data::testing::TempDir;

namespace {

/// Runs `steps` steps (all when negative) on each of `workers` simulated workers reading
/// `make()`, adding every example seen to `seen`; returns worker 0's (the chief's) position.
template <typename Make>
data::IteratorState run_workers(const Make& make, int64_t workers, int64_t steps,
                                const data::IteratorState* restore_from,
                                std::multiset<int64_t>& seen) {
  data::IteratorState chief;
  for (int64_t w = 0; w < workers; ++w) {
    data::DistributedDataset dist(make(), 1,
                                  {.auto_shard_policy = data::AutoShardPolicy::kData,
                                   .num_workers = workers,
                                   .worker_index = w});
    if (restore_from != nullptr) dist.restore(*restore_from);
    std::vector<data::Batch> batch;
    for (int64_t s = 0; (steps < 0 || s < steps) && dist.next(batch); ++s)
      for (const int64_t y : batch[0].features().to_vector<int64_t>()) seen.insert(y);
    if (w == 0) chief = dist.save();
  }
  return chief;
}

}  // namespace

TEST_CASE(
    "a multi-worker position over several TFRecord files resumes at another number of "
    "workers, every example once",
    "[cpu][data][tfrecord]") {
  const TempDir dir;
  // 4 files of 7, 5, 9 and 3 records: example n holds y = n.
  std::multiset<int64_t> all;
  const std::vector<std::string> files =
      data::testing::write_numbered_tfrecords(dir, {7, 5, 9, 3}, all);
  const data::FeatureSpec spec = {{"y", data::FixedLenFeature{{}, td::DType::kInt64}}};
  auto make = [&] {
    return data::tfrecord(files)
        .map([spec](data::Element e) { return data::parse_example(e[0], spec); }, 2)
        .shuffle(24, 7)
        .batch(6)
        .prefetch(2);
  };

  for (const int64_t before : {int64_t{1}, int64_t{2}, int64_t{3}}) {
    for (const int64_t after : {int64_t{1}, int64_t{2}, int64_t{3}}) {
      for (const int64_t steps : {int64_t{1}, int64_t{2}, int64_t{3}}) {
        INFO(before << " worker(s) for " << steps << " step(s), then " << after << " worker(s)");
        std::multiset<int64_t> seen;
        const data::IteratorState saved = run_workers(make, before, steps, nullptr, seen);
        CHECK(seen.size() == static_cast<size_t>(6 * steps));
        run_workers(make, after, -1, &saved, seen);
        CHECK(seen == all);
      }
    }
  }

  // The next epoch after the resume is whole at the new number of workers.
  std::multiset<int64_t> first, again;
  const data::IteratorState saved = run_workers(make, 2, 2, nullptr, first);
  for (int64_t w = 0; w < 3; ++w) {
    data::DistributedDataset dist(
        make(), 1,
        {.auto_shard_policy = data::AutoShardPolicy::kData, .num_workers = 3, .worker_index = w});
    dist.restore(saved);
    std::vector<data::Batch> batch;
    while (dist.next(batch)) {
    }
    int64_t examples = 0;
    while (dist.next(batch)) {
      for (const int64_t y : batch[0].features().to_vector<int64_t>()) again.insert(y);
      examples += batch[0].batch_size();
    }
    CHECK(examples == 8);  // a third of the 24 examples
  }
  CHECK(again == all);

  // kFile: worker 1 reads other files than the chief; the chief's position is refused there,
  // saying why and what restores anywhere.
  data::DistributedDataset chief(
      make(), 1,
      {.auto_shard_policy = data::AutoShardPolicy::kFile, .num_workers = 2, .worker_index = 0});
  std::vector<data::Batch> batch;
  REQUIRE(chief.next(batch));
  data::DistributedDataset other(
      make(), 1,
      {.auto_shard_policy = data::AutoShardPolicy::kFile, .num_workers = 2, .worker_index = 1});
  CHECK_THROWS_WITH(other.restore(chief.save()),
                    Catch::Contains("different pipeline") &&
                        Catch::Contains("AutoShardPolicy::kData") &&
                        Catch::Contains("reads its own files (AutoShardPolicy::kFile)"));
}
