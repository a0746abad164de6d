// Images: JPEG and PNG decode to TensorFlow 2.21's pixels, resize_bilinear to tf.image.resize's
// values, image_dataset_from_directory lists and splits files as Keras does (fixtures made by
// tests/fixtures/images/make_fixtures.py); damaged images raise, naming the file.
#include <catch2/catch.hpp>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include "data/data_test_util.h"
#include "tandem/tandem.h"

namespace td = tandem;
namespace data = tandem::data;
using data::testing::TempDir;

namespace {

const std::string kFixtures = std::string(TANDEM_SOURCE_DIR) + "/tests/fixtures/images/";

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  REQUIRE(in.good());
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

std::vector<std::vector<std::string>> rows(const std::string& file) {
  std::istringstream in(read_bytes(kFixtures + file));
  std::vector<std::vector<std::string>> out;
  for (std::string line; std::getline(in, line);) {
    std::istringstream words(line);
    std::vector<std::string> row;
    for (std::string w; words >> w;) row.push_back(w);
    if (!row.empty()) out.push_back(row);
  }
  return out;
}

std::string hex_bytes(const td::Tensor& t) {
  std::string out;
  char buf[4];
  const auto* p = static_cast<const unsigned char*>(t.raw_data());
  for (size_t i = 0; i < t.nbytes(); ++i) {
    std::snprintf(buf, sizeof buf, "%02x", p[i]);
    out += buf;
  }
  return out;
}

std::vector<std::string> float_bits(const td::Tensor& t) {
  std::vector<std::string> out;
  char buf[12];
  for (const float f : t.to_vector<float>()) {
    uint32_t bits;
    std::memcpy(&bits, &f, 4);
    std::snprintf(buf, sizeof buf, "%08x", bits);
    out.emplace_back(buf);
  }
  return out;
}

}  // namespace

TEST_CASE(
    "JPEG and PNG decode to TensorFlow's pixels, resize_bilinear gives tf.image.resize's values",
    "[cpu][data][image]") {
  int checked = 0;
  for (const auto& row : rows("decoded.txt")) {
    const std::string& path = row[0];
    const int channels = std::stoi(row[1]);
    DYNAMIC_SECTION(path << ", channels " << channels) {
      const td::Tensor image = data::decode_image(read_bytes(kFixtures + path), channels);
      CHECK(image.shape() == td::Shape{std::stoll(row[2]), std::stoll(row[3]), std::stoll(row[4])});
      CHECK(hex_bytes(image) == row[5]);
    }
    ++checked;
  }
  CHECK(checked == 24);
  for (const auto& row : rows("resized.txt")) {
    const std::string& path = row[0];
    DYNAMIC_SECTION("resize " << path) {
      const td::Tensor image = data::decode_image(read_bytes(kFixtures + path), 3);
      const td::Tensor resized = data::resize_bilinear(image, 5, 7);
      REQUIRE(resized.shape() == td::Shape{5, 7, 3});
      CHECK(float_bits(resized) == std::vector<std::string>(row.begin() + 4, row.end()));
      // From float32 pixels too.
      CHECK(float_bits(data::resize_bilinear(td::ops::cast(image, td::DType::kFloat32), 5, 7)) ==
            float_bits(resized));
    }
  }
}

TEST_CASE("image_dataset_from_directory lists, labels and splits the files as Keras does",
          "[cpu][data][image]") {
  const std::string tree = kFixtures + "tree";
  CHECK(data::image_directory_classes(tree) == std::vector<std::string>{"cat", "dog", "emu"});
  std::vector<std::vector<std::string>> split = rows("keras_split.txt");
  std::map<std::string, std::string> resized;
  for (const auto& row : rows("resized.txt")) {
    std::string joined;
    for (size_t k = 4; k < row.size(); ++k) joined += row[k] + " ";
    resized[row[0]] = joined;
  }
  for (const std::string subset : {"training", "validation"}) {
    DYNAMIC_SECTION(subset) {
      const data::Dataset ds = data::image_dataset_from_directory(tree, {.height = 5,
                                                                         .width = 7,
                                                                         .channels = 3,
                                                                         .shuffle = true,
                                                                         .seed = 7,
                                                                         .validation_split = 0.4,
                                                                         .subset = subset});
      std::vector<std::string> want_files;
      std::vector<int64_t> want_labels;
      for (const auto& row : split)
        if (row[0] == subset) {
          want_files.push_back(kFixtures + row[2]);
          want_labels.push_back(std::stoll(row[3]));
        }
      REQUIRE(ds.cardinality() == static_cast<int64_t>(want_files.size()));
      data::Iterator it = ds.iterator();
      data::Element e;
      for (size_t i = 0; i < want_files.size(); ++i) {
        REQUIRE(it.next(e));
        CHECK(e[1].item<int64_t>() == want_labels[i]);
        std::string joined;
        for (const std::string& w : float_bits(e[0])) joined += w + " ";
        CHECK(joined == resized[want_files[i].substr(kFixtures.size())]);
      }
      // Batched, the elements stack (and map with threads reads them alike).
      const auto batch = ds.map([](data::Element x) { return x; }, 2).batch(2).iterator().save();
      CHECK_FALSE(batch.empty());
    }
  }
}

TEST_CASE("damaged images raise naming the problem and the file, crops, flips and normalization",
          "[cpu][data][image]") {
  const std::string jpeg = read_bytes(kFixtures + "tree/cat/c0.jpg");
  const std::string png = read_bytes(kFixtures + "tree/cat/c1.png");
  CHECK_THROWS_WITH(data::decode_image(jpeg.substr(0, jpeg.size() / 2)),
                    Catch::Contains("decode_jpeg: invalid JPEG data"));
  CHECK_THROWS_WITH(data::decode_image(png.substr(0, png.size() - 20)),
                    Catch::Contains("decode_png: invalid PNG data"));
  std::string flipped = png;
  flipped[40] ^= 0x5a;  // inside IDAT: a CRC error
  CHECK_THROWS_WITH(data::decode_png(flipped), Catch::Contains("decode_png"));
  CHECK_THROWS_WITH(data::decode_image(std::string("GIF89a......")),
                    Catch::Contains("GIF: not supported"));
  CHECK_THROWS_WITH(data::decode_image(std::string("hello")),
                    Catch::Contains("neither JPEG nor PNG"));

  // A damaged file in a class folder: the error names it.
  const TempDir dir;
  std::filesystem::create_directories(dir.file("a"));
  std::ofstream(dir.file("a/bad.png"), std::ios::binary) << png.substr(0, 30);
  std::ofstream(dir.file("a/good.png"), std::ios::binary) << png;
  const data::Dataset ds = data::image_dataset_from_directory(
      dir.str(), {.height = 4, .width = 4, .channels = 3, .shuffle = false});
  data::Iterator it = ds.iterator();
  data::Element e;
  CHECK_THROWS_WITH(it.next(e), Catch::Contains("bad.png"));
  REQUIRE(it.next(e));
  CHECK(e[0].shape() == td::Shape{4, 4, 3});

  // Crops, flips and their seeded random forms.
  const td::Tensor image = data::decode_png(png);  // 9 x 11 x 3
  const td::Tensor c = data::crop(image, 2, 3, 4, 5);
  CHECK(c.shape() == td::Shape{4, 5, 3});
  CHECK(c.data<uint8_t>()[0] == image.data<uint8_t>()[(2 * 11 + 3) * 3]);
  const td::Tensor f = data::flip_left_right(image);
  CHECK(f.data<uint8_t>()[0] == image.data<uint8_t>()[10 * 3]);
  CHECK(hex_bytes(data::flip_left_right(f)) == hex_bytes(image));
  CHECK(hex_bytes(data::random_crop(image, 4, 5, 17)) ==
        hex_bytes(data::random_crop(image, 4, 5, 17)));
  bool flips_differ = false;
  for (uint64_t seed = 0; seed < 16; ++seed)
    flips_differ = flips_differ || hex_bytes(data::random_flip_left_right(image, seed)) !=
                                       hex_bytes(data::random_flip_left_right(image, 0));
  CHECK(flips_differ);
  CHECK_THROWS_WITH(data::crop(image, 6, 0, 4, 4), Catch::Contains("is not inside"));
  const td::Tensor n = data::normalize(image, {0.5f, 0.5f, 0.5f}, {0.25f}, td::DType::kFloat32);
  CHECK(n.data<float>()[4] == Approx((image.data<uint8_t>()[4] / 255.0f - 0.5f) / 0.25f));
  CHECK(data::normalize(image, {0.0f}, {1.0f}, td::DType::kBFloat16).dtype() ==
        td::DType::kBFloat16);
}

TEST_CASE("encode_png: decode_png gives the pixels back, for 1 to 4 channels", "[cpu][data]") {
  td::Generator generator(/*seed=*/3, /*stream=*/0);
  for (int64_t channels = 1; channels <= 4; ++channels) {
    INFO(channels << " channel(s)");
    std::vector<uint8_t> pixels(static_cast<size_t>(5 * 7 * channels));
    for (uint8_t& p : pixels) p = static_cast<uint8_t>(generator.uniform_int(256));
    const td::Tensor image = td::Tensor::from_vector(pixels, td::Shape{5, 7, channels});
    const std::string png = data::encode_png(image);
    CHECK(png.substr(1, 3) == "PNG");
    const td::Tensor back = data::decode_png(png);
    CHECK(back.shape() == image.shape());
    CHECK(back.to_vector<uint8_t>() == pixels);
  }
  CHECK_THROWS_WITH(data::encode_png(td::Tensor::zeros({4, 4, 1}, td::DType::kFloat32)),
                    Catch::Contains("expected a uint8 [height, width, 1 to 4 channels]"));
  CHECK_THROWS_WITH(data::encode_png(td::Tensor::zeros({4, 4, 5}, td::DType::kUInt8)),
                    Catch::Contains("encode_png"));
}
