// TFRecord files and tf.train.Example: Tandem reads what TensorFlow 2.21 wrote (plain, GZIP,
// ZLIB; every kind of feature) to the values TensorFlow parses (tests/fixtures/tfrecord, made by
// its make_fixtures.py), writes what TensorFlow writes, and names the file and offset of every
// kind of damage; data::tfrecord indexes files, resumes exactly and deals files to workers.
#include <zlib.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "data/data_test_util.h"
#include "tandem/tandem.h"

namespace td = tandem;
namespace data = tandem::data;
namespace io = tandem::io;
using data::testing::TempDir;

namespace {

const std::string kFixtures = std::string(TANDEM_SOURCE_DIR) + "/tests/fixtures/tfrecord/";

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  REQUIRE(in.good());
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out << bytes;
}

std::vector<std::string> read_all(const std::string& path, io::Compression c) {
  io::TFRecordReader reader(path, {.compression = c});
  std::vector<std::string> out;
  std::string record;
  while (reader.next(record)) out.push_back(record);
  return out;
}

/// The spec make_fixtures.py parses with, in name order (as parsed.txt lists them).
data::FeatureSpec fixture_spec() {
  return {{"image", data::FixedLenFeature{{}, td::DType::kUInt8}},
          {"label", data::FixedLenFeature{{}, td::DType::kInt64}},
          {"names", data::VarLenFeature{td::DType::kUInt8}},
          {"optional", data::FixedLenFeature{{1}, td::DType::kFloat32, std::vector<double>{-7.5}}},
          {"tokens", data::VarLenFeature{td::DType::kInt64}},
          {"values", data::FixedLenFeature{{3}, td::DType::kFloat32}},
          {"weights", data::VarLenFeature{td::DType::kFloat32}}};
}

/// parsed.txt's lines for one record: "record feature dtype values..." (floats as bit hex;
/// bytes values as hex, one word per value).
std::vector<std::string> describe(int record, const std::string& serialized) {
  const data::Example example = data::Example::parse(serialized);
  const data::FeatureSpec spec = fixture_spec();
  const data::Element parsed = data::parse_example(serialized, spec);
  std::vector<std::string> lines;
  char buf[16];
  for (size_t k = 0; k < spec.size(); ++k) {
    const std::string& name = spec[k].first;
    // As make_fixtures.py writes them: "<dtype> " then the values joined by spaces.
    std::vector<std::string> words;
    std::string dtype;
    const td::Tensor& t = parsed[k];
    if (t.dtype() == td::DType::kFloat32) {
      dtype = "float32";
      for (const float f : t.to_vector<float>()) {
        uint32_t bits;
        std::memcpy(&bits, &f, 4);
        std::snprintf(buf, sizeof buf, "%08x", bits);
        words.emplace_back(buf);
      }
    } else if (t.dtype() == td::DType::kInt64) {
      dtype = "int64";
      for (const int64_t v : t.to_vector<int64_t>()) words.push_back(std::to_string(v));
    } else {
      // Bytes: one hex word per value ("-" when empty), as the Example holds them; the tensor
      // holds them concatenated.
      dtype = "bytes";
      const auto it = example.features().find(name);
      std::string joined;
      if (it != example.features().end())
        for (const std::string& value : it->second.bytes) {
          std::string word;
          for (const char c : value) {
            std::snprintf(buf, sizeof buf, "%02x", static_cast<unsigned char>(c));
            word += buf;
          }
          words.push_back(word.empty() ? "-" : word);
          joined += value;
        }
      const std::vector<uint8_t> held = t.to_vector<uint8_t>();
      CHECK(std::string(held.begin(), held.end()) == joined);
    }
    std::string line = std::to_string(record);
    line.append(" ").append(name).append(" ").append(dtype).append(" ");
    for (size_t w = 0; w < words.size(); ++w) line.append(w ? " " : "").append(words[w]);
    lines.push_back(line);
  }
  return lines;
}

std::vector<std::string> lines_of(const std::string& path) {
  std::istringstream in(read_bytes(path));
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) lines.push_back(line);
  return lines;
}

/// The Examples make_fixtures.py writes (its example(i)), built with Tandem.
data::Example fixture_example(int i) {
  data::Example e;
  std::string image;
  for (int k = 0; k < 12 + i; ++k) image.push_back(static_cast<char>((i * 7 + k) % 256));
  e.set_bytes("image", {image});
  e.set_int64s("label", {i});
  e.set_floats("values", {i * 0.5f, -1.25f, i % 2 ? 3.0e38f : 1e-40f});
  std::vector<int64_t> tokens;
  for (int j = 0; j <= i; ++j) tokens.push_back((i * 10 + j) * (j % 2 ? -1 : 1));
  if (i == 3) tokens.push_back((int64_t{1} << 62) + i);
  e.set_int64s("tokens", tokens);
  std::vector<std::string> names;
  for (int j = 0; j < i % 3; ++j) {
    std::string name = "n";
    name.append(std::to_string(i)).append("_").append(std::to_string(j));
    names.push_back(name);
  }
  e.set_bytes("names", names);
  std::vector<float> weights;
  for (int j = 0; j < i % 4; ++j) weights.push_back(static_cast<float>(j / 3.0));
  e.set_floats("weights", weights);
  if (i % 2 == 0) e.set_floats("optional", {i + 0.25f});
  return e;
}

constexpr int kFixtureRecords = 6;

}  // namespace

TEST_CASE("TFRecord files written by TensorFlow read back as TensorFlow parses them",
          "[cpu][data][tfrecord]") {
  const std::vector<std::string> expected = lines_of(kFixtures + "parsed.txt");
  for (const auto& [file, compression] :
       {std::pair{"examples.tfrecord", io::Compression::kNone},
        std::pair{"examples.gz.tfrecord", io::Compression::kGzip},
        std::pair{"examples.zlib.tfrecord", io::Compression::kZlib}}) {
    DYNAMIC_SECTION(file) {
      const std::vector<std::string> records = read_all(kFixtures + file, compression);
      REQUIRE(records.size() == kFixtureRecords);
      std::vector<std::string> lines;
      for (int r = 0; r < kFixtureRecords; ++r)
        for (const std::string& line : describe(r, records[static_cast<size_t>(r)]))
          lines.push_back(line);
      CHECK(lines == expected);
    }
  }
  // Raw records: empty, short and 100,000 bytes.
  const std::vector<std::string> raw = read_all(kFixtures + "raw.tfrecord", io::Compression::kNone);
  REQUIRE(raw.size() == 3);
  CHECK(raw[0].empty());
  CHECK(raw[1] == "abc");
  REQUIRE(raw[2].size() == 100000);
  bool same = true;
  for (size_t k = 0; k < raw[2].size(); ++k)
    same = same && static_cast<unsigned char>(raw[2][k]) == (k * 31) % 251;
  CHECK(same);
}

TEST_CASE("Tandem writes TFRecord files as TensorFlow does", "[cpu][data][tfrecord]") {
  const TempDir dir;
  // Framing is deterministic: the same records give TensorFlow's bytes exactly.
  {
    io::TFRecordWriter w(dir.file("raw.tfrecord"));
    for (const std::string& r : read_all(kFixtures + "raw.tfrecord", io::Compression::kNone))
      w.write(r);
    w.close();
    CHECK(w.records() == 3);
  }
  CHECK(read_bytes(dir.file("raw.tfrecord")) == read_bytes(kFixtures + "raw.tfrecord"));
  {
    io::TFRecordWriter w(dir.file("examples.tfrecord"));
    for (const std::string& r : read_all(kFixtures + "examples.tfrecord", io::Compression::kNone))
      w.write(r);
  }  // closed by the destructor
  CHECK(read_bytes(dir.file("examples.tfrecord")) == read_bytes(kFixtures + "examples.tfrecord"));

  // Examples built with Tandem, in every compression, parse to TensorFlow's values. With
  // TANDEM_TFRECORD_KEEP=DIR the files stay in DIR for make_fixtures.py --check DIR, which
  // reads them with TensorFlow.
  const char* keep = std::getenv("TANDEM_TFRECORD_KEEP");
  const std::string out = keep != nullptr ? std::string(keep) : dir.str();
  std::filesystem::create_directories(out);
  const std::vector<std::string> expected = lines_of(kFixtures + "parsed.txt");
  write_bytes(out + "/expected.txt", read_bytes(kFixtures + "parsed.txt"));
  for (const auto& [suffix, compression] :
       {std::pair{"", io::Compression::kNone}, std::pair{".gz", io::Compression::kGzip},
        std::pair{".zlib", io::Compression::kZlib}}) {
    const std::string path = out + "/tandem" + suffix + ".tfrecord";
    {
      io::TFRecordWriter w(path, compression);
      for (int i = 0; i < kFixtureRecords; ++i) w.write(fixture_example(i).serialize());
      w.close();
    }
    std::vector<std::string> lines;
    const std::vector<std::string> records = read_all(path, compression);
    REQUIRE(records.size() == kFixtureRecords);
    for (int r = 0; r < kFixtureRecords; ++r) {
      for (const std::string& line : describe(r, records[static_cast<size_t>(r)]))
        lines.push_back(line);
      // Example round trip: parse(serialize(e)) == e.
      CHECK(data::Example::parse(records[static_cast<size_t>(r)]).features() ==
            fixture_example(r).features());
    }
    CHECK(lines == expected);
  }
  // The compressed files are real gzip and zlib streams (zlib alone inflates them to the
  // uncompressed file's bytes).
  const std::string plain = read_bytes(out + "/tandem.tfrecord");
  for (const auto& [suffix, bits] : {std::pair{".gz", 31}, std::pair{".zlib", 15}}) {
    const std::string packed = read_bytes(out + "/tandem" + std::string(suffix) + ".tfrecord");
    z_stream z{};
    REQUIRE(inflateInit2(&z, bits) == Z_OK);
    std::string inflated(plain.size() + 64, '\0');
    z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(packed.data()));
    z.avail_in = static_cast<uInt>(packed.size());
    z.next_out = reinterpret_cast<Bytef*>(inflated.data());
    z.avail_out = static_cast<uInt>(inflated.size());
    CHECK(inflate(&z, Z_FINISH) == Z_STREAM_END);
    inflated.resize(z.total_out);
    inflateEnd(&z);
    CHECK(inflated == plain);
  }
}

TEST_CASE("TFRecord readers: offsets, seeking and skipping", "[cpu][data][tfrecord]") {
  const TempDir dir;
  std::vector<std::string> records = {"", "x", std::string(300000, 'q'), "last"};
  for (const auto c : {io::Compression::kNone, io::Compression::kGzip, io::Compression::kZlib}) {
    DYNAMIC_SECTION("compression '" << io::compression_name(c) << "'") {
      const std::string path = dir.file("r.tfrecord");
      {
        io::TFRecordWriter w(path, c);
        for (const std::string& r : records) w.write(r);
      }
      io::TFRecordReader reader(path, {.compression = c});
      std::vector<uint64_t> offsets;
      for (size_t k = 0; k < records.size(); ++k) {
        offsets.push_back(reader.offset());
        CHECK(reader.skip_next());
      }
      std::string record;
      CHECK_FALSE(reader.next(record));
      CHECK(offsets == std::vector<uint64_t>{0, 16, 33, 33 + 16 + 300000});
      for (const size_t k : {2u, 0u, 3u, 1u}) {
        reader.seek(offsets[k]);
        REQUIRE(reader.next(record));
        CHECK(record == records[k]);
      }
    }
  }
  CHECK(io::compression_from_name("GZIP") == io::Compression::kGzip);
  CHECK(io::compression_from_name("") == io::Compression::kNone);
  CHECK_THROWS_WITH(io::compression_from_name("gzip"), Catch::Contains("\"gzip\""));
}

TEST_CASE(
    "damaged TFRecord files name the file and the record's offset, or are skipped and counted",
    "[cpu][data][tfrecord]") {
  const TempDir dir;
  const std::string good = dir.file("good.tfrecord");
  {
    io::TFRecordWriter w(good);
    for (int i = 0; i < 5; ++i) w.write(std::string(100, static_cast<char>('a' + i)));
  }
  const std::string bytes = read_bytes(good);  // records of 116 bytes: offsets 0, 116, ...
  auto damaged = [&](const std::string& name, const std::string& content) {
    const std::string path = dir.file(name);
    write_bytes(path, content);
    return path;
  };
  std::string flipped_data = bytes;
  flipped_data[116 + 12 + 50] ^= 0x10;  // record 1's data
  std::string flipped_length = bytes;
  flipped_length[232 + 3] ^= 0x01;                              // record 2's length
  const std::string truncated = bytes.substr(0, 116 * 3 + 60);  // inside record 3

  struct Case {
    std::string file;
    std::string message;
    int64_t read_when_skipping;
  };
  const std::vector<Case> cases = {
      {damaged("data.tfrecord", flipped_data), "data CRC mismatch in '", 4},
      {damaged("length.tfrecord", flipped_length), "length CRC mismatch in '", 2},
      {damaged("truncated.tfrecord", truncated), "truncated record", 3}};
  const std::vector<uint64_t> offsets = {116, 232, 348};
  for (size_t k = 0; k < cases.size(); ++k) {
    const Case& c = cases[k];
    DYNAMIC_SECTION(std::filesystem::path(c.file).filename().string()) {
      io::TFRecordReader strict(c.file);
      std::string record;
      int64_t read = 0;
      try {
        while (strict.next(record)) ++read;
        FAIL("no error");
      } catch (const td::Error& e) {
        const std::string what = e.what();
        CHECK_THAT(what, Catch::Contains(c.message) && Catch::Contains(c.file) &&
                             Catch::Contains("record at offset " + std::to_string(offsets[k])));
      }
      io::TFRecordReader lenient(c.file, {.skip_damaged = true});
      read = 0;
      while (lenient.next(record)) {
        CHECK(record.size() == 100);
        ++read;
      }
      CHECK(read == c.read_when_skipping);
      CHECK(lenient.damaged_records() == 1);
      // The dataset indexes the good records only, and says how many it left out.
      const data::Dataset ds = data::tfrecord({c.file}, {.skip_damaged = true});
      CHECK(ds.cardinality() == c.read_when_skipping);
      CHECK_THAT(ds.describe(), Catch::Contains("1 damaged skipped"));
    }
  }
  // A length near 2^64 with a correct CRC: refused as running past the end, not wrapped
  // around to a small one (reading and skipping alike).
  std::string huge(8, '\xff');
  huge[0] = '\xfe';
  const uint32_t crc = io::masked_crc32c(huge);
  for (int i = 0; i < 4; ++i) huge.push_back(static_cast<char>(crc >> (8 * i)));
  const std::string huge_path = damaged("huge.tfrecord", huge + std::string(40, 'x'));
  std::string record;
  CHECK_THROWS_WITH(io::TFRecordReader(huge_path).next(record),
                    Catch::Contains("truncated record") && Catch::Contains("offset 0"));
  CHECK_THROWS_WITH(io::TFRecordReader(huge_path).skip_next(), Catch::Contains("truncated record"));
  // Compressed: damaged and truncated streams.
  const std::string gz = dir.file("g.tfrecord.gz");
  {
    io::TFRecordWriter w(gz, io::Compression::kGzip);
    for (int i = 0; i < 50; ++i) w.write(std::string(1000, static_cast<char>(i)));
  }
  const std::string packed = read_bytes(gz);
  std::string corrupt = packed;
  corrupt[corrupt.size() / 2] ^= 0x55;
  const std::string corrupt_path = damaged("corrupt.gz", corrupt);
  const std::string cut_path = damaged("cut.gz", packed.substr(0, packed.size() - 10));
  for (const std::string& path : {corrupt_path, cut_path}) {
    io::TFRecordReader reader(path, {.compression = io::Compression::kGzip});
    try {
      while (reader.next(record)) {
      }
      FAIL("no error in " << path);
    } catch (const td::Error& e) {
      CHECK_THAT(std::string(e.what()), Catch::Contains(path) && Catch::Contains("offset"));
    }
  }
  CHECK_THROWS_WITH(io::TFRecordReader(dir.file("missing.tfrecord")),
                    Catch::Contains("missing.tfrecord"));
}

TEST_CASE("parse_example refuses malformed records and mismatched specs, naming the feature",
          "[cpu][data][tfrecord]") {
  const std::string good = fixture_example(2).serialize();
  const data::FeatureSpec spec = fixture_spec();
  // Every truncation is either an error that names an offset or a parse that misses features.
  for (size_t n = 0; n < good.size(); ++n) {
    try {
      (void)data::parse_example(std::string_view(good).substr(0, n), spec);
      FAIL("a record cut to " << n << " bytes parsed");
    } catch (const td::Error& e) {
      const std::string what = e.what();
      CHECK((what.find("at byte") != std::string::npos ||
             what.find("is missing from the example") != std::string::npos));
    }
  }
  CHECK_THROWS_WITH(
      data::parse_example(good, {{"label", data::FixedLenFeature{{}, td::DType::kFloat32}}}),
      Catch::Contains("'label'") && Catch::Contains("int64_list"));
  CHECK_THROWS_WITH(
      data::parse_example(good, {{"values", data::FixedLenFeature{{4}, td::DType::kFloat32}}}),
      Catch::Contains("'values'") && Catch::Contains("holds 3 values"));
  CHECK_THROWS_WITH(
      data::parse_example(good, {{"absent", data::FixedLenFeature{{}, td::DType::kInt64}}}),
      Catch::Contains("'absent' is missing"));
  const data::Element padded =
      data::parse_example(good, {{"tokens", data::VarLenFeature{td::DType::kInt64, 5, -1.0}},
                                 {"weights", data::VarLenFeature{td::DType::kFloat32, 1}}});
  CHECK(padded[0].to_vector<int64_t>() == std::vector<int64_t>{20, -21, 22, -1, -1});
  CHECK(padded[1].to_vector<float>() == std::vector<float>{0.0f});
  const td::Tensor as_tensor =
      td::Tensor::from_vector(std::vector<uint8_t>(good.begin(), good.end()));
  CHECK(data::parse_example(as_tensor, spec)[1].to_vector<int64_t>() == std::vector<int64_t>{2});
}

TEST_CASE("data::tfrecord: files indexed, parsed in a pipeline, resumed exactly, dealt to workers",
          "[cpu][data][tfrecord]") {
  const TempDir dir;
  // 4 files of 5, 0, 7 and 3 Examples {x: float [2], y: int64}, example n has y = n.
  const std::vector<int> counts = {5, 0, 7, 3};
  std::vector<std::string> files;
  int64_t n = 0;
  for (size_t f = 0; f < counts.size(); ++f) {
    files.push_back(dir.file("part-" + std::to_string(f) + ".tfrecord.gz"));
    io::TFRecordWriter w(files.back(), io::Compression::kGzip);
    for (int i = 0; i < counts[f]; ++i, ++n) {
      data::Example e;
      e.set_floats("x", {static_cast<float>(n), 0.5f}).set_int64s("y", {n});
      w.write(e.serialize());
    }
  }
  CHECK(data::list_files(dir.file("part-*.tfrecord.gz")) == files);
  CHECK(data::list_files(dir.file("part-*.tfrecord.gz"), true, 3) ==
        data::list_files(dir.file("part-*.tfrecord.gz"), true, 3));
  CHECK_THROWS_WITH(data::list_files(dir.file("nothing-*")), Catch::Contains("nothing-*"));

  const data::FeatureSpec spec = {{"y", data::FixedLenFeature{{}, td::DType::kInt64}},
                                  {"x", data::FixedLenFeature{{2}, td::DType::kFloat32}}};
  auto pipeline = [&](const std::vector<std::string>& f) {
    return data::tfrecord(f, {.compression = io::Compression::kGzip})
        .map([spec](data::Element e) { return data::parse_example(e[0], spec); })
        .shuffle(6, 11)
        .batch(2);
  };
  const data::Dataset ds = pipeline(files);
  CHECK(ds.cardinality() == 8);
  std::vector<std::vector<int64_t>> all = data::testing::batches_of(ds);
  std::multiset<int64_t> seen;
  for (const auto& b : all) seen.insert(b.begin(), b.end());
  CHECK(seen == std::multiset<int64_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14});

  // Stopped after 3 batches and restored into a new iterator: the rest is the same.
  data::Iterator first = ds.iterator(4);
  const auto head = data::testing::batches_of(first, 3);
  const data::IteratorState state = first.save();
  const auto rest = data::testing::batches_of(first);
  data::Iterator resumed = pipeline(files).iterator(4);
  resumed.restore(state);
  CHECK(data::testing::batches_of(resumed) == rest);
  CHECK(head.size() == 3);

  // Dealt to 2 workers by file: worker 0 reads files 0 and 2, worker 1 files 1 and 3.
  std::multiset<int64_t> both;
  for (int w = 0; w < 2; ++w) {
    const data::Dataset mine = data::auto_shard(
        data::tfrecord(files, {.compression = io::Compression::kGzip}).map([spec](data::Element e) {
          return data::parse_example(e[0], spec);
        }),
        data::AutoShardPolicy::kFile, 2, w);
    CHECK(mine.cardinality() == (w == 0 ? 12 : 3));
    for (const int64_t y : data::testing::flat_values(mine)) both.insert(y);
  }
  CHECK(both == seen);
}
