// Tests of the dataset pipeline: sources, map, shuffle, batch, repeat, take, skip, shard,
// prefetch, cardinality and element specs.
#include <algorithm>
#include <catch2/catch.hpp>
#include <numeric>
#include <set>

#include "data_test_util.h"
#include "tandem/tandem.h"

using namespace tandem;
using namespace tandem::data;
using data::testing::batches_of;
using data::testing::flat_values;

namespace {
std::vector<int64_t> iota(int64_t begin, int64_t end) {
  std::vector<int64_t> v(static_cast<size_t>(end - begin));
  std::iota(v.begin(), v.end(), begin);
  return v;
}
}  // namespace

TEST_CASE("from_tensor_slices slices along axis 0 and copies its input", "[cpu][data]") {
  Tensor x = Tensor::from_vector<float>({1, 2, 3, 4, 5, 6}, {3, 2});
  Tensor y = Tensor::from_vector<int64_t>({7, 8, 9});
  Dataset ds = from_tensor_slices({x, y});
  x.data<float>()[0] = 100.0f;  // the dataset holds its own copy
  CHECK(ds.cardinality() == 3);
  REQUIRE(ds.element_spec().size() == 2);
  CHECK(ds.element_spec()[0] == TensorSpec{Shape{2}, DType::kFloat32});
  CHECK(ds.element_spec()[1] == TensorSpec{Shape{}, DType::kInt64});
  std::vector<std::vector<float>> xs;
  std::vector<int64_t> ys;
  for (const Element& e : ds) {
    REQUIRE(e.size() == 2);
    CHECK(e[0].shape() == Shape{2});
    CHECK(e[1].rank() == 0);
    xs.push_back(e[0].to_vector<float>());
    ys.push_back(e[1].item<int64_t>());
  }
  CHECK(xs == std::vector<std::vector<float>>{{1, 2}, {3, 4}, {5, 6}});
  CHECK(ys == std::vector<int64_t>{7, 8, 9});

  CHECK_THROWS_WITH(from_tensor_slices({x, Tensor::zeros({2})}),
                    Catch::Contains("tensor 1 has 2 rows") && Catch::Contains("tensor 0 has 3"));
  CHECK_THROWS_WITH(from_tensor_slices({Tensor::scalar(1.0)}), Catch::Contains("scalar"));
  CHECK_THROWS_WITH(from_tensor_slices({}), Catch::Contains("no tensors"));
}

TEST_CASE("range, take, skip and repeat", "[cpu][data]") {
  CHECK(flat_values(range(5)) == iota(0, 5));
  CHECK(flat_values(range(0)).empty());
  CHECK(flat_values(range(10).take(3)) == iota(0, 3));
  CHECK(flat_values(range(10).take(-1)) == iota(0, 10));
  CHECK(flat_values(range(10).take(20)) == iota(0, 10));
  CHECK(flat_values(range(10).skip(7)) == iota(7, 10));
  CHECK(flat_values(range(10).skip(20)).empty());
  CHECK(flat_values(range(10).skip(-1)).empty());
  CHECK(flat_values(range(3).repeat(2)) == std::vector<int64_t>{0, 1, 2, 0, 1, 2});
  CHECK(flat_values(range(3).repeat(0)).empty());
  CHECK(flat_values(range(3).repeat().take(7)) == std::vector<int64_t>{0, 1, 2, 0, 1, 2, 0});
  CHECK(flat_values(range(0).repeat()).empty());  // an empty pass ends an endless repeat
  CHECK(flat_values(range(10).skip(2).take(3).repeat(2)) == std::vector<int64_t>{2, 3, 4, 2, 3, 4});
  CHECK(range(3).repeat().cardinality() == kInfiniteCardinality);
  CHECK(range(3).repeat(4).cardinality() == 12);
  CHECK(range(10).skip(4).take(3).cardinality() == 3);
  CHECK(range(3).repeat().take(5).cardinality() == 5);
  CHECK_THROWS_WITH(range(3).repeat(-2), Catch::Contains("repeat: count must be"));
  CHECK_THROWS_WITH(range(3).take(-5), Catch::Contains("take: count must be"));
}

TEST_CASE("map transforms elements and keeps order", "[cpu][data]") {
  Dataset doubled = range(6).map([](Element e) {
    const int64_t v = e[0].item<int64_t>();
    return Element{Tensor::scalar(static_cast<double>(2 * v), DType::kInt64),
                   Tensor::full({2}, static_cast<double>(v), DType::kFloat32)};
  });
  CHECK(flat_values(doubled) == std::vector<int64_t>{0, 2, 4, 6, 8, 10});
  REQUIRE(doubled.element_spec().size() == 2);
  CHECK(doubled.element_spec()[1] == TensorSpec{Shape{2}, DType::kFloat32});
  // map over a shuffle and a shuffle over a map give the mapped elements, each once.
  std::vector<int64_t> values = flat_values(doubled.shuffle(6, 3));
  std::sort(values.begin(), values.end());
  CHECK(values == std::vector<int64_t>{0, 2, 4, 6, 8, 10});
  Iterator it = range(4).shuffle(4, 9).map([](Element e) { return e; }).batch(4).iterator();
  Element batch;
  REQUIRE(it.next(batch));
  std::vector<int64_t> batch_values = batch[0].to_vector<int64_t>();
  std::sort(batch_values.begin(), batch_values.end());
  CHECK(batch_values == iota(0, 4));
  CHECK_THROWS_WITH(range(3).map(nullptr), Catch::Contains("map: the function is empty"));
}

TEST_CASE("batch stacks along a new axis 0 and keeps or drops the remainder", "[cpu][data]") {
  CHECK(batches_of(range(7).batch(3)) ==
        std::vector<std::vector<int64_t>>{{0, 1, 2}, {3, 4, 5}, {6}});
  CHECK(batches_of(range(7).batch(3, /*drop_remainder=*/true)) ==
        std::vector<std::vector<int64_t>>{{0, 1, 2}, {3, 4, 5}});
  CHECK(range(7).batch(3).cardinality() == 3);
  CHECK(range(7).batch(3, true).cardinality() == 2);
  CHECK(range(7).batch(3).element_spec()[0].shape == Shape{-1});
  CHECK(range(7).batch(3, true).element_spec()[0].shape == Shape{3});

  // Rows of multi-dimensional elements keep their shape and values.
  Tensor images = Tensor::arange(5 * 2 * 3, DType::kFloat32).view_as({5, 2, 3});
  Iterator it = from_tensor_slices({images, Tensor::arange(5)}).batch(2).iterator();
  Element b;
  REQUIRE(it.next(b));
  CHECK(b[0].shape() == Shape{2, 2, 3});
  CHECK(b[1].shape() == Shape{2});
  CHECK(b[0].to_vector<float>()[7] == 7.0f);
  REQUIRE(it.next(b));
  REQUIRE(it.next(b));
  CHECK(b[0].shape() == Shape{1, 2, 3});
  CHECK(b[0].to_vector<float>()[0] == 24.0f);
  CHECK_FALSE(it.next(b));

  // The element path (batch of batches) stacks too, and checks shapes.
  CHECK(batches_of(range(8).batch(2).batch(2))[1] == std::vector<int64_t>{4, 5, 6, 7});
  Dataset ragged = range(3).map([](Element e) {
    const int64_t n = e[0].item<int64_t>() + 1;
    return Element{Tensor::zeros({n})};
  });
  Iterator ragged_it = ragged.batch(3).iterator();
  CHECK_THROWS_WITH(ragged_it.next(b), Catch::Contains("tensor 0 of element 1 is [2] float32") &&
                                           Catch::Contains("had [1] float32"));
  CHECK_THROWS_WITH(range(3).batch(0), Catch::Contains("batch_size must be at least 1, got 0"));
}

TEST_CASE("shard keeps every n-th element starting at index and validates", "[cpu][data]") {
  CHECK(flat_values(range(10).shard(3, 0)) == std::vector<int64_t>{0, 3, 6, 9});
  CHECK(flat_values(range(10).shard(3, 1)) == std::vector<int64_t>{1, 4, 7});
  CHECK(flat_values(range(10).shard(3, 2)) == std::vector<int64_t>{2, 5, 8});
  CHECK(flat_values(range(10).shard(1, 0)) == iota(0, 10));
  CHECK(flat_values(range(2).shard(4, 3)).empty());
  CHECK(range(10).shard(3, 1).cardinality() == 3);
  CHECK(range(10).shard(3, 0).cardinality() == 4);
  CHECK(batches_of(range(10).shard(2, 1).batch(2)) ==
        std::vector<std::vector<int64_t>>{{1, 3}, {5, 7}, {9}});
  CHECK_THROWS_WITH(range(4).shard(2, 2), Catch::Contains("index 2 is out of range for 2 shards"));
  CHECK_THROWS_WITH(range(4).shard(2, -1), Catch::Contains("index -1 is out of range"));
  CHECK_THROWS_WITH(range(4).shard(0, 0), Catch::Contains("num_shards must be at least 1, got 0"));
}

TEST_CASE("shuffle is deterministic per seed and reshuffles each epoch", "[cpu][data]") {
  auto pipeline = [](uint64_t seed, bool reshuffle) {
    return range(100).shuffle(40, seed, reshuffle);
  };
  Dataset a = pipeline(42, true);
  Dataset b = pipeline(42, true);
  const std::vector<int64_t> a0 = flat_values(a), a1 = flat_values(a), a2 = flat_values(a);
  const std::vector<int64_t> b0 = flat_values(b), b1 = flat_values(b);
  CHECK(a0 == b0);  // same seed, same epoch: same order
  CHECK(a1 == b1);
  CHECK(a0 != a1);  // every epoch differs
  CHECK(a1 != a2);
  CHECK(a0 != iota(0, 100));
  for (const auto* epoch : {&a0, &a1}) {
    std::vector<int64_t> sorted = *epoch;
    std::sort(sorted.begin(), sorted.end());
    CHECK(sorted == iota(0, 100));  // a permutation
  }
  CHECK(flat_values(pipeline(43, true)) != a0);  // another seed, another order
  // An explicit epoch gives that epoch's order, independent of the counter.
  Iterator second = a.iterator(1);
  CHECK(flat_values(second) == a1);

  Dataset fixed = pipeline(42, false);
  const std::vector<int64_t> f0 = flat_values(fixed), f1 = flat_values(fixed);
  CHECK(f0 == f1);
  CHECK(f0 != iota(0, 100));

  // A buffer of one is the identity; a buffer covering the data gives a full permutation.
  CHECK(flat_values(range(20).shuffle(1, 5)) == iota(0, 20));
  std::vector<int64_t> full = flat_values(range(20).shuffle(1000, 5));
  CHECK(full != iota(0, 20));
  std::sort(full.begin(), full.end());
  CHECK(full == iota(0, 20));

  // With repeat inside the pipeline, each pass is a new epoch.
  const std::vector<int64_t> passes = flat_values(range(10).shuffle(10, 1).repeat(2));
  CHECK(std::vector<int64_t>(passes.begin(), passes.begin() + 10) !=
        std::vector<int64_t>(passes.begin() + 10, passes.end()));
  CHECK_THROWS_WITH(range(3).shuffle(0, 1), Catch::Contains("buffer_size must be at least 1"));
}

TEST_CASE("shuffle draws uniformly from its buffer", "[cpu][data]") {
  // Position of element 0 over many epochs of shuffle(10) on 10 elements: roughly uniform.
  Dataset ds = range(10).shuffle(10, 2024);
  std::vector<int> first_counts(10, 0);
  for (int epoch = 0; epoch < 2000; ++epoch) {
    Iterator it = ds.iterator(static_cast<uint64_t>(epoch));
    Element e;
    REQUIRE(it.next(e));
    ++first_counts[static_cast<size_t>(e[0].item<int64_t>())];
  }
  for (int c : first_counts) CHECK((c > 140 && c < 260));  // expected 200
}

TEST_CASE("prefetch keeps the order, surfaces producer errors and stops cleanly", "[cpu][data]") {
  Dataset base = range(500).shuffle(100, 11).batch(7);
  Iterator reference = base.iterator(0);
  const auto expected = batches_of(reference);
  CHECK(batches_of(base.prefetch(3)) == expected);  // a new dataset: its first epoch is 0
  CHECK(batches_of(base.prefetch(1).prefetch(2)) == expected);
  CHECK(flat_values(range(50).prefetch(kAutotune)) == iota(0, 50));
  CHECK(base.prefetch(2).cardinality() == base.cardinality());

  Dataset failing = range(10).map([](Element e) {
    if (e[0].item<int64_t>() == 5) throw Error("bad element 5");
    return e;
  });
  Iterator it = failing.prefetch(2).iterator();
  Element e;
  for (int64_t i = 0; i < 5; ++i) {
    REQUIRE(it.next(e));
    CHECK(e[0].item<int64_t>() == i);
  }
  CHECK_THROWS_WITH(it.next(e), Catch::Contains("bad element 5"));

  // Destroying an iterator mid-epoch (even of an endless dataset) joins its thread.
  for (int round = 0; round < 20; ++round) {
    Iterator endless = range(10).repeat().batch(3).prefetch(4).iterator();
    REQUIRE(endless.next(e));
    CHECK(e[0].dim(0) == 3);
  }
  { Iterator never_started = range(10).prefetch(2).iterator(); }
  CHECK_THROWS_WITH(range(3).prefetch(0), Catch::Contains("prefetch: buffer_size"));
}

TEST_CASE("datasets describe themselves and iterate with range-for", "[cpu][data]") {
  Dataset ds = range(10).shuffle(10, 42).batch(4, true).prefetch(2);
  CHECK(ds.describe() ==
        "range(10 elements of [] int64) -> shuffle(buffer_size=10, seed=42, "
        "reshuffle_each_iteration=true) -> batch(4, drop_remainder=true) -> prefetch(2)");
  int batches = 0;
  for (const Element& batch : ds) {
    CHECK(batch[0].shape() == Shape{4});
    ++batches;
  }
  CHECK(batches == 2);
  Iterator it = range(3).iterator();
  std::vector<int64_t> seen;
  for (const Element& e : it) seen.push_back(e[0].item<int64_t>());
  CHECK(seen == iota(0, 3));
}

TEST_CASE("Batch exposes features, labels and the batch size", "[cpu][data]") {
  Batch batch({Tensor::zeros({5, 28, 28}), Tensor::zeros({5}, DType::kInt64)});
  CHECK(batch.size() == 2);
  CHECK(batch.batch_size() == 5);
  CHECK(batch.features().shape() == Shape{5, 28, 28});
  CHECK(batch.labels().dtype() == DType::kInt64);
  CHECK(batch[1].shape() == Shape{5});
  CHECK_FALSE(batch.empty());
  CHECK_THROWS_WITH(batch[2], Catch::Contains("tensor 2 requested, the batch holds 2"));
  Batch empty({Tensor::zeros({0, 3})});
  CHECK(empty.batch_size() == 0);
  CHECK(empty.empty());
  CHECK_THROWS_WITH(empty.labels(), Catch::Contains("holds 1 tensor(s)"));
  CHECK(Batch().batch_size() == 0);
  CHECK_THROWS_WITH(Batch().features(), Catch::Contains("no tensors"));
}
