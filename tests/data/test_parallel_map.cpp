// map(fn, num_parallel_calls): the sequential map's elements in the same order, on several
// threads, in index mode (a batch's elements read and mapped together) and over elements (a
// window read ahead); positions saved with one parallelism restore with another.
#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <mutex>
#include <set>
#include <thread>

#include "data/data_test_util.h"
#include "tandem/data/internal/worker_pool.h"
#include "tandem/tandem.h"

namespace td = tandem;
namespace data = tandem::data;
using data::testing::batches_of;
using data::testing::flat_values;

namespace {

/// x -> {x * 3 + 1}, noting which threads ran it (a short sleep lets the workers share).
struct Recorder {
  std::mutex mutex;
  std::set<std::thread::id> threads;
  std::function<data::Element(data::Element)> fn(int64_t throw_at = -1) {
    return [this, throw_at](data::Element e) {
      const int64_t x = e[0].to_vector<int64_t>()[0];
      TANDEM_CHECK(x != throw_at, "map function refused element ", x);
      std::this_thread::sleep_for(std::chrono::microseconds(300));
      {
        std::lock_guard<std::mutex> lock(mutex);
        threads.insert(std::this_thread::get_id());
      }
      return data::Element{td::Tensor::from_vector(std::vector<int64_t>{x * 3 + 1}, td::Shape{})};
    };
  }
};

}  // namespace

TEST_CASE(
    "map(num_parallel_calls) gives the sequential map's elements in order, on several threads",
    "[cpu][data]") {
  Recorder sequential, parallel;
  // Index mode: shuffled indices, each batch's elements mapped on the pool.
  const auto seq = data::range(200).map(sequential.fn()).shuffle(50, 9).batch(16);
  const auto par = data::range(200).map(parallel.fn(), 4).shuffle(50, 9).batch(16);
  CHECK(batches_of(par) == batches_of(seq));
  CHECK(sequential.threads.size() == 1);
  CHECK(parallel.threads.size() > 1);
  CHECK_THAT(par.describe(), Catch::Contains("map(num_parallel_calls=4)"));
  // deterministic=false (tf.data's permission to reorder) is accepted; the order stays.
  Recorder unordered;
  data::Iterator seq_epoch0 = seq.iterator(0);
  CHECK(batches_of(data::range(200)
                       .map(unordered.fn(), 4, /*deterministic=*/false)
                       .shuffle(50, 9)
                       .batch(16)) == batches_of(seq_epoch0));

  // Over elements (a prefetch hands out elements, not indices): a window read ahead.
  Recorder windowed;
  const auto elements = data::range(100).prefetch(2).map(windowed.fn(), 3);
  std::vector<int64_t> expected;
  for (int64_t x = 0; x < 100; ++x) expected.push_back(x * 3 + 1);
  CHECK(flat_values(elements) == expected);
  CHECK(windowed.threads.size() > 1);
  CHECK(data::range(10).map(windowed.fn(), data::kAutotune).cardinality() == 10);
  CHECK_THROWS_WITH(data::range(10).map(windowed.fn(), 0), Catch::Contains("got 0"));
}

TEST_CASE("map(num_parallel_calls): positions restore at any parallelism, errors keep their place",
          "[cpu][data]") {
  Recorder r;
  auto pipeline = [&](int64_t calls) {
    const data::Dataset input = data::range(60).prefetch(3);
    return calls > 1 ? input.map(r.fn(), calls) : input.map(r.fn());
  };
  data::Iterator it = pipeline(4).iterator(0);
  const std::vector<int64_t> head = flat_values(it, 11);  // 8 read ahead in the window
  const data::IteratorState state = it.save();
  const std::vector<int64_t> rest = flat_values(it);
  CHECK(head.size() + rest.size() == 60);
  for (const int64_t calls : {1, 2, 4}) {
    data::Iterator resumed = pipeline(calls).iterator(0);
    resumed.restore(state);
    CHECK(flat_values(resumed) == rest);
  }
  // An element the function refuses raises in its place, after the elements before it; the
  // next call goes on with the element after it, as the sequential map does.
  data::Iterator failing = data::range(40).prefetch(2).map(r.fn(/*throw_at=*/13), 4).iterator();
  std::vector<int64_t> got;
  data::Element e;
  CHECK_THROWS_WITH(
      [&] {
        while (failing.next(e)) got.push_back(e[0].to_vector<int64_t>()[0]);
      }(),
      Catch::Contains("refused element 13"));
  CHECK(got.size() == 13);
  // Saved after the error (the window read ahead past it): restores to the element after it.
  const data::IteratorState after_error = failing.save();
  REQUIRE(failing.next(e));
  CHECK(e[0].to_vector<int64_t>()[0] == 14 * 3 + 1);
  data::Iterator resumed = data::range(40).prefetch(2).map(r.fn(/*throw_at=*/13), 4).iterator(0);
  resumed.restore(after_error);
  REQUIRE(resumed.next(e));
  CHECK(e[0].to_vector<int64_t>()[0] == 14 * 3 + 1);
}

TEST_CASE("kAutotune: as many map workers as keep up with the consumer, from measured times",
          "[cpu][data]") {
  using tandem::data::detail::ParallelismTuner;
  // Rounds of 8 elements of 1 ms each (on one worker).
  ParallelismTuner tuner(8);
  CHECK(tuner.workers() == 8);  // until a period is measured: every worker
  tuner.record(8, 8e-3, 0);
  CHECK(tuner.workers() == 8);
  // A slow consumer (a round every 0.5 s): one worker keeps up.
  for (int round = 0; round < 6; ++round) tuner.record(8, 8e-3, 0.5);
  CHECK(tuner.workers() == 1);
  // The consumer waits for the map (the period is the round itself): the count grows, a
  // quarter (at least one) per round, to the maximum.
  std::vector<int> counts;
  for (int round = 0; round < 30; ++round) {
    const int w = tuner.workers();
    tuner.record(8, 8e-3, 8e-3 / w);
    counts.push_back(tuner.workers());
  }
  INFO("workers per round: " << Catch::Detail::stringify(counts));
  CHECK(std::is_sorted(counts.begin(), counts.end()));
  CHECK(std::set<int>(counts.begin(), counts.end()).size() >= 4);  // step by step
  CHECK(counts.back() == 8);
  // A consumer that needs 3,333 elements/s of 1 ms each: 4.2 workers' worth within 80%: 5.
  for (int round = 0; round < 20; ++round) tuner.record(8, 8e-3, 8 * 0.3e-3);
  CHECK(tuner.workers() == 5);

  // End to end: a consumer far slower than the map is served by the calling thread alone
  // once the tuner measured it (index mode: the batch's elements are mapped in the gather).
  Recorder recorder;
  const data::Dataset ds = data::range(64).map(recorder.fn(), data::kAutotune).batch(4);
  if (td::compute_threads() > 1)
    CHECK_THAT(ds.describe(), Catch::Contains("map(num_parallel_calls=autotune, up to"));
  data::Iterator it = ds.iterator();
  data::Element batch;
  for (int b = 0; b < 6; ++b) {
    REQUIRE(it.next(batch));
    std::this_thread::sleep_for(std::chrono::milliseconds(40));
  }
  {
    std::lock_guard<std::mutex> lock(recorder.mutex);
    recorder.threads.clear();
  }
  for (int b = 0; b < 6; ++b) {
    REQUIRE(it.next(batch));
    std::this_thread::sleep_for(std::chrono::milliseconds(40));
  }
  CHECK(recorder.threads == std::set<std::thread::id>{std::this_thread::get_id()});
}
