// cache(): the function before the cache runs once per element over several epochs, in index
// mode (a shuffle above the cache) and over elements; the kept elements are the input's; a pass
// cut short keeps nothing; positions restore before and after the cache is complete.
#include <atomic>
#include <catch2/catch.hpp>
#include <filesystem>

#include "data/data_test_util.h"
#include "tandem/tandem.h"

namespace td = tandem;
namespace data = tandem::data;
using data::testing::batches_of;
using data::testing::flat_values;

namespace {

/// x -> {x * 7}, counting its calls.
std::function<data::Element(data::Element)> counted(std::shared_ptr<std::atomic<int>> calls) {
  return [calls](data::Element e) {
    ++*calls;
    const int64_t x = e[0].to_vector<int64_t>()[0];
    return data::Element{td::Tensor::from_vector(std::vector<int64_t>{x * 7}, td::Shape{})};
  };
}

}  // namespace

TEST_CASE("cache: the input is read once, over indices and over elements", "[cpu][data]") {
  SECTION("index mode: a shuffle above the cache still reshuffles every epoch") {
    auto calls = std::make_shared<std::atomic<int>>(0);
    const data::Dataset ds = data::range(10).map(counted(calls)).cache().shuffle(10, 3).batch(4);
    const data::Dataset uncached = data::range(10).map(counted(calls)).shuffle(10, 3).batch(4);
    const auto epoch0 = batches_of(ds);
    CHECK(*calls == 10);
    const auto epoch1 = batches_of(ds);
    CHECK(*calls == 10);  // read from the cache
    CHECK(epoch0 != epoch1);
    data::Iterator u0 = uncached.iterator(0), u1 = uncached.iterator(1);
    CHECK(epoch0 == batches_of(u0));
    CHECK(epoch1 == batches_of(u1));
    CHECK(ds.cardinality() == 3);
  }
  SECTION("index mode through a prefetch: elements read through the cache") {
    auto calls = std::make_shared<std::atomic<int>>(0);
    const data::Dataset ds = data::range(6).map(counted(calls)).cache().prefetch(2);
    const std::vector<int64_t> expected = {0, 7, 14, 21, 28, 35};
    CHECK(flat_values(ds) == expected);
    CHECK(flat_values(ds) == expected);
    CHECK(*calls == 6);
  }
  SECTION("over elements: a pass is kept when it completes from the beginning") {
    auto calls = std::make_shared<std::atomic<int>>(0);
    const data::Dataset ds = data::range(8).prefetch(1).map(counted(calls)).cache();
    const std::vector<int64_t> expected = {0, 7, 14, 21, 28, 35, 42, 49};
    {
      data::Iterator cut = ds.iterator();
      CHECK(flat_values(cut, 3) == std::vector<int64_t>{0, 7, 14});
    }
    CHECK(flat_values(ds) == expected);  // the cut pass kept nothing: read from the input
    CHECK(*calls == 3 + 8);
    CHECK(flat_values(ds) == expected);
    CHECK(*calls == 3 + 8);
    CHECK_THAT(ds.describe(), Catch::Contains("-> cache"));
  }
  SECTION("a consumer that writes into an element does not change the cache") {
    const data::Dataset ds = data::range(4).prefetch(1).cache();
    for (int epoch = 0; epoch < 3; ++epoch) {
      data::Iterator it = ds.iterator();
      data::Element e;
      std::vector<int64_t> seen;
      while (it.next(e)) {
        seen.push_back(e[0].item<int64_t>());
        e[0].fill_(-1);
      }
      CHECK(seen == std::vector<int64_t>{0, 1, 2, 3});
    }
    const data::Dataset indexed = data::range(4).cache().batch(4);
    for (int epoch = 0; epoch < 2; ++epoch) {
      data::Iterator it = indexed.iterator();
      data::Element e;
      REQUIRE(it.next(e));
      CHECK(e[0].to_vector<int64_t>() == std::vector<int64_t>{0, 1, 2, 3});
      e[0].fill_(-1);
    }
  }
}

TEST_CASE("cache: positions restore before and after the cache is complete", "[cpu][data]") {
  auto calls = std::make_shared<std::atomic<int>>(0);
  auto make = [&] { return data::range(9).prefetch(1).map(counted(calls)).cache(); };
  const std::vector<int64_t> expected = flat_values(data::range(9).map(counted(calls)));
  for (const bool complete : {false, true}) {
    const data::Dataset ds = make();
    if (complete) CHECK(flat_values(ds) == expected);
    for (int64_t k = 0; k <= 9; ++k) {
      INFO("cache complete: " << complete << ", stopped after " << k);
      data::Iterator it = ds.iterator(0);
      std::vector<int64_t> got = flat_values(it, k);
      const data::IteratorState state = it.save();
      data::Iterator resumed = (complete ? ds : make()).iterator(0);
      resumed.restore(state);
      const std::vector<int64_t> rest = flat_values(resumed);
      got.insert(got.end(), rest.begin(), rest.end());
      CHECK(got == expected);
    }
  }
  data::Iterator it = make().iterator(0);
  data::IteratorState bad = it.save();
  bad.set("3_cache/position", {42});
  CHECK_THROWS_WITH(make().iterator(0).restore(bad), Catch::Contains("past the end"));
}

TEST_CASE("cache(filename): kept in a file that a later run reads, whole or not at all",
          "[cpu][data]") {
  const data::testing::TempDir dir;
  const std::string file = dir.file("parsed.cache");
  auto leftovers = [&] {
    int n = 0;
    for (const auto& entry : std::filesystem::directory_iterator(dir.str()))
      n += entry.path().filename().string().find(".tmp-") != std::string::npos ? 1 : 0;
    return n;
  };
  SECTION("index mode: written during the first epoch, read by later epochs and runs") {
    auto calls = std::make_shared<std::atomic<int>>(0);
    auto make = [&] {
      return data::range(10).map(counted(calls)).cache(file).shuffle(10, 3).batch(4);
    };
    std::vector<std::vector<int64_t>> epoch0, epoch1;
    {
      const data::Dataset ds = make();
      epoch0 = batches_of(ds);
      CHECK(*calls == 10);
      CHECK(std::filesystem::exists(file));
      epoch1 = batches_of(ds);
      CHECK(*calls == 10);
    }
    CHECK(leftovers() == 0);
    const data::Dataset later = make();  // a later run: the file, not the input
    data::Iterator e0 = later.iterator(0), e1 = later.iterator(1);
    CHECK(batches_of(e0) == epoch0);
    CHECK(batches_of(e1) == epoch1);
    CHECK(*calls == 10);
    CHECK_THAT(later.describe(), Catch::Contains("cache('" + file + "')"));
    // Another pipeline naming the file is refused, naming both.
    const data::Dataset other = data::range(11).map(counted(calls)).cache(file);  // not read yet
    CHECK_THROWS_WITH(flat_values(other),
                      Catch::Contains("written by another pipeline") && Catch::Contains(file));
  }
  SECTION("over elements: a cut pass leaves no file; a whole pass writes it; positions restore") {
    auto calls = std::make_shared<std::atomic<int>>(0);
    auto make = [&] { return data::range(8).prefetch(1).map(counted(calls)).cache(file); };
    const std::vector<int64_t> expected = {0, 7, 14, 21, 28, 35, 42, 49};
    {
      const data::Dataset ds = make();
      {
        data::Iterator cut = ds.iterator();
        CHECK(flat_values(cut, 3) == std::vector<int64_t>{0, 7, 14});
      }
      CHECK_FALSE(std::filesystem::exists(file));
    }
    CHECK(leftovers() == 0);  // the partial file went with its dataset
    const data::Dataset ds = make();
    CHECK(flat_values(ds) == expected);
    CHECK(std::filesystem::exists(file));
    const int after_write = *calls;
    for (int64_t k = 0; k <= 8; ++k) {
      data::Iterator it = make().iterator(0);
      std::vector<int64_t> got = flat_values(it, k);
      data::Iterator resumed = make().iterator(0);
      resumed.restore(it.save());
      const std::vector<int64_t> rest = flat_values(resumed);
      got.insert(got.end(), rest.begin(), rest.end());
      CHECK(got == expected);
    }
    CHECK(*calls == after_write);  // every pass above read the file
  }
  SECTION("a damaged file raises naming it") {
    const std::vector<int64_t> expected = flat_values(data::range(6).prefetch(1).cache(file));
    CHECK(expected == std::vector<int64_t>{0, 1, 2, 3, 4, 5});
    const auto size = std::filesystem::file_size(file);
    std::filesystem::resize_file(file, size - 3);
    CHECK_THROWS_WITH(flat_values(data::range(6).prefetch(1).cache(file)),
                      Catch::Contains("not a complete cache file") && Catch::Contains(file));
    CHECK_THROWS_WITH(data::range(6).cache(""), Catch::Contains("the file name is empty"));
  }
}
