// interleave(fn, cycle_length, block_length, num_parallel_calls): tf.data's order (the expected
// sequences below are what TensorFlow 2.21 gives for the same pipelines), the same order on
// several threads, positions saved anywhere restored exactly at any parallelism, and files
// interleaved after file-level sharding.
#include <catch2/catch.hpp>
#include <set>

#include "data/data_test_util.h"
#include "tandem/tandem.h"

namespace td = tandem;
namespace data = tandem::data;
using data::testing::flat_values;
using data::testing::TempDir;

namespace {

int64_t value_of(const data::Element& e) { return e[0].to_vector<int64_t>()[0]; }

/// x -> range(10 x, 10 x + x % 4 + 1): datasets of 1 to 4 elements.
data::Dataset ranges(int64_t n, int64_t cycle, int64_t block, int64_t parallel) {
  return data::range(n).interleave(
      [](const data::Element& e) {
        const int64_t x = value_of(e);
        return data::range(x % 4 + 1).map([x](data::Element v) {
          return data::Element{
              td::Tensor::from_vector(std::vector<int64_t>{10 * x + value_of(v)}, td::Shape{})};
        });
      },
      cycle, block, parallel);
}

/// Every split point: the first k elements, a save, a restore into `other`'s iterator, the rest.
void check_resumes(const data::Dataset& ds, const data::Dataset& other,
                   const std::vector<int64_t>& expected) {
  for (size_t k = 0; k <= expected.size(); ++k) {
    data::Iterator it = ds.iterator(0);
    std::vector<int64_t> got = flat_values(it, static_cast<int64_t>(k));
    const data::IteratorState state = it.save();
    data::Iterator resumed = other.iterator(0);
    resumed.restore(state);
    const std::vector<int64_t> rest = flat_values(resumed);
    got.insert(got.end(), rest.begin(), rest.end());
    INFO("stopped after " << k << " elements; state:\n" << state.to_string());
    CHECK(got == expected);
  }
}

}  // namespace

TEST_CASE("interleave takes tf.data's order, on one thread or several", "[cpu][data]") {
  struct Case {
    int64_t cycle, block;
    std::vector<int64_t> tensorflow;  // tf.data.Dataset.range(6).interleave(...) in TF 2.21
  };
  const std::vector<Case> cases = {
      {2, 2, {0, 10, 11, 20, 21, 22, 30, 31, 40, 32, 33, 50, 51}},
      {3, 1, {0, 10, 20, 11, 21, 30, 22, 31, 40, 32, 50, 33, 51}},
      {1, 3, {0, 10, 11, 20, 21, 22, 30, 31, 32, 33, 40, 50, 51}},
      {4, 2, {0, 10, 11, 20, 21, 30, 31, 40, 22, 32, 33, 50, 51}},
  };
  for (const Case& c : cases) {
    for (const int64_t parallel : {int64_t{1}, int64_t{2}, int64_t{4}}) {
      INFO("cycle_length " << c.cycle << ", block_length " << c.block << ", parallel " << parallel);
      CHECK(flat_values(ranges(6, c.cycle, c.block, parallel)) == c.tensorflow);
    }
  }
  const data::Dataset ds = ranges(6, 2, 2, 2);
  CHECK(ds.cardinality() == data::kUnknownCardinality);
  CHECK(ds.take(3).cardinality() == data::kUnknownCardinality);
  CHECK(ds.repeat().cardinality() == data::kInfiniteCardinality);
  CHECK(ds.element_spec() == std::vector<data::TensorSpec>{{td::Shape{}, td::DType::kInt64}});
  CHECK_THAT(ds.describe(),
             Catch::Contains("interleave(cycle_length=2, block_length=2, num_parallel_calls=2)"));
  CHECK_THROWS_WITH(ranges(6, 0, 1, 1), Catch::Contains("cycle_length must be at least 1"));
  CHECK_THROWS_WITH(ranges(6, 2, 0, 1), Catch::Contains("block_length must be at least 1, got 0"));
}

TEST_CASE("interleave resumes exactly from any position, at any parallelism", "[cpu][data]") {
  const std::vector<int64_t> expected = flat_values(ranges(9, 3, 2, 1));
  REQUIRE(expected.size() == 21);  // datasets of 1, 2, 3, 4, 1, 2, 3, 4, 1
  check_resumes(ranges(9, 3, 2, 1), ranges(9, 3, 2, 1), expected);
  check_resumes(ranges(9, 3, 2, 3), ranges(9, 3, 2, 3), expected);
  check_resumes(ranges(9, 3, 2, 3), ranges(9, 3, 2, 1), expected);
  check_resumes(ranges(9, 3, 2, 1), ranges(9, 3, 2, 2), expected);
  // Another cycle_length is another order: its state is refused.
  data::Iterator it = ranges(9, 3, 2, 1).iterator(0);
  (void)flat_values(it, 4);
  data::Iterator other = ranges(9, 2, 2, 1).iterator(0);
  CHECK_THROWS_WITH(other.restore(it.save()), Catch::Contains("different pipeline"));
}

TEST_CASE("interleave: an error in an open dataset surfaces in its place", "[cpu][data]") {
  for (const int64_t parallel : {int64_t{1}, int64_t{3}}) {
    INFO("parallel " << parallel);
    const data::Dataset ds = data::range(4).interleave(
        [](const data::Element& e) {
          const int64_t x = value_of(e);
          return data::range(3).map([x](data::Element v) {
            TANDEM_CHECK(!(x == 2 && value_of(v) == 1), "element 1 of dataset 2 is damaged");
            return data::Element{
                td::Tensor::from_vector(std::vector<int64_t>{10 * x + value_of(v)}, td::Shape{})};
          });
        },
        2, 1, parallel);
    data::Iterator it = ds.iterator(0);
    // tf.data's order: 0 10 1 11 2 12 20 30, then 21 raises, and the turn stays with dataset 2
    CHECK(flat_values(it, 8) == std::vector<int64_t>{0, 10, 1, 11, 2, 12, 20, 30});
    // Saved before the error is raised (on the pool it is already read), and after it.
    const data::IteratorState before_error = it.save();
    data::Element e;
    CHECK_THROWS_WITH(it.next(e), Catch::Contains("element 1 of dataset 2 is damaged"));
    const data::IteratorState after_error = it.save();
    CHECK(flat_values(it) == std::vector<int64_t>{22, 31, 32});
    data::Iterator again = ds.iterator(0);
    again.restore(before_error);
    CHECK_THROWS_WITH(again.next(e), Catch::Contains("element 1 of dataset 2 is damaged"));
    CHECK(flat_values(again) == std::vector<int64_t>{22, 31, 32});
    data::Iterator after = ds.iterator(0);
    after.restore(after_error);
    CHECK(flat_values(after) == std::vector<int64_t>{22, 31, 32});
  }
}

TEST_CASE("file_names + interleave read TFRecord files, dealt to workers by file",
          "[cpu][data][tfrecord]") {
  const TempDir dir;
  // 5 files of 3, 6, 1, 4 and 2 records; record n holds the int64 n.
  std::multiset<int64_t> all;
  data::testing::write_numbered_tfrecords(dir, {3, 6, 1, 4, 2}, all);
  const data::FeatureSpec spec = {{"y", data::FixedLenFeature{{}, td::DType::kInt64}}};
  auto pipeline = [&](int64_t parallel) {
    return data::file_names(data::list_files(dir.file("part-*.tfrecord")))
        .interleave([](const data::Element& e) { return data::tfrecord({data::as_string(e[0])}); },
                    3, 2, parallel)
        .map([spec](data::Element e) { return data::parse_example(e[0], spec); }, 2);
  };
  const std::vector<int64_t> order = flat_values(pipeline(1));
  CHECK(std::multiset<int64_t>(order.begin(), order.end()) == all);
  CHECK(flat_values(pipeline(3)) == order);
  CHECK(order.front() == 0);
  CHECK(order[2] == 3);  // the second file's first record, after a block of 2 of the first
  check_resumes(pipeline(3), pipeline(1), order);

  CHECK(data::as_string(data::file_names({"a/b.tfrecord"}).iterator().begin()->at(0)) ==
        "a/b.tfrecord");
  CHECK_THROWS_WITH(data::as_string(td::Tensor::zeros({2}, td::DType::kFloat32)),
                    Catch::Contains("expected a uint8 tensor of rank 1"));

  // kFile: worker w interleaves files w, w + 2, ...; together they read every record once.
  std::multiset<int64_t> dealt;
  for (int64_t w = 0; w < 2; ++w) {
    const data::Dataset mine = data::auto_shard(pipeline(2), data::AutoShardPolicy::kFile, 2, w);
    CHECK_THAT(mine.describe(),
               Catch::Contains(w == 0 ? "file_names(3 file(s))" : "file_names(2 file(s))"));
    for (const int64_t y : flat_values(mine)) dealt.insert(y);
  }
  CHECK(dealt == all);
}
