// make_seeds: writes the seed corpus of the fuzz harnesses from real files: Fashion-MNIST's IDX
// files cut to a few examples (headers kept valid; plain and gzip), HDF5 example files written by
// Tandem's HDF5 writer, and checkpoints Checkpoint::write makes of fuzz_support.h's state.
//   fuzz_make_seeds OUT_DIR [FASHION_MNIST_DIR]   writes OUT_DIR/<harness>/<seed>
// scripts/fuzz --make-seeds runs it into fuzz/corpus.
#include <zlib.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <utility>

#include "fuzz_support.h"
#include "tandem/io/internal/hdf5_file.h"

namespace fs = std::filesystem;
namespace fz = tandem::fuzzing;
using tandem::DType;
using tandem::Shape;
using tandem::Tensor;

namespace {

using Bytes = std::vector<uint8_t>;

Bytes gunzip_file(const std::string& path) {
  gzFile file = gzopen(path.c_str(), "rb");
  if (file == nullptr) throw tandem::Error("make_seeds: cannot open " + path);
  Bytes bytes;
  uint8_t buffer[1 << 16];
  int n = 0;
  while ((n = gzread(file, buffer, sizeof(buffer))) > 0)
    bytes.insert(bytes.end(), buffer, buffer + n);
  gzclose(file);
  if (n < 0) throw tandem::Error("make_seeds: cannot read " + path);
  return bytes;
}

/// gzip-compressed `bytes` (what `gzip -9` writes, which is how the dataset is distributed).
Bytes gzip(const Bytes& bytes) {
  z_stream stream{};
  if (deflateInit2(&stream, 9, Z_DEFLATED, /*windowBits=gzip*/ 31, 8, Z_DEFAULT_STRATEGY) != Z_OK)
    throw tandem::Error("make_seeds: deflateInit2 failed");
  Bytes out(deflateBound(&stream, bytes.size()));
  stream.next_in = const_cast<uint8_t*>(bytes.data());
  stream.avail_in = static_cast<uInt>(bytes.size());
  stream.next_out = out.data();
  stream.avail_out = static_cast<uInt>(out.size());
  if (deflate(&stream, Z_FINISH) != Z_STREAM_END) throw tandem::Error("make_seeds: deflate failed");
  out.resize(stream.total_out);
  deflateEnd(&stream);
  return out;
}

/// The first `count` entries of an IDX file of unsigned bytes, its dimension 0 set to `count`.
Bytes cut_idx(const Bytes& idx, uint32_t count) {
  const size_t rank = idx.at(3);
  const size_t header = 4 + 4 * rank;
  size_t entry = 1;
  for (size_t d = 1; d < rank; ++d) {
    const uint8_t* p = idx.data() + 4 + 4 * d;
    entry *= (size_t{p[0]} << 24) | (size_t{p[1]} << 16) | (size_t{p[2]} << 8) | p[3];
  }
  Bytes out(idx.begin(), idx.begin() + static_cast<std::ptrdiff_t>(header + count * entry));
  for (int b = 0; b < 4; ++b) out[4 + b] = static_cast<uint8_t>(count >> (24 - 8 * b));
  return out;
}

/// fuzz_idx's input: little-endian uint32 size of the image file, the image file, the labels.
Bytes idx_input(const Bytes& images, const Bytes& labels) {
  Bytes out(4);
  const auto n = static_cast<uint32_t>(images.size());
  std::memcpy(out.data(), &n, 4);
  out.insert(out.end(), images.begin(), images.end());
  out.insert(out.end(), labels.begin(), labels.end());
  return out;
}

void write_bytes(const fs::path& path, const Bytes& bytes) {
  fz::write_file(path.string(), bytes.data(), bytes.size());
  std::cout << "  " << path.string() << " (" << bytes.size() << " bytes)\n";
}

void write_idx_seeds(const fs::path& out, const std::string& fashion_dir) {
  fs::create_directories(out);
  const Bytes images = gunzip_file(fashion_dir + "/t10k-images-idx3-ubyte.gz");
  const Bytes labels = gunzip_file(fashion_dir + "/t10k-labels-idx1-ubyte.gz");
  const Bytes images3 = cut_idx(images, 3), labels3 = cut_idx(labels, 3);
  const Bytes images1 = cut_idx(images, 1), labels1 = cut_idx(labels, 1);
  write_bytes(out / "t10k_3_plain", idx_input(images3, labels3));
  write_bytes(out / "t10k_3_gzip", idx_input(gzip(images3), gzip(labels3)));
  write_bytes(out / "t10k_1_gzip_images", idx_input(gzip(images1), labels1));
}

void write_hdf5_seeds(const fs::path& out) {
  fs::create_directories(out);
  tandem::Generator g(/*seed=*/5);
  auto write = [&](const std::string& name, const Tensor& x, const Tensor& y) {
    const fs::path path = out / name;
    fs::remove(path);
    {
      tandem::h5::File file = tandem::h5::File::create(path.string());
      file.root().write_tensor("x", x);
      file.root().write_tensor("y", y);
      file.close();
    }
    std::cout << "  " << path.string() << " (" << fs::file_size(path) << " bytes)\n";
  };
  // 7 rows: chunks of 3, 3 and 1 in the harness.
  write("f32_rows_u8_labels.h5", Tensor::normal({7, 4}, g),
        Tensor::from_vector(std::vector<uint8_t>{0, 1, 2, 3, 4, 5, 6}));
  write("f64_images_i64_labels.h5",
        tandem::ops::cast(Tensor::normal({4, 2, 3}, g), DType::kFloat64),
        Tensor::from_vector(std::vector<int64_t>{9, 8, 7, 6}));
}

void write_checkpoint_seeds(const fs::path& restore_out, const fs::path& inspect_out) {
  fs::create_directories(restore_out);
  fs::create_directories(inspect_out);
  auto save = [&](fz::TrainingState& state, const std::string& name) {
    for (const fs::path& dir : {restore_out, inspect_out}) {
      const fs::path path = dir / name;
      state.checkpoint().write(path.string());
      std::cout << "  " << path.string() << " (" << fs::file_size(path) << " bytes)\n";
    }
  };
  fz::TrainingState fresh;  // nothing trained: empty metrics, iterator at the start
  save(fresh, "ckpt-0.h5");
  fz::TrainingState trained;   // mid-epoch: 5 steps per epoch (20 examples, batches of 4)
  trained.train(/*steps=*/7);  // epoch 1, step 2
  save(trained, "ckpt-7.h5");
}

}  // namespace

/// fuzz_tfrecord: TensorFlow's fixture files (tests/fixtures/tfrecord) behind each options byte
/// that fits them; fuzz_example: the records of its plain file.
void write_tfrecord_seeds(const fs::path& tfrecord_out, const fs::path& example_out) {
  const std::string fixtures = std::string(TANDEM_SOURCE_DIR) + "/tests/fixtures/tfrecord/";
  const std::pair<const char*, uint8_t> files[] = {
      {"examples", 0}, {"examples.gz", 1}, {"examples.zlib", 2}};
  for (const auto& [name, compression] : files) {
    const std::string path = fixtures + name + ".tfrecord";
    for (const uint8_t skip : {0, 4}) {
      Bytes input = {static_cast<uint8_t>(compression | skip)};
      std::ifstream in(path, std::ios::binary);
      input.insert(input.end(), std::istreambuf_iterator<char>(in), {});
      write_bytes(tfrecord_out / (std::string(name) + "-" + std::to_string(compression | skip)),
                  input);
    }
  }
  tandem::io::TFRecordReader reader(fixtures + "examples.tfrecord");
  std::string record;
  for (int i = 0; reader.next(record); ++i)
    write_bytes(example_out / ("record-" + std::to_string(i)), Bytes(record.begin(), record.end()));
}

/// fuzz_image: the JPEG and PNG files of tests/fixtures/images (TensorFlow wrote them).
void write_image_seeds(const fs::path& out) {
  const fs::path tree = fs::path(TANDEM_SOURCE_DIR) / "tests/fixtures/images/tree";
  for (const auto& entry : fs::recursive_directory_iterator(tree)) {
    if (!entry.is_regular_file()) continue;
    std::ifstream in(entry.path(), std::ios::binary);
    const Bytes bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    write_bytes(out / entry.path().filename(), bytes);
  }
}

int main(int argc, char** argv) {
  if (argc < 2 || argc > 3) {
    std::cerr << "usage: fuzz_make_seeds OUT_DIR [FASHION_MNIST_DIR]\n";
    return 2;
  }
  fz::quiet_logging();
  const fs::path out = argv[1];
  const std::string fashion_dir = argc == 3 ? argv[2] : tandem::data::kFashionMnistDirectory;
  try {
    write_idx_seeds(out / "fuzz_idx", fashion_dir);
    write_hdf5_seeds(out / "fuzz_hdf5_dataset");
    write_checkpoint_seeds(out / "fuzz_checkpoint_restore", out / "fuzz_checkpoint_inspect");
    write_tfrecord_seeds(out / "fuzz_tfrecord", out / "fuzz_example");
    write_image_seeds(out / "fuzz_image");
  } catch (const std::exception& e) {
    std::cerr << "fuzz_make_seeds: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
