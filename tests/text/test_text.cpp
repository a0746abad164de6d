// Text for language models: CharTokenizer (sorted distinct bytes, encode/decode, errors naming
// the byte and its position, its vocabulary through a checkpoint) and data::random_windows
// (next-token pairs from one offset, deterministic per seed, resumable mid-epoch, each replica's
// rows its own windows); and the Shakespeare corpus scripts/get-shakespeare fetches, when present.
#include <catch2/catch.hpp>
#include <filesystem>
#include <set>

#include "tandem/tandem.h"

namespace td = tandem;
namespace fs = std::filesystem;
using td::text::CharTokenizer;

TEST_CASE("CharTokenizer: the corpus's sorted bytes, encode and decode", "[cpu][text]") {
  const CharTokenizer tokenizer = CharTokenizer::from_corpus("hello, world\n");
  CHECK(tokenizer.vocabulary() == std::string("\n ,dehlorw"));
  CHECK(tokenizer.vocabulary_size() == 10);
  const td::Tensor ids = tokenizer.encode("world, hello");
  CHECK(ids.dtype() == td::DType::kInt64);
  CHECK(ids.to_vector<int64_t>() == std::vector<int64_t>{9, 7, 8, 6, 3, 2, 1, 5, 4, 6, 6, 7});
  CHECK(tokenizer.decode(ids) == "world, hello");
  CHECK(tokenizer.decode(td::ops::cast(td::ops::reshape(ids, {3, 4}), td::DType::kInt32)) ==
        "world, hello");
  CHECK_THROWS_WITH(tokenizer.encode("hello!"),
                    Catch::Contains("'!' (33) at position 5 is not in the vocabulary of 10"));
  CHECK_THROWS_WITH(tokenizer.decode(td::Tensor::from_vector<int64_t>({1, 10})),
                    Catch::Contains("id 10 at position 1 is outside the vocabulary [0, 10)"));
  CHECK_THROWS_WITH(CharTokenizer::from_corpus(""), Catch::Contains("the corpus is empty"));
}

TEST_CASE("CharTokenizer's vocabulary goes through a checkpoint", "[cpu][text][checkpoint]") {
  const fs::path path = fs::temp_directory_path() / "tandem_test_tokenizer.h5";
  CharTokenizer saved = CharTokenizer::from_corpus("To be, or not to be");
  td::Checkpoint({{"tokenizer", &saved}}).write(path.string());
  CharTokenizer restored;
  CHECK(restored.vocabulary_size() == 0);
  CHECK_THROWS(restored.encode("T"));
  td::Checkpoint({{"tokenizer", &restored}}).restore(path.string());
  CHECK(restored.vocabulary() == saved.vocabulary());
  CHECK(restored.decode(saved.encode("not to be")) == "not to be");
  fs::remove(path);
}

TEST_CASE("random_windows: a window and its next tokens, from a seeded offset",
          "[cpu][text][data]") {
  std::vector<int64_t> values;
  for (int64_t i = 0; i < 1000; ++i) values.push_back((i * 7919) % 1000);  // position from value
  const td::Tensor tokens = td::Tensor::from_vector(values);
  const td::data::Dataset windows = td::data::random_windows(tokens, 16, 50, 3);
  CHECK(windows.cardinality() == 50);
  std::set<int64_t> offsets;
  std::vector<std::vector<int64_t>> first;
  for (const td::data::Element& e : windows) {
    REQUIRE(e.size() == 2);
    const std::vector<int64_t> x = e[0].to_vector<int64_t>(), y = e[1].to_vector<int64_t>();
    REQUIRE(x.size() == 16);
    // The offset of x in the tokens: value v sits at the position p with p * 7919 % 1000 == v.
    int64_t o = 0;
    while ((o * 7919) % 1000 != x[0]) ++o;
    CHECK(o + 16 < 1000);
    for (int64_t i = 0; i < 16; ++i) {
      CHECK(x[i] == values[o + i]);
      CHECK(y[i] == values[o + i + 1]);
    }
    offsets.insert(o);
    first.push_back(x);
  }
  CHECK(offsets.size() > 40);  // spread out
  // The same seed gives the same windows; another seed others. int32 tokens work alike.
  size_t i = 0;
  for (const td::data::Element& e :
       td::data::random_windows(td::ops::cast(tokens, td::DType::kInt32), 16, 50, 3))
    CHECK(e[0].to_vector<int64_t>() == first[i++]);
  td::data::Element other;
  REQUIRE(td::data::random_windows(tokens, 16, 50, 4).iterator().next(other));
  CHECK(other[0].to_vector<int64_t>() != first[0]);
  CHECK_THROWS_WITH(td::data::random_windows(tokens, 1000, 5, 1),
                    Catch::Contains("1000 tokens hold no window of 1000"));
  CHECK_THROWS_WITH(td::data::random_windows(td::Tensor::zeros({10}), 2, 5, 1),
                    Catch::Contains("needs tokens int32 or int64"));
}

TEST_CASE("random_windows resume mid-epoch and give each replica its own windows",
          "[cpu][text][data][distribute]") {
  std::vector<int64_t> values;
  for (int64_t i = 0; i < 5000; ++i) values.push_back(i);
  const td::data::Dataset batches =
      td::data::random_windows(td::Tensor::from_vector(values), 8, 64, 11).batch(8);
  td::data::Iterator it = batches.iterator(0);
  td::data::Element e;
  for (int k = 0; k < 3; ++k) REQUIRE(it.next(e));
  const td::data::IteratorState state = it.save();
  REQUIRE(it.next(e));
  const std::vector<int64_t> next = e[0].to_vector<int64_t>();
  td::data::Iterator resumed = batches.iterator(0);
  resumed.restore(state);
  REQUIRE(resumed.next(e));
  CHECK(e[0].to_vector<int64_t>() == next);

  td::MirroredStrategy strategy = td::MirroredStrategy::cpu(2);
  td::data::DistributedDataset dist = strategy.distribute_dataset(batches);
  for (const td::PerReplica<td::data::Batch>& batch : dist) {
    const td::Tensor a = batch[0][0], b = batch[1][0];
    REQUIRE(a.shape() == td::Shape{4, 8});
    REQUIRE(b.shape() == td::Shape{4, 8});
    std::set<int64_t> starts;
    for (const td::Tensor& part : {a, b})
      for (int64_t r = 0; r < 4; ++r) starts.insert(part.to_vector<int64_t>()[r * 8]);
    CHECK(starts.size() == 8);  // eight different windows in the step
  }
}

TEST_CASE("the Shakespeare corpus: 5,057,198 bytes of 84 characters", "[cpu][text]") {
  const std::string path = std::string(TANDEM_SOURCE_DIR) + "/data/shakespeare/shakespeare.txt";
  if (!fs::exists(path)) {
    WARN("no corpus at " << path << " (scripts/get-shakespeare fetches it); skipped");
    return;
  }
  const std::string corpus = td::data::read_text_file(path);
  CHECK(corpus.size() == 5057198);
  const CharTokenizer tokenizer = CharTokenizer::from_corpus(corpus);
  CHECK(tokenizer.vocabulary_size() == 84);
  CHECK(tokenizer.decode(tokenizer.encode(corpus.substr(0, 1000))) == corpus.substr(0, 1000));
  CHECK_THROWS_WITH(td::data::read_text_file(path + ".missing"), Catch::Contains("cannot open"));
}
