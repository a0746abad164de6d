// IDX files (the MNIST / Fashion-MNIST format), plain or gzip-compressed: reading and
// validation, the in-memory IDX source (images scaled to float32 [0, 1], int64 labels) and
// the data::idx / data::fashion_mnist sources, which share loaded files process-wide.
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <sstream>

#include "tandem/data/internal/node.h"

namespace tandem::data {
namespace detail {
namespace {

namespace fs = std::filesystem;

uint32_t big_endian_u32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

/// Whether the first 4 bytes of a file are the magic number of an IDX array of unsigned bytes
/// (0x00 0x00 0x08 <rank >= 1>), the only IDX files Tandem reads.
bool is_unsigned_byte_idx(const uint8_t* magic) {
  return magic[0] == 0 && magic[1] == 0 && magic[2] == 0x08 && magic[3] != 0;
}

/// The size in bytes of the IDX file whose first `size` bytes are `bytes` (header and data),
/// once its header is complete: nullopt before that, or when the header is not that of an IDX
/// array of unsigned bytes (parse_idx says why). Raises when the declared size cannot be
/// counted, naming the dimensions: their product can exceed any real file (4 x 2^31 x 2^31
/// wraps to 0 in int64).
std::optional<uint64_t> declared_idx_size(const uint8_t* bytes, size_t size,
                                          const std::string& path, const char* who) {
  if (size < 4 || !is_unsigned_byte_idx(bytes)) return std::nullopt;
  const size_t rank = bytes[3];
  const uint64_t header = 4 + 4 * uint64_t{rank};
  if (size < header) return std::nullopt;
  uint64_t total = 1;
  std::vector<int64_t> dims;
  bool overflow = false;
  for (size_t i = 0; i < rank; ++i) {
    dims.push_back(big_endian_u32(bytes + 4 + 4 * i));
    overflow =
        overflow || __builtin_mul_overflow(total, static_cast<uint64_t>(dims.back()), &total);
  }
  overflow = overflow || __builtin_add_overflow(total, header, &total) ||
             total > static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
  TANDEM_CHECK(!overflow, who, ": '", path, "' is damaged: its header declares an array of ",
               Shape(dims), " bytes, more than any file can hold");
  return total;
}

/// The bytes of a file, gunzipped when it is gzip-compressed (zlib reads plain files as is).
/// Memory grows only with the data actually read, whatever the header declares, and reading
/// stops once the data is well past the size the header declares, or at the first chunk when
/// the file does not start as an IDX file of unsigned bytes (parse_idx then says what is
/// wrong): a small damaged or hostile .gz cannot make it decompress gigabytes.
std::vector<uint8_t> read_file(const std::string& path, const char* who) {
  std::error_code ec;
  TANDEM_CHECK(fs::is_regular_file(path, ec), who, ": cannot open '", path,
               "': ", fs::exists(path, ec) ? "not a regular file" : "no such file");
  // Closed on every path, the errors raised below included.
  std::unique_ptr<gzFile_s, int (*)(gzFile)> file(gzopen(path.c_str(), "rb"), gzclose);
  TANDEM_CHECK(file != nullptr, who, ": cannot open '", path, "': ", std::strerror(errno));
  gzbuffer(file.get(), 1 << 18);
  std::vector<uint8_t> bytes;
  size_t size = 0;
  // Reads grow from 64 KiB to 1 MiB at a time: small files stay cheap, large ones take few calls.
  constexpr size_t kMaxChunk = 1 << 20;
  size_t chunk = 64 << 10;
  std::optional<uint64_t> declared;
  for (;;) {
    if (size >= 4 && !is_unsigned_byte_idx(bytes.data())) break;
    if (!declared) declared = declared_idx_size(bytes.data(), size, path, who);
    TANDEM_CHECK(!declared || size <= *declared + kMaxChunk, who, ": '", path, "' has more than ",
                 size - declared.value_or(0), " bytes after the array its header describes (",
                 declared.value_or(0), " bytes with the header): corrupt, or not an IDX file");
    bytes.resize(size + chunk);
    const int n = gzread(file.get(), bytes.data() + size, static_cast<unsigned>(chunk));
    if (n <= 0) {
      int code = Z_OK;
      const char* message = gzerror(file.get(), &code);
      const std::string reason = message ? message : "unknown error";
      TANDEM_CHECK(n == 0 && (code == Z_OK || code == Z_STREAM_END), who, ": cannot read '", path,
                   "': ", code == Z_ERRNO ? std::strerror(errno) : reason,
                   " (truncated or corrupt gzip data?)");
      break;
    }
    size += static_cast<size_t>(n);
    chunk = std::min(chunk * 2, kMaxChunk);
  }
  bytes.resize(size);
  return bytes;
}

std::string dims_string(const std::vector<int64_t>& dims) { return Shape(dims).to_string(); }

/// A validated IDX array of unsigned bytes: its dimensions and where its data starts.
struct IdxArray {
  std::vector<uint8_t> bytes;
  std::vector<int64_t> dims;
  size_t data_offset = 0;
};

IdxArray parse_idx(std::vector<uint8_t> bytes, const std::string& path, const char* who) {
  IdxArray array;
  TANDEM_CHECK(bytes.size() >= 4, who, ": '", path, "' is truncated: ", bytes.size(),
               " bytes, shorter than an IDX header");
  const uint32_t magic = big_endian_u32(bytes.data());
  const uint8_t type = bytes[2], rank = bytes[3];
  const std::map<uint8_t, std::pair<const char*, int>> types = {
      {0x08, {"unsigned byte", 1}}, {0x09, {"signed byte", 1}}, {0x0B, {"int16", 2}},
      {0x0C, {"int32", 4}},         {0x0D, {"float32", 4}},     {0x0E, {"float64", 8}}};
  char magic_text[16];
  std::snprintf(magic_text, sizeof(magic_text), "0x%08X", magic);
  TANDEM_CHECK(bytes[0] == 0 && bytes[1] == 0 && types.count(type) && rank >= 1, who, ": '", path,
               "' is not an IDX file: bad magic number ", magic_text, " (IDX files start with ",
               "two zero bytes, a type byte and a rank byte, e.g. 0x00000803 for images and ",
               "0x00000801 for labels)");
  TANDEM_CHECK(type == 0x08, who, ": '", path, "' holds IDX type ", types.at(type).first,
               "; Tandem reads IDX files of unsigned bytes (type 0x08)");
  const size_t header = 4 + 4 * size_t{rank};
  TANDEM_CHECK(bytes.size() >= header, who, ": '", path, "' is truncated inside its header (",
               bytes.size(), " bytes, the header of a rank-", int{rank}, " array needs ", header,
               ")");
  for (int i = 0; i < rank; ++i) array.dims.push_back(big_endian_u32(bytes.data() + 4 + 4 * i));
  // Checked: the product of the declared dimensions must be countable (it raises otherwise).
  const size_t expected =
      static_cast<size_t>(*declared_idx_size(bytes.data(), bytes.size(), path, who));
  TANDEM_CHECK(bytes.size() >= expected, who, ": '", path, "' is truncated: its header ",
               "describes ", dims_string(array.dims), " unsigned bytes (", expected,
               " bytes with the header) but the file holds ", bytes.size(), " bytes");
  TANDEM_CHECK(bytes.size() == expected, who, ": '", path, "' has ", bytes.size() - expected,
               " bytes after the ", dims_string(array.dims), " array its header describes ",
               "(corrupt, or not an IDX file)");
  array.bytes = std::move(bytes);
  array.data_offset = header;
  return array;
}

/// An IDX image file and its label file, in memory.
class IdxSource final : public Source {
 public:
  IdxSource(IdxArray images, IdxArray labels, std::string name)
      : images_(std::move(images)), name_(std::move(name)) {
    const std::vector<int64_t>& dims = images_.dims;
    image_shape_ = Shape(std::vector<int64_t>(dims.begin() + 1, dims.end()));
    pixels_ = static_cast<size_t>(image_shape_.numel());
    size_ = dims[0];
    labels_.resize(static_cast<size_t>(size_));
    for (int64_t i = 0; i < size_; ++i) labels_[i] = labels.bytes[labels.data_offset + i];
  }

  int64_t size() const override { return size_; }
  bool cheap_random_access() const override { return true; }
  /// Raises at the first label outside [0, num_classes), naming `labels_path` (the file they
  /// came from), the label's index and its value.
  void check_labels(int64_t num_classes, const std::string& labels_path, const char* who) const {
    TANDEM_CHECK(num_classes >= 1, who, ": num_classes must be >= 1, got ", num_classes);
    for (size_t i = 0; i < labels_.size(); ++i) {
      TANDEM_CHECK(labels_[i] >= 0 && labels_[i] < num_classes, who, ": '", labels_path,
                   "' is damaged or of another data set: label ", i, " is ", labels_[i],
                   ", outside the ", num_classes, " classes [0, ", num_classes, ")");
    }
  }
  const Shape& image_shape() const { return image_shape_; }
  std::vector<TensorSpec> element_spec() const override {
    return {{image_shape_, DType::kFloat32}, {Shape{}, DType::kInt64}};
  }
  std::string describe() const override {
    std::ostringstream out;
    out << name_ << "(" << size_ << " examples of " << image_shape_ << ")";
    return out.str();
  }

  class Reader final : public SourceReader {
   public:
    explicit Reader(const IdxSource& source) : source_(source) {}
    void read(int64_t index, Element& out) override {
      out.resize(2);
      out[0] = Tensor::empty(source_.image_shape_, DType::kFloat32);
      out[1] = Tensor::empty(Shape{}, DType::kInt64);
      copy(index, out[0].data<float>(), out[1].data<int64_t>());
    }
    void gather(const std::vector<int64_t>& indices, Element& out) override {
      const auto rows = static_cast<int64_t>(indices.size());
      out.resize(2);
      out[0] = Tensor::empty(prepend_dim(rows, source_.image_shape_), DType::kFloat32);
      out[1] = Tensor::empty(Shape{rows}, DType::kInt64);
      float* images = out[0].data<float>();
      int64_t* labels = out[1].data<int64_t>();
      for (int64_t r = 0; r < rows; ++r)
        copy(indices[r], images + static_cast<size_t>(r) * source_.pixels_, labels + r);
    }

   private:
    void copy(int64_t index, float* image, int64_t* label) const {
      TANDEM_CHECK(index >= 0 && index < source_.size_, "element ", index, " requested from ",
                   source_.describe());
      const uint8_t* pixels = source_.images_.bytes.data() + source_.images_.data_offset +
                              static_cast<size_t>(index) * source_.pixels_;
      // A plain loop the compiler vectorises (convert, then divide: exact v / 255).
      for (size_t p = 0; p < source_.pixels_; ++p)
        image[p] = static_cast<float>(pixels[p]) / 255.0f;
      *label = source_.labels_[static_cast<size_t>(index)];
    }
    const IdxSource& source_;
  };

  std::unique_ptr<SourceReader> reader() const override { return std::make_unique<Reader>(*this); }

 private:
  IdxArray images_;
  std::vector<int64_t> labels_;
  std::string name_;
  Shape image_shape_;
  size_t pixels_ = 0;
  int64_t size_ = 0;
};

std::shared_ptr<const IdxSource> load_idx(const std::string& images_path,
                                          const std::string& labels_path, const std::string& name,
                                          const char* who) {
  IdxArray images = parse_idx(read_file(images_path, who), images_path, who);
  IdxArray labels = parse_idx(read_file(labels_path, who), labels_path, who);
  TANDEM_CHECK(images.dims.size() >= 2, who, ": '", images_path, "' should hold images (rank ",
               ">= 2: [count, rows, cols]) but its header says rank ", images.dims.size(), " (",
               dims_string(images.dims), ")");
  TANDEM_CHECK(labels.dims.size() == 1, who, ": '", labels_path, "' should hold labels (rank ",
               "1: [count]) but its header says rank ", labels.dims.size(), " (",
               dims_string(labels.dims), ")");
  TANDEM_CHECK(images.dims[0] == labels.dims[0], who, ": '", images_path, "' holds ",
               images.dims[0], " images but '", labels_path, "' holds ", labels.dims[0], " labels");
  return std::make_shared<IdxSource>(std::move(images), std::move(labels), name);
}

/// Loaded files are shared while any dataset uses them; the key includes size and mtime, so
/// a rewritten file is read again.
std::shared_ptr<const IdxSource> cached_idx(const std::string& images_path,
                                            const std::string& labels_path, const std::string& name,
                                            const char* who) {
  static std::mutex mutex;
  static std::map<std::string, std::weak_ptr<const IdxSource>> cache;
  std::ostringstream key;
  key << name;
  for (const std::string& path : {images_path, labels_path}) {
    std::error_code ec;
    const fs::path canonical = fs::weakly_canonical(path, ec);
    key << "|" << (ec ? path : canonical.string());
    const auto size = fs::file_size(path, ec);
    key << "|" << (ec ? 0 : size);
    const auto time = fs::last_write_time(path, ec);
    key << "|" << (ec ? 0 : time.time_since_epoch().count());
  }
  std::lock_guard<std::mutex> lock(mutex);
  if (auto cached = cache[key.str()].lock()) return cached;
  auto source = load_idx(images_path, labels_path, name, who);
  cache[key.str()] = source;
  return source;
}

}  // namespace
}  // namespace detail

Dataset idx(const std::string& images_path, const std::string& labels_path,
            std::optional<int64_t> num_classes) {
  auto source = detail::cached_idx(images_path, labels_path, "idx", "data::idx");
  if (num_classes) source->check_labels(*num_classes, labels_path, "data::idx");
  return Dataset(detail::make_source_node(std::move(source), "idx"));
}

Dataset fashion_mnist(Split split, const std::string& directory) {
  namespace fs = std::filesystem;
  const std::string prefix = split == Split::kTrain ? "train" : "t10k";
  const std::string name = split == Split::kTrain ? "fashion_mnist_train" : "fashion_mnist_test";
  auto find = [&](const std::string& stem) {
    const fs::path base = fs::path(directory) / stem;
    std::error_code ec;
    if (fs::exists(base.string() + ".gz", ec)) return base.string() + ".gz";
    TANDEM_CHECK(fs::exists(base, ec), "data::fashion_mnist: neither '", base.string(),
                 ".gz' nor '", base.string(), "' exists; install the Debian package ",
                 "dataset-fashion-mnist (scripts/setup does) or pass the directory that holds ",
                 "the IDX files");
    return base.string();
  };
  const std::string images = find(prefix + "-images-idx3-ubyte");
  const std::string labels = find(prefix + "-labels-idx1-ubyte");
  auto source = detail::cached_idx(images, labels, name, "data::fashion_mnist");
  TANDEM_CHECK(source->image_shape() == (Shape{28, 28}), "data::fashion_mnist: '", images,
               "' holds images of ", source->image_shape(), ", Fashion-MNIST's are [28, 28]");
  source->check_labels(/*num_classes=*/10, labels, "data::fashion_mnist");
  return Dataset(detail::make_source_node(std::move(source), "fashion_mnist"));
}

}  // namespace tandem::data
