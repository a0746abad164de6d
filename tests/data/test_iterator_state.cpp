// Tests of iterator save/restore: mid-epoch, across epoch boundaries, with shuffle, batch,
// repeat and prefetch, for index-mode and element-mode shuffles; and the state's format.
#include <catch2/catch.hpp>

#include "data_test_util.h"
#include "tandem/tandem.h"

using namespace tandem;
using namespace tandem::data;
using data::testing::batches_of;

namespace {

/// For every stop point k: walks k batches of a fresh iterator, saves, walks the rest; then a
/// new iterator of an identically built pipeline restores the state and must produce exactly
/// the rest.
void check_resume_everywhere(const std::function<Dataset()>& build, uint64_t epoch,
                             int64_t max_stop) {
  const Dataset reference = build();
  Iterator full_it = reference.iterator(epoch);
  const std::vector<std::vector<int64_t>> full = batches_of(full_it);
  REQUIRE(!full.empty());
  for (int64_t stop = 0; stop <= std::min<int64_t>(max_stop, static_cast<int64_t>(full.size()));
       ++stop) {
    INFO("stop after " << stop << " of " << full.size() << " batches");
    Dataset first = build();
    Iterator it = first.iterator(epoch);
    const auto head = batches_of(it, stop);
    REQUIRE(head.size() == static_cast<size_t>(stop));
    const IteratorState state = it.save();
    const auto rest = batches_of(it);  // the original continues unaffected by save()
    CHECK(rest == std::vector<std::vector<int64_t>>(full.begin() + stop, full.end()));

    Dataset second = build();
    Iterator resumed = second.iterator();  // any epoch: restore replaces it
    resumed.restore(state);
    CHECK(resumed.epoch() == epoch);
    CHECK(batches_of(resumed) == rest);
  }
}

}  // namespace

TEST_CASE("save/restore mid-epoch with shuffle, batch and prefetch", "[cpu][data]") {
  auto build = [] { return range(103).shuffle(40, 7).batch(8).prefetch(2); };
  check_resume_everywhere(build, /*epoch=*/0, /*max_stop=*/14);
  check_resume_everywhere(build, /*epoch=*/3, /*max_stop=*/14);
}

TEST_CASE("save/restore across epoch boundaries with repeat", "[cpu][data]") {
  // 10 elements, batches of 4: batches straddle the passes of repeat(3).
  auto build = [] { return range(10).shuffle(10, 3).repeat(3).batch(4).prefetch(3); };
  check_resume_everywhere(build, 0, 8);
  auto endless = [] { return range(6).shuffle(4, 9).repeat().batch(4).take(12).prefetch(2); };
  check_resume_everywhere(endless, 1, 12);
}

TEST_CASE("save/restore with map, skip, shard and take around the shuffle", "[cpu][data]") {
  auto build = [] {
    return range(200)
        .skip(3)
        .map([](Element e) {
          return Element{Tensor::scalar(e[0].item<double>() * 10, DType::kInt64)};
        })
        .shard(3, 1)
        .shuffle(16, 99)
        .take(50)
        .batch(6)
        .prefetch(2);
  };
  check_resume_everywhere(build, 0, 9);
}

TEST_CASE("save/restore of a shuffle over batches (element mode, replayed)", "[cpu][data]") {
  // Shuffling batches: the buffer holds materialised elements, restored by replaying input.
  auto build = [] { return range(40).batch(3).shuffle(5, 1).repeat(2).prefetch(1); };
  check_resume_everywhere(build, 0, 28);
  auto nested = [] { return range(30).shuffle(8, 2).batch(2).shuffle(4, 3).batch(2); };
  check_resume_everywhere(nested, 2, 8);
}

TEST_CASE("saving repeatedly through a prefetch keeps every position exact", "[cpu][data]") {
  auto build = [] { return range(64).shuffle(64, 5).repeat(2).batch(5).prefetch(4); };
  Dataset ds = build();
  Iterator it = ds.iterator(0);
  std::vector<IteratorState> states;
  std::vector<std::vector<std::vector<int64_t>>> rests;
  Element e;
  // Save after every third batch of one iterator (each save replays from the previous).
  for (int step = 0; step < 8; ++step) {
    states.push_back(it.save());
    batches_of(it, 3);
  }
  Iterator reference = build().iterator(0);
  const auto full = batches_of(reference);
  for (size_t k = 0; k < states.size(); ++k) {
    Iterator resumed = build().iterator(7);
    resumed.restore(states[k]);
    CHECK(batches_of(resumed) ==
          std::vector<std::vector<int64_t>>(full.begin() + static_cast<long>(3 * k), full.end()));
  }
}

TEST_CASE("a restored iterator continues the dataset's epoch count", "[cpu][data]") {
  Dataset ds = range(20).shuffle(20, 8);
  Iterator e0 = ds.iterator();
  Iterator e1 = ds.iterator();
  CHECK(e1.epoch() == 1);
  batches_of(e1, 5);
  const IteratorState state = e1.save();
  Dataset again = range(20).shuffle(20, 8);
  Iterator restored = again.iterator();
  restored.restore(state);
  CHECK(restored.epoch() == 1);
  CHECK(again.iterator().epoch() == 2);  // the next epoch after the restored one
}

TEST_CASE("iterator state is small named int64 arrays and refuses other pipelines", "[cpu][data]") {
  Dataset ds = range(1000).shuffle(600, 42).batch(10).prefetch(2);
  Iterator it = ds.iterator();
  batches_of(it, 3);
  const IteratorState state = it.save();
  CHECK(state.contains("iterator/version"));
  CHECK(state.contains("iterator/signature"));
  CHECK(state.get_scalar("iterator/epoch") == 0);
  CHECK(state.get_scalar("0_range/position") == 630);  // 600 buffered + 30 replaced
  CHECK(state.get("1_shuffle/buffer").size() == 600);
  CHECK(state.get_u64("1_shuffle/rng").size() == 4);
  CHECK(state.get_u64("1_shuffle/rng")[0] == 42);
  CHECK(state.num_values() < 700);
  CHECK_FALSE(state.to_string().empty());

  // Round trip through the checkpoint form (named arrays).
  const IteratorState copy(state.entries());
  CHECK(copy == state);

  Iterator other_seed = range(1000).shuffle(600, 43).batch(10).prefetch(2).iterator();
  CHECK_THROWS_WITH(other_seed.restore(state), Catch::Contains("different pipeline"));
  Iterator other_shape = range(1000).batch(10).iterator();
  CHECK_THROWS_WITH(other_shape.restore(state), Catch::Contains("different pipeline"));
  IteratorState newer = state;
  newer.set("iterator/version", {2});
  CHECK_THROWS_WITH(it.restore(newer), Catch::Contains("format version 2"));
  IteratorState broken = state;
  broken.set("1_shuffle/buffer", {5000});
  CHECK_THROWS_WITH(it.restore(broken), Catch::Contains("outside a source of 1000"));
  // A failed restore leaves the iterator where it was.
  Iterator check = ds.iterator(0);
  batches_of(check, 3);
  CHECK(batches_of(it) == batches_of(check));

  CHECK_THROWS_WITH(IteratorState().get("missing"), Catch::Contains("no entry 'missing'"));
  CHECK_THROWS_WITH(IteratorState({{"a", {1}}, {"a", {2}}}), Catch::Contains("appears twice"));
  IteratorState s;
  s.set("x", {1, 2});
  s.set("x", {3});
  CHECK(s.get_scalar("x") == 3);
  s.set_u64("u", {~uint64_t{0}});
  CHECK(s.get_u64("u")[0] == ~uint64_t{0});
}
