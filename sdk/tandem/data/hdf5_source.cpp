// data::hdf5: examples from one or many HDF5 files, read in chunks of rows with hyperslab
// selections. The only file of the data layer that includes hdf5.h; compiled only when
// CMake found HDF5. Every HDF5 call goes through TANDEM_H5_CHECK.
#include <hdf5.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <limits>
#include <sstream>

#include "tandem/core/logging.h"
#include "tandem/data/internal/node.h"

namespace tandem::data::detail {
namespace {

/// The messages on the calling thread's HDF5 error stack, innermost last; clears the stack.
std::string hdf5_error_stack() {
  std::string messages;
  H5Ewalk2(
      H5E_DEFAULT, H5E_WALK_DOWNWARD,
      [](unsigned, const H5E_error2_t* error, void* data) -> herr_t {
        auto* out = static_cast<std::string*>(data);
        if (error->desc != nullptr && error->desc[0] != '\0') {
          if (!out->empty()) out->append("; ");
          out->append(error->desc);
        }
        return 0;
      },
      &messages);
  H5Eclear2(H5E_DEFAULT);
  return messages.empty() ? "unknown HDF5 error" : messages;
}

[[noreturn]] void throw_hdf5_error(const char* file, int line, const char* expression,
                                   const std::string& context) {
  ::tandem::detail::throw_error(file, line, expression,
                                context + " (HDF5: " + hdf5_error_stack() + ")");
}

/// HDF5 reports errors through its stack; Tandem raises them instead. The default stack is
/// per thread in thread-safe HDF5 builds, so every entry point (and every thread) calls this.
void silence_hdf5_printing() { H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr); }

}  // namespace
}  // namespace tandem::data::detail

/// Evaluates an HDF5 call; a negative result raises tandem::Error with file:line, the call,
/// the context message parts and HDF5's error stack. Yields the call's result.
#define TANDEM_H5_CHECK(expr, ...)                                                      \
  ([&] {                                                                                \
    auto tandem_h5_result = (expr);                                                     \
    if (tandem_h5_result < 0) [[unlikely]]                                              \
      ::tandem::data::detail::throw_hdf5_error(__FILE__, __LINE__, #expr,               \
                                               ::tandem::detail::str_cat(__VA_ARGS__)); \
    return tandem_h5_result;                                                            \
  }())

namespace tandem::data::detail {
namespace {

/// Owns an HDF5 identifier and closes it with the matching H5*close.
class Handle {
 public:
  using Closer = herr_t (*)(hid_t);
  Handle() = default;
  Handle(hid_t id, Closer closer) : id_(id), closer_(closer) {}
  Handle(Handle&& other) noexcept : id_(other.id_), closer_(other.closer_) { other.id_ = -1; }
  Handle& operator=(Handle&& other) noexcept {
    if (this != &other) {
      reset();
      id_ = other.id_;
      closer_ = other.closer_;
      other.id_ = -1;
    }
    return *this;
  }
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  ~Handle() { reset(); }

  hid_t get() const { return id_; }
  // Destructors log instead of throwing.
  void reset() {
    if (id_ >= 0 && closer_(id_) < 0)
      TANDEM_LOG_WARNING("data::hdf5: closing an HDF5 handle failed");
    id_ = -1;
  }

 private:
  hid_t id_ = -1;
  Closer closer_ = nullptr;
};

Handle open_file(const std::string& path) {
  silence_hdf5_printing();
  std::error_code ec;
  TANDEM_CHECK(std::filesystem::is_regular_file(path, ec), "data::hdf5: cannot open '", path,
               "': ", std::filesystem::exists(path, ec) ? "not a regular file" : "no such file");
  const hid_t id = TANDEM_H5_CHECK(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT),
                                   "data::hdf5: cannot open '", path, "' as an HDF5 file");
  return Handle(id, H5Fclose);
}

Handle open_dataset(const Handle& file, const std::string& path, const std::string& name) {
  // H5Lexists fails (rather than returning 0) when an intermediate group is missing, so its
  // result is checked by hand: either way the dataset is not there.
  const htri_t exists = H5Lexists(file.get(), name.c_str(), H5P_DEFAULT);
  if (exists <= 0) H5Eclear2(H5E_DEFAULT);
  TANDEM_CHECK(exists > 0, "data::hdf5: '", path, "' has no dataset '", name, "'");
  const hid_t id = TANDEM_H5_CHECK(H5Dopen2(file.get(), name.c_str(), H5P_DEFAULT),
                                   "data::hdf5: cannot open dataset '", name, "' in '", path, "'");
  return Handle(id, H5Dclose);
}

/// The DType a file type is read as (HDF5 converts on read).
DType dtype_for(hid_t type, const std::string& path, const std::string& name) {
  const H5T_class_t type_class =
      TANDEM_H5_CHECK(H5Tget_class(type), "data::hdf5: type of '", name, "' in '", path, "'");
  const size_t size = H5Tget_size(type);  // 0 on failure
  TANDEM_CHECK(size > 0, "data::hdf5: size of the type of '", name, "' in '", path, "'");
  if (type_class == H5T_FLOAT) return size <= 4 ? DType::kFloat32 : DType::kFloat64;
  if (type_class == H5T_INTEGER) {
    const H5T_sign_t sign =
        TANDEM_H5_CHECK(H5Tget_sign(type), "data::hdf5: sign of '", name, "' in '", path, "'");
    if (sign == H5T_SGN_NONE) {
      if (size == 1) return DType::kUInt8;
      if (size == 2) return DType::kInt32;
      if (size == 4) return DType::kInt64;
    } else {
      if (size <= 4) return DType::kInt32;
      if (size == 8) return DType::kInt64;
    }
    TANDEM_THROW("data::hdf5: dataset '", name, "' in '", path, "' holds ",
                 sign == H5T_SGN_NONE ? "unsigned" : "signed", " ", size * 8,
                 "-bit integers, which no Tandem dtype holds exactly");
  }
  TANDEM_THROW("data::hdf5: dataset '", name, "' in '", path, "' holds neither integers nor ",
               "floating-point numbers (HDF5 type class ", static_cast<int>(type_class),
               "); data::hdf5 reads numeric datasets");
}

hid_t memory_type(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return H5T_NATIVE_FLOAT;
    case DType::kFloat64:
      return H5T_NATIVE_DOUBLE;
    case DType::kInt32:
      return H5T_NATIVE_INT32;
    case DType::kInt64:
      return H5T_NATIVE_INT64;
    case DType::kUInt8:
      return H5T_NATIVE_UINT8;
    case DType::kBool:
      break;
  }
  TANDEM_THROW("data::hdf5: no HDF5 memory type for ", dtype);
}

/// The largest size ratio of HDF5's compression filters (deflate: 1032:1), as for checkpoints.
/// A compressed dataset may declare more bytes than its file holds, but never more than this
/// many times as many.
constexpr uint64_t kMaxCompressionRatio = 1032;

/// Raises naming the dataset and its file when its declared shape (of `element_bytes`-byte
/// elements in the file) needs bytes that the file does not hold. A contiguous dataset must
/// store exactly that many: HDF5 reads past a shorter one without complaint, returning whatever
/// lies beyond (zeros, other objects). A chunked one may not declare more than its file holds
/// (1032 times more when compressed). Damaged extents would otherwise surface as absurd
/// allocations, or as garbage or errors hours into a run.
void check_stored_size(const Handle& file, const Handle& dataset, const std::string& path,
                       const std::string& name, const Shape& shape, size_t element_bytes) {
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
  Handle dcpl(TANDEM_H5_CHECK(H5Dget_create_plist(dataset.get()), "data::hdf5: properties of '",
                              name, "' in '", path, "'"),
              H5Pclose);
  const H5D_layout_t layout = TANDEM_H5_CHECK(H5Pget_layout(dcpl.get()), "data::hdf5: layout of '",
                                              name, "' in '", path, "'");
  const int external =
      TANDEM_H5_CHECK(H5Pget_external_count(dcpl.get()), "data::hdf5: external files of '", name,
                      "' in '", path, "'");
  // Virtual datasets and external storage keep their data in other files.
  if (layout == H5D_VIRTUAL || external > 0) return;
  if (layout == H5D_CONTIGUOUS) {
    const hsize_t stored = H5Dget_storage_size(dataset.get());  // 0 also when never written
    TANDEM_CHECK(stored == declared, "data::hdf5: dataset '", name, "' in '", path,
                 "' declares shape ", shape, " of ", element_bytes, "-byte elements (", declared,
                 " bytes) but stores ", stored, " bytes; the file is damaged (or the dataset ",
                 "was never written)");
    return;
  }
  hsize_t file_bytes = 0;
  TANDEM_H5_CHECK(H5Fget_filesize(file.get(), &file_bytes), "data::hdf5: size of '", path, "'");
  const int filters = TANDEM_H5_CHECK(H5Pget_nfilters(dcpl.get()), "data::hdf5: filters of '", name,
                                      "' in '", path, "'");
  bool compressed = false;
  for (int i = 0; i < filters; ++i) {
    unsigned flags = 0, config = 0;
    size_t values = 0;
    const H5Z_filter_t filter = H5Pget_filter2(dcpl.get(), static_cast<unsigned>(i), &flags,
                                               &values, nullptr, 0, nullptr, &config);
    if (filter < 0) H5Eclear2(H5E_DEFAULT);
    compressed = compressed || filter != H5Z_FILTER_FLETCHER32;
  }
  uint64_t limit = file_bytes;
  if (compressed && __builtin_mul_overflow(limit, kMaxCompressionRatio, &limit))
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

DatasetInfo inspect(const Handle& file, const std::string& path, const std::string& name) {
  Handle dataset = open_dataset(file, path, name);
  Handle space(TANDEM_H5_CHECK(H5Dget_space(dataset.get()), "data::hdf5: dataspace of '", name,
                               "' in '", path, "'"),
               H5Sclose);
  const int rank = TANDEM_H5_CHECK(H5Sget_simple_extent_ndims(space.get()), "data::hdf5: rank of '",
                                   name, "' in '", path, "'");
  TANDEM_CHECK(rank >= 1, "data::hdf5: dataset '", name, "' in '", path, "' is a scalar; ",
               "data::hdf5 reads arrays of shape [examples, ...]");
  std::vector<hsize_t> dims(static_cast<size_t>(rank));
  TANDEM_H5_CHECK(H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr),
                  "data::hdf5: dimensions of '", name, "' in '", path, "'");
  Handle type(TANDEM_H5_CHECK(H5Dget_type(dataset.get()), "data::hdf5: type of '", name, "' in '",
                              path, "'"),
              H5Tclose);
  DatasetInfo info;
  for (hsize_t d : dims) {
    TANDEM_CHECK(d <= static_cast<hsize_t>(std::numeric_limits<int64_t>::max()),
                 "data::hdf5: dataset '", name, "' in '", path, "' declares an extent of ", d,
                 " elements; the file is damaged");
    info.dims.push_back(static_cast<int64_t>(d));
  }
  info.dtype = dtype_for(type.get(), path, name);
  check_stored_size(file, dataset, path, name, Shape(info.dims), H5Tget_size(type.get()));
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
      Handle file = open_file(path);
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
      file_ = open_file(source_->files_[f]);
      for (const std::string& name : source_->names_)
        datasets_.push_back(open_dataset(file_, source_->files_[f], name));
      file_index_ = static_cast<int64_t>(f);
    }
    silence_hdf5_printing();
    chunk_begin_ = -1;  // invalid until every dataset is read
    for (size_t c = 0; c < datasets_.size(); ++c) read_rows(c, start, count);
    chunk_begin_ = offsets[f] + start;
    chunk_rows_ = count;
    return index - chunk_begin_;
  }

  void read_rows(size_t c, int64_t start, int64_t count) {
    const std::string& path = source_->files_[static_cast<size_t>(file_index_)];
    const std::string& name = source_->names_[c];
    chunks_[c].resize(static_cast<size_t>(count) * source_->row_bytes_[c]);
    if (chunks_[c].empty()) return;
    const Shape& row_shape = source_->row_shapes_[c];
    std::vector<hsize_t> offset(static_cast<size_t>(row_shape.rank()) + 1, 0);
    std::vector<hsize_t> extent{static_cast<hsize_t>(count)};
    for (int64_t d : row_shape) extent.push_back(static_cast<hsize_t>(d));
    offset[0] = static_cast<hsize_t>(start);
    Handle file_space(TANDEM_H5_CHECK(H5Dget_space(datasets_[c].get()),
                                      "data::hdf5: ", "dataspace of '", name, "' in '", path, "'"),
                      H5Sclose);
    TANDEM_H5_CHECK(H5Sselect_hyperslab(file_space.get(), H5S_SELECT_SET, offset.data(), nullptr,
                                        extent.data(), nullptr),
                    "data::hdf5: selecting rows ", start, "..", start + count, " of '", name,
                    "' in '", path, "'");
    Handle memory_space(
        TANDEM_H5_CHECK(H5Screate_simple(static_cast<int>(extent.size()), extent.data(), nullptr),
                        "data::hdf5: memory dataspace for '", name, "'"),
        H5Sclose);
    TANDEM_H5_CHECK(H5Dread(datasets_[c].get(), memory_type(source_->dtypes_[c]),
                            memory_space.get(), file_space.get(), H5P_DEFAULT, chunks_[c].data()),
                    "data::hdf5: reading rows ", start, "..", start + count, " of '", name,
                    "' in '", path, "'");
  }

  void copy_row(size_t c, int64_t row, void* dst) const {
    const size_t n = source_->row_bytes_[c];
    if (n > 0) std::memcpy(dst, chunks_[c].data() + static_cast<size_t>(row) * n, n);
  }

  std::shared_ptr<const Hdf5Source> source_;
  int64_t file_index_ = -1;
  Handle file_;
  std::vector<Handle> datasets_;
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
