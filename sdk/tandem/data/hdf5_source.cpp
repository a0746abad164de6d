// data::hdf5: examples from one or many HDF5 files, read in chunks of rows with hyperslab
// selections through the HDF5 wrapper (io/internal/hdf5_file.h); compiled only when CMake
// found HDF5 (data::hdf5 raises NotBuiltError otherwise).
#include <algorithm>
#include <cstring>
#include <filesystem>
#include <limits>
#include <optional>
#include <sstream>

#include "tandem/data/internal/node.h"
#include "tandem/io/internal/hdf5_file.h"

namespace tandem::data::detail {
namespace {

/// "'x' in 'part0.h5'": how messages name a dataset.
std::string dataset_label(const std::string& path, const std::string& name) {
  return "'" + name + "' in '" + path + "'";
}

h5::File open_file(const std::string& path) {
  std::error_code ec;
  TANDEM_CHECK(std::filesystem::is_regular_file(path, ec), "data::hdf5: cannot open '", path,
               "': ", std::filesystem::exists(path, ec) ? "not a regular file" : "no such file");
  return h5::File::open_as_found(path, "data::hdf5: cannot open '" + path + "' as an HDF5 file");
}

h5::Dataset open_dataset(const h5::File& file, const std::string& path, const std::string& name) {
  // Group::exists checks each link of the name: an intermediate group may be missing too.
  const bool exists = !name.empty() && file.root().exists(name);
  TANDEM_CHECK(exists, "data::hdf5: '", path, "' has no dataset '", name, "'");
  return file.root().open_dataset(name, "data::hdf5: ", dataset_label(path, name));
}

/// The DType a file type is read as (HDF5 converts on read).
DType dtype_for(const h5::ElementType& type, const std::string& path, const std::string& name) {
  const size_t size = type.bytes;
  if (type.kind == h5::ElementType::Kind::kFloat)
    return size <= 4 ? DType::kFloat32 : DType::kFloat64;
  if (type.kind == h5::ElementType::Kind::kInteger) {
    if (!type.is_signed) {
      if (size == 1) return DType::kUInt8;
      if (size == 2) return DType::kInt32;
      if (size == 4) return DType::kInt64;
    } else {
      if (size <= 4) return DType::kInt32;
      if (size == 8) return DType::kInt64;
    }
    TANDEM_THROW("data::hdf5: dataset '", name, "' in '", path, "' holds ",
                 type.is_signed ? "signed" : "unsigned", " ", size * 8,
                 "-bit integers, which no Tandem dtype holds exactly");
  }
  TANDEM_THROW("data::hdf5: dataset '", name, "' in '", path, "' holds neither integers nor ",
               "floating-point numbers (HDF5 type class ", type.hdf5_class,
               "); data::hdf5 reads numeric datasets");
}

/// Raises naming the dataset and its file when its declared shape (of `element_bytes`-byte
/// elements in the file) needs bytes that the file does not hold. A contiguous dataset must
/// store exactly that many: HDF5 reads past a shorter one without complaint, returning whatever
/// lies beyond (zeros, other objects). A chunked one may not declare more than its file holds
/// (h5::kMaxCompressionRatio times more when compressed, as for checkpoints). Damaged extents
/// would otherwise surface as absurd allocations, or as garbage or errors hours into a run.
void check_stored_size(const h5::Dataset& dataset, const std::string& path, const std::string& name,
                       const Shape& shape, size_t element_bytes) {
  // Elements first, then bytes, as Shape::numel and Shape::nbytes count: [2^62, 0] holds none.
  uint64_t declared = 1;
  bool overflow = false;
  for (int64_t d : shape)
    overflow = overflow || __builtin_mul_overflow(declared, static_cast<uint64_t>(d), &declared);
  overflow = overflow || __builtin_mul_overflow(declared, uint64_t{element_bytes}, &declared);
  TANDEM_CHECK(!overflow && declared <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()),
               "data::hdf5: dataset '", name, "' in '", path, "' declares shape ", shape, " of ",
               element_bytes, "-byte elements, more bytes than int64 can count; the file is ",
               "damaged");
  const h5::Layout layout = dataset.layout();
  const int external = dataset.external_files();
  // Virtual datasets and external storage keep their data in other files.
  if (layout == h5::Layout::kVirtual || external > 0) return;
  if (layout == h5::Layout::kContiguous) {
    const uint64_t stored = dataset.stored_bytes();  // 0 also when never written
    TANDEM_CHECK(stored == declared, "data::hdf5: dataset '", name, "' in '", path,
                 "' declares shape ", shape, " of ", element_bytes, "-byte elements (", declared,
                 " bytes) but stores ", stored, " bytes; the file is damaged (or the dataset ",
                 "was never written)");
    return;
  }
  const uint64_t file_bytes = dataset.file_bytes();
  const bool compressed = dataset.compressed();
  uint64_t limit = file_bytes;
  if (compressed && __builtin_mul_overflow(limit, h5::kMaxCompressionRatio, &limit))
    limit = std::numeric_limits<uint64_t>::max();
  TANDEM_CHECK(declared <= limit, "data::hdf5: dataset '", name, "' in '", path,
               "' declares shape ", shape, " of ", element_bytes, "-byte elements (", declared,
               " bytes), more than its file of ", file_bytes, " bytes can hold",
               compressed ? " compressed" : "", "; the file is damaged");
}

/// Shape [rows, ...] and type of one named dataset in one file.
struct DatasetInfo {
  std::vector<int64_t> dims;
  DType dtype;
};

DatasetInfo inspect(const h5::File& file, const std::string& path, const std::string& name) {
  const h5::Dataset dataset = open_dataset(file, path, name);
  const std::vector<uint64_t> extents = dataset.extents();
  const auto rank = static_cast<int>(extents.size());
  TANDEM_CHECK(rank >= 1, "data::hdf5: dataset '", name, "' in '", path, "' is a scalar; ",
               "data::hdf5 reads arrays of shape [examples, ...]");
  DatasetInfo info;
  for (uint64_t d : extents) {
    TANDEM_CHECK(d <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()),
                 "data::hdf5: dataset '", name, "' in '", path, "' declares an extent of ", d,
                 " elements; the file is damaged");
    info.dims.push_back(static_cast<int64_t>(d));
  }
  const h5::ElementType type = dataset.element_type();
  info.dtype = dtype_for(type, path, name);
  check_stored_size(dataset, path, name, Shape(info.dims), type.bytes);
  return info;
}

class Hdf5Source final : public Source, public std::enable_shared_from_this<Hdf5Source> {
 public:
  Hdf5Source(std::vector<std::string> files, std::vector<std::string> names, int64_t chunk_rows)
      : files_(std::move(files)), names_(std::move(names)), chunk_rows_(chunk_rows) {
    TANDEM_CHECK(!files_.empty(), "data::hdf5: no files given");
    TANDEM_CHECK(!names_.empty(), "data::hdf5: no dataset names given");
    TANDEM_CHECK(chunk_rows_ >= 1, "data::hdf5: chunk_rows must be positive, got ", chunk_rows_);
    offsets_.push_back(0);
    for (const std::string& path : files_) {
      const h5::File file = open_file(path);
      int64_t rows = -1;
      for (size_t c = 0; c < names_.size(); ++c) {
        const DatasetInfo info = inspect(file, path, names_[c]);
        const Shape row_shape(std::vector<int64_t>(info.dims.begin() + 1, info.dims.end()));
        if (rows < 0) rows = info.dims[0];
        TANDEM_CHECK(info.dims[0] == rows, "data::hdf5: in '", path, "', dataset '", names_[c],
                     "' has ", info.dims[0], " rows but '", names_[0], "' has ", rows);
        if (row_shapes_.size() < names_.size()) {
          row_shapes_.push_back(row_shape);
          dtypes_.push_back(info.dtype);
          row_bytes_.push_back(row_shape.nbytes(dtype_size(info.dtype)));
        } else {
          TANDEM_CHECK(row_shape == row_shapes_[c] && info.dtype == dtypes_[c],
                       "data::hdf5: ", "dataset '", names_[c], "' in '", path, "' has examples of ",
                       row_shape, " ", info.dtype, " but in '", files_[0], "' of ", row_shapes_[c],
                       " ", dtypes_[c]);
        }
      }
      int64_t end = 0;
      TANDEM_CHECK(!__builtin_add_overflow(offsets_.back(), rows, &end), "data::hdf5: '", path,
                   "' holds ", rows, " examples after ", offsets_.back(), " in the files before ",
                   "it, more than int64 can count");
      offsets_.push_back(end);
    }
  }

  int64_t size() const override { return offsets_.back(); }
  bool cheap_random_access() const override { return false; }
  std::vector<TensorSpec> element_spec() const override {
    std::vector<TensorSpec> spec;
    for (size_t c = 0; c < names_.size(); ++c) spec.push_back({row_shapes_[c], dtypes_[c]});
    return spec;
  }
  std::string describe() const override {
    std::ostringstream out;
    out << "hdf5(" << files_.size() << " file(s), " << size() << " examples of";
    for (size_t c = 0; c < names_.size(); ++c)
      out << (c ? "," : "") << " " << names_[c] << " " << row_shapes_[c] << " " << dtypes_[c];
    out << ")";
    return out.str();
  }
  std::vector<std::string> files() const override { return files_; }
  std::shared_ptr<const Source> with_files(std::vector<std::string> files) const override {
    return std::make_shared<Hdf5Source>(std::move(files), names_, chunk_rows_);
  }
  std::unique_ptr<SourceReader> reader() const override;

 private:
  friend class Hdf5Reader;
  std::vector<std::string> files_;
  std::vector<std::string> names_;
  int64_t chunk_rows_;
  std::vector<int64_t> offsets_;  // first global row of each file; back() = total rows
  std::vector<Shape> row_shapes_;
  std::vector<DType> dtypes_;
  std::vector<size_t> row_bytes_;
};

/// Reads chunk_rows rows at a time (one hyperslab per dataset) and serves rows from that
/// chunk; sequential reading therefore touches each file once per chunk. One per iterator.
class Hdf5Reader final : public SourceReader {
 public:
  explicit Hdf5Reader(std::shared_ptr<const Hdf5Source> source)
      : source_(std::move(source)), chunks_(source_->names_.size()) {}

  void read(int64_t index, Element& out) override {
    const int64_t row = load_chunk_with(index);
    out.resize(source_->names_.size());
    for (size_t c = 0; c < out.size(); ++c) {
      out[c] = Tensor::empty(source_->row_shapes_[c], source_->dtypes_[c]);
      copy_row(c, row, out[c].raw_data());
    }
  }
  void gather(const std::vector<int64_t>& indices, Element& out) override {
    const auto rows = static_cast<int64_t>(indices.size());
    out.resize(source_->names_.size());
    for (size_t c = 0; c < out.size(); ++c)
      out[c] = Tensor::empty(prepend_dim(rows, source_->row_shapes_[c]), source_->dtypes_[c]);
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t row = load_chunk_with(indices[r]);
      for (size_t c = 0; c < out.size(); ++c)
        copy_row(c, row, static_cast<char*>(out[c].raw_data()) + r * source_->row_bytes_[c]);
    }
  }

 private:
  /// Makes sure global row `index` is in the chunk buffers; returns its row in the chunk.
  int64_t load_chunk_with(int64_t index) {
    TANDEM_CHECK(index >= 0 && index < source_->size(), "element ", index, " requested from ",
                 source_->describe());
    if (index >= chunk_begin_ && index < chunk_begin_ + chunk_rows_) return index - chunk_begin_;
    const auto& offsets = source_->offsets_;
    const size_t f = static_cast<size_t>(std::upper_bound(offsets.begin(), offsets.end(), index) -
                                         offsets.begin()) -
                     1;
    const int64_t local = index - offsets[f];
    const int64_t start = local - local % source_->chunk_rows_;
    const int64_t count = std::min(source_->chunk_rows_, offsets[f + 1] - offsets[f] - start);
    if (static_cast<int64_t>(f) != file_index_) {
      datasets_.clear();
      file_.reset();
      file_index_ = -1;
      file_ = open_file(source_->files_[f]);
      for (const std::string& name : source_->names_)
        datasets_.push_back(open_dataset(*file_, source_->files_[f], name));
      file_index_ = static_cast<int64_t>(f);
    }
    chunk_begin_ = -1;  // invalid until every dataset is read
    for (size_t c = 0; c < datasets_.size(); ++c) read_rows(c, start, count);
    chunk_begin_ = offsets[f] + start;
    chunk_rows_ = count;
    return index - chunk_begin_;
  }

  void read_rows(size_t c, int64_t start, int64_t count) {
    chunks_[c].resize(static_cast<size_t>(count) * source_->row_bytes_[c]);
    if (chunks_[c].empty()) return;
    datasets_[c].read_rows(start, count, source_->row_shapes_[c], source_->dtypes_[c],
                           chunks_[c].data());
  }

  void copy_row(size_t c, int64_t row, void* dst) const {
    const size_t n = source_->row_bytes_[c];
    if (n > 0) std::memcpy(dst, chunks_[c].data() + static_cast<size_t>(row) * n, n);
  }

  std::shared_ptr<const Hdf5Source> source_;
  int64_t file_index_ = -1;
  std::optional<h5::File> file_;
  std::vector<h5::Dataset> datasets_;
  std::vector<std::vector<char>> chunks_;  // per dataset: chunk_rows_ rows
  int64_t chunk_begin_ = -1;               // global row of the chunk's first row
  int64_t chunk_rows_ = 0;
};

std::unique_ptr<SourceReader> Hdf5Source::reader() const {
  return std::make_unique<Hdf5Reader>(shared_from_this());
}

}  // namespace

std::shared_ptr<const Source> make_hdf5_source(std::vector<std::string> files,
                                               std::vector<std::string> dataset_names,
                                               int64_t chunk_rows) {
  return std::make_shared<Hdf5Source>(std::move(files), std::move(dataset_names), chunk_rows);
}

}  // namespace tandem::data::detail
