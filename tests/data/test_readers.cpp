// Tests of the file readers: IDX (plain and .gz) on files written here byte by byte, each
// IDX error, the real Fashion-MNIST files, and HDF5 (files written with h5py) with its errors.
#include <sys/wait.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>

#include "data_test_util.h"
#include "tandem/tandem.h"

using namespace tandem;
using namespace tandem::data;
using data::testing::TempDir;

namespace {

/// An IDX file of unsigned bytes: magic 0x0000 08 <rank>, big-endian dims, then the data.
std::vector<uint8_t> idx_bytes(const std::vector<uint32_t>& dims, uint8_t type = 0x08) {
  std::vector<uint8_t> out = {0, 0, type, static_cast<uint8_t>(dims.size())};
  size_t numel = 1;
  for (uint32_t d : dims) {
    for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<uint8_t>(d >> shift));
    numel *= d;
  }
  for (size_t i = 0; i < numel; ++i) out.push_back(static_cast<uint8_t>((i * 7) % 256));
  return out;
}

void write_bytes(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
}

void gzip(const std::string& path) {
  REQUIRE(std::system(("gzip -f -k '" + path + "'").c_str()) == 0);
}

/// Writes images [n, rows, cols] with pixel (i*7) % 256 and labels (i % 10).
void write_idx_pair(const std::string& images, const std::string& labels, uint32_t n,
                    uint32_t rows = 4, uint32_t cols = 3) {
  write_bytes(images, idx_bytes({n, rows, cols}));
  std::vector<uint8_t> label_bytes = idx_bytes({n});
  for (uint32_t i = 0; i < n; ++i) label_bytes[8 + i] = static_cast<uint8_t>(i % 10);
  write_bytes(labels, label_bytes);
}

/// Runs a Python snippet with h5py and numpy imported (as h5py and np) by the system
/// Python; false when that Python has no h5py (exit status 77).
bool python_h5py(const std::string& code) {
  const std::string command =
      "/usr/bin/python3 -c 'import sys\ntry:\n  import h5py, numpy as np\nexcept ImportError:\n"
      "  sys.exit(77)\n" +
      code + "' 2>&1";
  const int status = std::system(command.c_str());
  REQUIRE(WIFEXITED(status));
  if (WEXITSTATUS(status) == 77) return false;
  REQUIRE(WEXITSTATUS(status) == 0);
  return true;
}

}  // namespace

TEST_CASE("idx reads plain and gzip files as float32 [0,1] images and int64 labels",
          "[cpu][data]") {
  TempDir dir;
  write_idx_pair(dir.file("img"), dir.file("lbl"), 13);
  gzip(dir.file("img"));
  gzip(dir.file("lbl"));
  for (const auto& [images, labels] : {std::pair{dir.file("img"), dir.file("lbl")},
                                       std::pair{dir.file("img.gz"), dir.file("lbl.gz")}}) {
    INFO(images);
    Dataset ds = idx(images, labels);
    CHECK(ds.cardinality() == 13);
    REQUIRE(ds.element_spec().size() == 2);
    CHECK(ds.element_spec()[0] == TensorSpec{Shape{4, 3}, DType::kFloat32});
    CHECK(ds.element_spec()[1] == TensorSpec{Shape{}, DType::kInt64});
    Iterator it = ds.iterator();
    Element e;
    REQUIRE(it.next(e));
    REQUIRE(it.next(e));  // element 1: pixels 12..23 of the file
    CHECK(e[0].shape() == Shape{4, 3});
    CHECK(e[0].to_vector<float>()[0] == Approx(((12 * 7) % 256) / 255.0f));
    CHECK(e[1].item<int64_t>() == 1);
    // The batched path gives the same values as the element path.
    Iterator batched = ds.batch(5).iterator();
    Element b;
    REQUIRE(batched.next(b));
    CHECK(b[0].shape() == Shape{5, 4, 3});
    CHECK(b[1].to_vector<int64_t>() == std::vector<int64_t>{0, 1, 2, 3, 4});
    CHECK(b[0].to_vector<float>()[12] == e[0].to_vector<float>()[0]);
    const std::vector<float> pixels = b[0].to_vector<float>();
    CHECK(*std::max_element(pixels.begin(), pixels.end()) <= 1.0f);
    CHECK(*std::min_element(pixels.begin(), pixels.end()) >= 0.0f);
  }
}

TEST_CASE("idx reports each kind of bad file, naming the file", "[cpu][data]") {
  TempDir dir;
  const std::string labels = dir.file("labels");
  write_idx_pair(dir.file("good_images"), labels, 6);

  SECTION("missing file") {
    CHECK_THROWS_WITH(idx(dir.file("nope"), labels),
                      Catch::Contains(dir.file("nope")) && Catch::Contains("no such file"));
  }
  SECTION("bad magic number") {
    std::vector<uint8_t> bytes = idx_bytes({6, 4, 3});
    bytes[0] = 0x1F;
    write_bytes(dir.file("bad_magic"), bytes);
    CHECK_THROWS_WITH(
        idx(dir.file("bad_magic"), labels),
        Catch::Contains(dir.file("bad_magic")) && Catch::Contains("bad magic number 0x1F000803"));
  }
  SECTION("unsupported element type") {
    write_bytes(dir.file("floats"), idx_bytes({6, 4, 3}, 0x0D));
    CHECK_THROWS_WITH(idx(dir.file("floats"), labels),
                      Catch::Contains("IDX type float32") && Catch::Contains("0x08"));
  }
  SECTION("truncated data") {
    std::vector<uint8_t> bytes = idx_bytes({6, 4, 3});
    REQUIRE(bytes.size() == 88);  // a 16-byte header and 6 x 4 x 3 bytes
    bytes.erase(bytes.end() - 5, bytes.end());
    write_bytes(dir.file("short"), bytes);
    CHECK_THROWS_WITH(idx(dir.file("short"), labels),
                      Catch::Contains(dir.file("short")) && Catch::Contains("is truncated") &&
                          Catch::Contains("[6, 4, 3]") && Catch::Contains("88 bytes"));
  }
  SECTION("truncated header") {
    write_bytes(dir.file("header"), {0, 0, 8, 3, 0, 0});
    CHECK_THROWS_WITH(idx(dir.file("header"), labels),
                      Catch::Contains("truncated inside its header"));
  }
  SECTION("truncated gzip stream") {
    write_idx_pair(dir.file("big"), dir.file("big_labels"), 500, 28, 28);
    gzip(dir.file("big"));
    std::filesystem::resize_file(dir.file("big.gz"),
                                 std::filesystem::file_size(dir.file("big.gz")) / 2);
    CHECK_THROWS_WITH(idx(dir.file("big.gz"), dir.file("big_labels")),
                      Catch::Contains(dir.file("big.gz")) &&
                          (Catch::Contains("truncated") || Catch::Contains("corrupt")));
  }
  SECTION("trailing bytes") {
    std::vector<uint8_t> bytes = idx_bytes({6, 4, 3});
    bytes.push_back(1);
    write_bytes(dir.file("long"), bytes);
    CHECK_THROWS_WITH(idx(dir.file("long"), labels), Catch::Contains("1 bytes after"));
  }
  SECTION("wrong ranks") {
    CHECK_THROWS_WITH(idx(labels, labels),
                      Catch::Contains("should hold images") && Catch::Contains("rank 1"));
    CHECK_THROWS_WITH(idx(dir.file("good_images"), dir.file("good_images")),
                      Catch::Contains("should hold labels") && Catch::Contains("rank 3"));
  }
  SECTION("image and label counts differ") {
    write_idx_pair(dir.file("seven"), dir.file("seven_labels"), 7);
    CHECK_THROWS_WITH(idx(dir.file("seven"), labels), Catch::Contains("holds 7 images") &&
                                                          Catch::Contains("holds 6 labels") &&
                                                          Catch::Contains(labels));
  }
  SECTION("fashion_mnist checks the image size and names the package") {
    write_idx_pair(dir.file("train-images-idx3-ubyte"), dir.file("train-labels-idx1-ubyte"), 3);
    TempDir empty;
    CHECK_THROWS_WITH(fashion_mnist(Split::kTrain, dir.file("")),
                      Catch::Contains("[4, 3], Fashion-MNIST's are [28, 28]"));
    CHECK_THROWS_WITH(fashion_mnist(Split::kTest, dir.file("")),
                      Catch::Contains("dataset-fashion-mnist"));
  }
}

TEST_CASE("the real Fashion-MNIST files load with the right counts and ranges", "[cpu][data]") {
  if (!std::filesystem::exists(std::string(kFashionMnistDirectory) +
                               "/train-images-idx3-ubyte.gz")) {
    WARN("skipped: Fashion-MNIST is not installed (apt install dataset-fashion-mnist)");
    return;
  }
  for (const auto& [split, count] : {std::pair{Split::kTrain, 60000}, {Split::kTest, 10000}}) {
    Dataset ds = fashion_mnist(split);
    CHECK(ds.cardinality() == count);
    CHECK(ds.element_spec()[0] == TensorSpec{Shape{28, 28}, DType::kFloat32});
    int64_t seen = 0;
    float low = 1.0f, high = 0.0f;
    std::set<int64_t> labels;
    for (const Element& b : ds.batch(10000)) {
      seen += b[0].dim(0);
      const float* pixels = b[0].data<float>();
      const auto [lo, hi] = std::minmax_element(pixels, pixels + b[0].numel());
      low = std::min(low, *lo);
      high = std::max(high, *hi);
      for (int64_t label : b[1].to_vector<int64_t>()) labels.insert(label);
    }
    CHECK(seen == count);
    CHECK(low == 0.0f);
    CHECK(high == 1.0f);
    CHECK(labels == std::set<int64_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9});
  }
  CHECK(fashion_mnist(Split::kTest).describe() == "fashion_mnist_test(10000 examples of [28, 28])");
}

TEST_CASE("hdf5 reads examples across files in chunks, and validates", "[cpu][data]") {
  TempDir dir;
  try {
    hdf5({dir.file("none.h5")}, {"x"});
  } catch (const NotBuiltError& e) {
    CHECK_THAT(e.what(), Catch::Contains("TANDEM_WITH_HDF5"));
    WARN("skipped: built without HDF5");
    return;
  } catch (const Error& e) {
    CHECK_THAT(e.what(), Catch::Contains("no such file") && Catch::Contains("none.h5"));
  }
  // One Python run writes every file: three parts of 5, 7 and 4 examples with
  // x[i] = [i, i + 0.5] (float32), y[i] = 10 i (int16) and grp/z[i] = i (uint8), plus
  // datasets that must be refused, and a file whose x has another row shape.
  std::vector<std::string> files;
  std::string script = "first = 0\n";
  for (int rows : {5, 7, 4}) {
    files.push_back(dir.file("part" + std::to_string(files.size()) + ".h5"));
    script += "i = np.arange(first, first + " + std::to_string(rows) +
              ")\nfirst += " + std::to_string(rows) + "\nwith h5py.File(\"" + files.back() +
              "\", \"w\") as f:\n"
              "  f[\"x\"] = np.stack([i, i + 0.5], axis=1).astype(np.float32)\n"
              "  f[\"y\"] = (10 * i).astype(np.int16)\n"
              "  f[\"grp/z\"] = i.astype(np.uint8)\n"
              "  f[\"short\"] = np.zeros(2)\n"
              "  f[\"text\"] = np.array([b\"a\"] * len(i))\n";
  }
  script += "with h5py.File(\"" + dir.file("wide.h5") +
            "\", \"w\") as f:\n  f[\"x\"] = np.zeros((3, 5), np.float32)\n";
  if (!python_h5py(script)) {
    WARN("skipped: /usr/bin/python3 has no h5py (apt install python3-h5py)");
    return;
  }
  Dataset ds = hdf5(files, {"x", "y", "grp/z"}, /*chunk_rows=*/3);
  CHECK(ds.cardinality() == 16);
  REQUIRE(ds.element_spec().size() == 3);
  CHECK(ds.element_spec()[0] == TensorSpec{Shape{2}, DType::kFloat32});
  CHECK(ds.element_spec()[1] == TensorSpec{Shape{}, DType::kInt32});
  CHECK(ds.element_spec()[2] == TensorSpec{Shape{}, DType::kUInt8});
  int64_t i = 0;
  for (const Element& e : ds) {
    CHECK(e[0].to_vector<float>() == std::vector<float>{float(i), float(i) + 0.5f});
    CHECK(e[1].item<int64_t>() == 10 * i);
    CHECK(e[2].item<int64_t>() == i);
    ++i;
  }
  CHECK(i == 16);
  // Batches cross file boundaries; a shuffle keeps elements (files are not random access)
  // and still restores exactly.
  CHECK(data::testing::batches_of(hdf5(files, {"y"}, 3).batch(6))[1] ==
        std::vector<int64_t>{60, 70, 80, 90, 100, 110});
  auto build = [&] { return hdf5(files, {"y"}, 4).shuffle(6, 3).batch(3).prefetch(2); };
  Iterator it = build().iterator(0);
  data::testing::batches_of(it, 2);
  const IteratorState state = it.save();
  const auto rest = data::testing::batches_of(it);
  Iterator resumed = build().iterator();
  resumed.restore(state);
  CHECK(data::testing::batches_of(resumed) == rest);
  std::vector<int64_t> all = data::testing::flat_values(hdf5(files, {"y"}).shuffle(16, 1));
  std::sort(all.begin(), all.end());
  CHECK(all.front() == 0);
  CHECK(all.back() == 150);

  // Auto-sharding by file: 3 files on 2 workers -> files 0 and 2 for worker 0, file 1 for 1.
  Dataset global = hdf5(files, {"y"}).batch(4);
  CHECK(data::testing::flat_values(auto_shard(global, AutoShardPolicy::kFile, 2, 1)) ==
        std::vector<int64_t>{50, 60, 70, 80, 90, 100, 110});
  CHECK(auto_shard(global, AutoShardPolicy::kAuto, 2, 0).cardinality() == 5);  // 9 rows, batch 2
  CHECK_THROWS_WITH(auto_shard(global, AutoShardPolicy::kFile, 4, 0),
                    Catch::Contains("3 file(s) cannot be dealt to 4 workers"));
  CHECK(auto_shard(global, AutoShardPolicy::kAuto, 4, 3).describe().find("shard(4, 3)") !=
        std::string::npos);

  // Errors name the file and the problem.
  CHECK_THROWS_WITH(hdf5({files[0], dir.file("missing.h5")}, {"x"}),
                    Catch::Contains("missing.h5") && Catch::Contains("no such file"));
  write_bytes(dir.file("not_hdf5.h5"), {1, 2, 3, 4});
  CHECK_THROWS_WITH(hdf5({dir.file("not_hdf5.h5")}, {"x"}),
                    Catch::Contains("not_hdf5.h5") && Catch::Contains("cannot open"));
  CHECK_THROWS_WITH(hdf5({files[0]}, {"nope"}),
                    Catch::Contains("has no dataset 'nope'") && Catch::Contains("part0.h5"));
  CHECK_THROWS_WITH(hdf5({files[0]}, {"grp/nope/deeper"}), Catch::Contains("has no dataset"));
  CHECK_THROWS_WITH(hdf5({files[0]}, {"x", "short"}),
                    Catch::Contains("'short' has 2 rows but 'x' has 5"));
  CHECK_THROWS_WITH(hdf5({files[0]}, {"text"}), Catch::Contains("neither integers nor"));
  CHECK_THROWS_WITH(hdf5({files[0], dir.file("wide.h5")}, {"x"}),
                    Catch::Contains("wide.h5") && Catch::Contains("[5] float32") &&
                        Catch::Contains("[2] float32"));
}

// ---- damaged IDX files ---------------------------------------------------------------------

namespace {

/// An IDX header of unsigned bytes declaring `dims`, with `data_bytes` bytes of data after it.
std::vector<uint8_t> idx_header(const std::vector<uint32_t>& dims, size_t data_bytes) {
  std::vector<uint8_t> out = {0, 0, 0x08, static_cast<uint8_t>(dims.size())};
  for (uint32_t d : dims)
    for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<uint8_t>(d >> shift));
  out.resize(out.size() + data_bytes, 7);
  return out;
}

}  // namespace

TEST_CASE("idx: dimensions whose product overflows are refused, never read past the data",
          "[cpu][data]") {
  TempDir dir;
  const std::string labels = dir.file("labels");
  write_idx_pair(dir.file("unused"), labels, 4);
  // [4, 2^31, 2^31] wraps to 0 in int64: the size check passed and the reader wrote past its
  // buffer (AddressSanitizer: heap-buffer-overflow WRITE).
  const std::string wrapped = dir.file("wrapped");
  write_bytes(wrapped, idx_header({4, 0x80000000u, 0x80000000u}, 0));
  CHECK_THROWS_WITH(idx(wrapped, labels), Catch::Contains(wrapped) &&
                                              Catch::Contains("[4, 2147483648, 2147483648]") &&
                                              Catch::Contains("more than any file can hold"));
  // Gzip-compressed, the same.
  gzip(wrapped);
  CHECK_THROWS_WITH(idx(wrapped + ".gz", labels),
                    Catch::Contains("[4, 2147483648, 2147483648]") &&
                        Catch::Contains("more than any file can hold"));
  // A product that fits but exceeds the file: the truncation error with the true sizes.
  const std::string big = dir.file("big");
  write_bytes(big, idx_header({4, 65536, 65536}, 16));
  CHECK_THROWS_WITH(idx(big, labels), Catch::Contains("is truncated") &&
                                          Catch::Contains("[4, 65536, 65536]") &&
                                          Catch::Contains("17179869200 bytes with the header") &&
                                          Catch::Contains("holds 32 bytes"));
  // Many dimensions whose product wraps through int64 in several steps.
  const std::string many = dir.file("many");
  write_bytes(many, idx_header({4, 0xFFFFFFFFu, 0xFFFFFFFFu, 0xFFFFFFFFu}, 0));
  CHECK_THROWS_WITH(idx(many, labels), Catch::Contains("more than any file can hold"));
}

TEST_CASE("idx: a small .gz that inflates far past its header's size stops early", "[cpu][data]") {
  TempDir dir;
  const std::string labels = dir.file("labels");
  write_idx_pair(dir.file("unused"), labels, 4);
  // 4 images of 4 x 3 declared, then 64 MiB of zeros (a few dozen KiB compressed).
  const std::string bomb = dir.file("bomb");
  write_bytes(bomb, idx_header({4, 4, 3}, size_t{64} << 20));
  gzip(bomb);
  CHECK(std::filesystem::file_size(bomb + ".gz") < (size_t{1} << 20));
  CHECK_THROWS_WITH(idx(bomb + ".gz", labels),
                    Catch::Contains("bytes after the array its header") &&
                        Catch::Contains("64 bytes with the header"));
}

TEST_CASE("idx and fashion_mnist: labels outside the classes are refused when the files open",
          "[cpu][data]") {
  TempDir dir;
  const std::string images = dir.file("images"), labels = dir.file("labels");
  write_idx_pair(images, labels, 30);
  CHECK(idx(images, labels, /*num_classes=*/10).cardinality() == 30);
  // Flip label 17 to 67, 109 and 255 in turn: each names the file, the index and the value.
  std::ifstream in(labels, std::ios::binary);
  std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)),
                             std::istreambuf_iterator<char>());
  in.close();
  for (int bad : {67, 109, 255}) {
    INFO("label value " << bad);
    bytes[8 + 17] = static_cast<uint8_t>(bad);
    const std::string damaged = dir.file("labels_" + std::to_string(bad));
    write_bytes(damaged, bytes);
    CHECK_THROWS_WITH(idx(images, damaged, /*num_classes=*/10),
                      Catch::Contains(damaged) &&
                          Catch::Contains("label 17 is " + std::to_string(bad)) &&
                          Catch::Contains("outside the 10 classes [0, 10)"));
    // Without a class count the file is read as it is.
    CHECK(idx(images, damaged).cardinality() == 30);
  }
  // fashion_mnist knows its 10 classes: a copy of the real test split with one label flipped.
  const std::string real = std::string(kFashionMnistDirectory);
  if (!std::filesystem::exists(real + "/t10k-labels-idx1-ubyte.gz")) {
    WARN("Fashion-MNIST is not installed (Debian dataset-fashion-mnist); part skipped");
    return;
  }
  const std::string copy = dir.file("fmnist");
  std::filesystem::create_directories(copy);
  std::filesystem::copy_file(real + "/t10k-images-idx3-ubyte.gz",
                             copy + "/t10k-images-idx3-ubyte.gz");
  REQUIRE(std::system(("gzip -dc '" + real + "/t10k-labels-idx1-ubyte.gz' > '" + copy +
                       "/t10k-labels-idx1-ubyte'")
                          .c_str()) == 0);
  CHECK(fashion_mnist(Split::kTest, copy).cardinality() == 10000);
  {
    std::fstream f(copy + "/t10k-labels-idx1-ubyte",
                   std::ios::binary | std::ios::in | std::ios::out);
    f.seekp(8 + 4321);
    f.put(static_cast<char>(109));
  }
  CHECK_THROWS_WITH(fashion_mnist(Split::kTest, copy),
                    Catch::Contains("data::fashion_mnist") &&
                        Catch::Contains("label 4321 is 109") &&
                        Catch::Contains("t10k-labels-idx1-ubyte"));
}

TEST_CASE("idx: a file that is not IDX of unsigned bytes is refused by its header, not inflated",
          "[cpu][data]") {
  TempDir dir;
  const std::string labels = dir.file("labels");
  write_idx_pair(dir.file("unused"), labels, 4);
  // A well-formed IDX file of 10^6 int32 (4 MB of data): refused for its type, not mistaken for
  // an unsigned-byte array with 3 MB of trailing bytes.
  const std::string int32 = dir.file("int32");
  std::vector<uint8_t> bytes = idx_header({1000000}, 4000000);
  bytes[2] = 0x0C;
  write_bytes(int32, bytes);
  gzip(int32);
  for (const std::string& path : {int32, int32 + ".gz"}) {
    INFO(path);
    CHECK_THROWS_WITH(idx(path, labels), Catch::Contains(path) &&
                                             Catch::Contains("holds IDX type int32") &&
                                             Catch::Contains("unsigned bytes (type 0x08)"));
  }
  // A .gz of 16 MiB that does not start as an IDX file, its compressed stream cut in half:
  // reading stops at the first chunk, where the header already shows it is not IDX, and never
  // reaches the damage (which would have been reported as a gzip error after inflating MiBs).
  const std::string other = dir.file("other");
  bytes.assign(size_t{16} << 20, 0);
  bytes[0] = 0x50;
  bytes[1] = 0x4B;
  write_bytes(other, bytes);
  gzip(other);
  std::filesystem::resize_file(other + ".gz", std::filesystem::file_size(other + ".gz") / 2);
  CHECK_THROWS_WITH(idx(other + ".gz", labels), Catch::Contains(other + ".gz") &&
                                                    Catch::Contains("is not an IDX file") &&
                                                    Catch::Contains("bad magic number 0x504B0000"));
}

TEST_CASE("hdf5: declared sizes the file does not hold are refused when it opens", "[cpu][data]") {
  TempDir dir;
  try {
    hdf5({dir.file("none.h5")}, {"x"});
  } catch (const NotBuiltError&) {
    WARN("skipped: built without HDF5");
    return;
  } catch (const Error&) {
  }
  // Contiguous files whose dataspace is patched (its extent appears twice: dims and max dims;
  // HDF5 1.10 opens them and reads past the stored bytes without complaint), chunked datasets
  // declaring far more than their file holds, and one good compressed dataset.
  const std::string script =
      "import struct\nd = \"" + dir.file("") +
      "\"\n"
      "def patched(name, extent):\n"
      "  with h5py.File(d + \"base.h5\", \"w\") as f:\n"
      "    f[\"x\"] = np.arange(100000, dtype=np.float32)\n"
      "  b = open(d + \"base.h5\", \"rb\").read()\n"
      "  old = struct.pack(\"<Q\", 100000)\n"
      "  assert b.count(old) == 2\n"
      "  open(d + name, \"wb\").write(b.replace(old, struct.pack(\"<Q\", extent)))\n"
      "patched(\"longer.h5\", 100500)\n"
      "patched(\"wrapped.h5\", 2**62)\n"
      "def create(name, **kw):\n"
      "  with h5py.File(d + name, \"w\") as f:\n"
      "    f.create_dataset(\"x\", **kw)\n"
      "create(\"unwritten.h5\", shape=(5,), dtype=\"f4\")\n"
      "create(\"wide_rows.h5\", shape=(2, 2**62), chunks=(1, 1024), dtype=\"f4\")\n"
      "create(\"many_rows.h5\", shape=(2**40,), chunks=(1024,), dtype=\"f4\")\n"
      "create(\"inflated.h5\", shape=(1000, 1000, 100), chunks=(10, 1000, 100), dtype=\"f4\",\n"
      "       compression=\"gzip\")\n"
      "create(\"empty_rows.h5\", shape=(2**62, 0), maxshape=(None, None), chunks=(1024, 1),\n"
      "       dtype=\"f4\")\n"
      "x = (np.arange(200000) % 7).reshape(20000, 10).astype(np.float32)\n"
      "create(\"good_gz.h5\", data=x, chunks=(1000, 10), compression=\"gzip\")\n";
  if (!python_h5py(script)) {
    WARN("skipped: /usr/bin/python3 has no h5py (apt install python3-h5py)");
    return;
  }
  const std::string longer = dir.file("longer.h5");
  CHECK_THROWS_WITH(
      hdf5({longer}, {"x"}),
      Catch::Contains("dataset 'x' in '" + longer + "'") &&
          Catch::Contains("declares shape [100500] of 4-byte elements (402000 bytes)") &&
          Catch::Contains("but stores 400000 bytes"));
  CHECK_THROWS_WITH(
      hdf5({dir.file("wrapped.h5")}, {"x"}),
      Catch::Contains("wrapped.h5") &&
          Catch::Contains("declares shape [4611686018427387904] of 4-byte elements") &&
          Catch::Contains("more bytes than int64 can count"));
  CHECK_THROWS_WITH(
      hdf5({dir.file("unwritten.h5")}, {"x"}),
      Catch::Contains("unwritten.h5") &&
          Catch::Contains("declares shape [5] of 4-byte elements (20 bytes) but stores 0"));
  // A row of 2^62 float32: its bytes wrapped to 0 and every read copied nothing.
  CHECK_THROWS_WITH(hdf5({dir.file("wide_rows.h5")}, {"x"}),
                    Catch::Contains("wide_rows.h5") &&
                        Catch::Contains("[2, 4611686018427387904] of 4-byte elements") &&
                        Catch::Contains("more bytes than int64 can count"));
  CHECK_THROWS_WITH(
      hdf5({dir.file("many_rows.h5")}, {"x"}),
      Catch::Contains("many_rows.h5") &&
          Catch::Contains("[1099511627776] of 4-byte elements (4398046511104 bytes)") &&
          Catch::Contains("more than its file of") && Catch::Contains("can hold;"));
  CHECK_THROWS_WITH(hdf5({dir.file("inflated.h5")}, {"x"}),
                    Catch::Contains("[1000, 1000, 100] of 4-byte elements (400000000 bytes)") &&
                        Catch::Contains("can hold compressed"));
  // Rows of no bytes pass the size checks, but two files of 2^62 of them cannot be counted.
  CHECK(hdf5({dir.file("empty_rows.h5")}, {"x"}).cardinality() == (int64_t{1} << 62));
  CHECK_THROWS_WITH(hdf5({dir.file("empty_rows.h5"), dir.file("empty_rows.h5")}, {"x"}),
                    Catch::Contains("empty_rows.h5' holds 4611686018427387904 examples after "
                                    "4611686018427387904") &&
                        Catch::Contains("more than int64 can count"));
  // A compressed dataset that holds its data reads as written.
  Dataset good = hdf5({dir.file("good_gz.h5")}, {"x"}, /*chunk_rows=*/3000);
  CHECK(good.cardinality() == 20000);
  std::vector<Element> rows;
  for (const Element& e : good.skip(19998)) rows.push_back(e);
  REQUIRE(rows.size() == 2);
  CHECK(rows[0][0].to_vector<float>() ==
        std::vector<float>{4, 5, 6, 0, 1, 2, 3, 4, 5, 6});  // (199980 + k) % 7
  CHECK(rows[1][0].to_vector<float>()[0] == 0.0f);          // 199990 % 7
}
