// The only file of the checkpoint layer that includes hdf5.h. Every HDF5 call goes through
// TANDEM_H5_CHECK, which raises tandem::Error with the file, the object and HDF5's own message.
#include "tandem/checkpoint/hdf5_file.h"

#include <fcntl.h>
#include <hdf5.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>

#include "tandem/core/error.h"

namespace tandem::h5 {

namespace {

// HDF5 prints its error stack to stderr by default; Tandem reports errors itself. In a
// thread-safe HDF5 build the setting is per thread (checkpoints may be written from a replica
// thread), so every thread turns it off once.
void silence_hdf5() {
  thread_local bool silenced = false;
  if (!silenced) {
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
    silenced = true;
  }
}

herr_t collect_messages(unsigned, const H5E_error2_t* err, void* data) {
  if (err->desc != nullptr && err->desc[0] != '\0')
    static_cast<std::vector<std::string>*>(data)->push_back(err->desc);
  return 0;
}

// HDF5's reason: the message of the API call and, when it differs, the innermost one, which
// says what actually failed ("can't read data: data error detected by Fletcher32 checksum").
std::string hdf5_message() {
  std::vector<std::string> messages;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_DOWNWARD, collect_messages, &messages);
  H5Eclear2(H5E_DEFAULT);
  if (messages.empty()) return "unknown HDF5 error";
  if (messages.size() == 1 || messages.back() == messages.front()) return messages.front();
  return messages.front() + ": " + messages.back();
}

/// Points the descriptor of the file holding `object` at /dev/null: the writes HDF5 still has
/// to make to it then succeed and go nowhere (a scratch file would hit the same full disk or
/// file size limit). Used only once writing the
/// file has failed (a full disk, a file size limit): otherwise closing its objects fails half-
/// way, their ids stay registered and HDF5's shutdown at exit crashes on them. The caller
/// deletes the incomplete file.
void drop_pending_writes(hid_t object) {
  const hid_t file = H5Iget_file_id(object);
  void* vfd = nullptr;
  if (file >= 0 && H5Fget_vfd_handle(file, H5P_DEFAULT, &vfd) >= 0 && vfd != nullptr) {
    const int fd = *static_cast<int*>(vfd);  // the default (sec2) driver's handle
    const int scratch = ::open("/dev/null", O_WRONLY | O_CLOEXEC);
    if (scratch >= 0) {
      ::dup2(scratch, fd);
      ::close(scratch);
    }
  }
  if (file >= 0) H5Fclose(file);  // the reference H5Iget_file_id added
  H5Eclear2(H5E_DEFAULT);
}

/// Closes a dataset; returns "" or why writing its buffered chunks failed. They are written
/// first (H5Dflush), while the dataset is intact: if that fails, they are dropped, so that the
/// close still releases the id.
std::string close_dataset(hid_t id) {
  std::string why;
  if (H5Dflush(id) < 0) {
    why = hdf5_message();
    drop_pending_writes(id);
  }
  if (H5Dclose(id) < 0 && why.empty()) why = hdf5_message();
  H5Eclear2(H5E_DEFAULT);
  return why;
}

herr_t close_id(hid_t id) {
  switch (H5Iget_type(id)) {
    case H5I_FILE:
      return H5Fclose(id);
    case H5I_GROUP:
      return H5Gclose(id);
    case H5I_DATASET:
      return close_dataset(id).empty() ? 0 : -1;
    case H5I_DATASPACE:
      return H5Sclose(id);
    case H5I_DATATYPE:
      return H5Tclose(id);
    case H5I_ATTR:
      return H5Aclose(id);
    case H5I_GENPROP_LST:
      return H5Pclose(id);
    default:
      return H5Idec_ref(id);
  }
}

}  // namespace

#define TANDEM_H5_CHECK(expr, ...)                                       \
  [&]() {                                                                \
    silence_hdf5();                                                      \
    auto tandem_h5_result = (expr);                                      \
    if (tandem_h5_result < 0) [[unlikely]]                               \
      TANDEM_THROW(__VA_ARGS__, ": ", hdf5_message(), " (", #expr, ")"); \
    return tandem_h5_result;                                             \
  }()

Handle::~Handle() {
  // Destructors never throw: a failed close here is dropped (close() reports errors).
  if (id_ >= 0 && close_id(id_) < 0) H5Eclear2(H5E_DEFAULT);
}

Handle& Handle::operator=(Handle&& other) noexcept {
  if (this != &other) {
    Handle dying(id_);
    id_ = other.id_;
    other.id_ = -1;
  }
  return *this;
}

void Handle::close() {
  if (id_ < 0) return;
  const int64_t id = id_;
  id_ = -1;
  silence_hdf5();
  if (H5Iget_type(id) == H5I_DATASET) {
    const std::string why = close_dataset(id);
    TANDEM_CHECK(why.empty(), "closing an HDF5 dataset: ", why);
    return;
  }
  TANDEM_H5_CHECK(close_id(id), "closing an HDF5 object");
}

namespace {

hid_t file_type_of(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return H5T_IEEE_F32LE;
    case DType::kFloat64:
      return H5T_IEEE_F64LE;
    case DType::kInt32:
      return H5T_STD_I32LE;
    case DType::kInt64:
      return H5T_STD_I64LE;
    case DType::kUInt8:
      return H5T_STD_U8LE;
    case DType::kBool:
      return H5T_STD_U8LE;
  }
  return H5T_IEEE_F32LE;
}

hid_t memory_type_of(DType dtype) {
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
      return H5T_NATIVE_UINT8;
  }
  return H5T_NATIVE_FLOAT;
}

Handle make_space(const Shape& shape) {
  if (shape.rank() == 0) return Handle(TANDEM_H5_CHECK(H5Screate(H5S_SCALAR), "dataspace"));
  std::vector<hsize_t> dims(shape.dims().begin(), shape.dims().end());
  return Handle(TANDEM_H5_CHECK(
      H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr), "dataspace"));
}

// Link creation that makes missing intermediate groups ("m/dense/kernel:0" creates m, m/dense).
Handle intermediate_groups_lcpl() {
  Handle lcpl(TANDEM_H5_CHECK(H5Pcreate(H5P_LINK_CREATE), "link creation properties"));
  TANDEM_H5_CHECK(H5Pset_create_intermediate_group(lcpl.id(), 1), "link creation properties");
  return lcpl;
}

// The shape a dataspace declares. A damaged header can declare anything: extents beyond int64
// raise here, naming the object.
Shape shape_of_space(hid_t space, const std::string& where) {
  const int rank = TANDEM_H5_CHECK(H5Sget_simple_extent_ndims(space), "rank of ", where);
  std::vector<hsize_t> dims(static_cast<size_t>(rank));
  if (rank > 0)
    TANDEM_H5_CHECK(H5Sget_simple_extent_dims(space, dims.data(), nullptr), "extent of ", where);
  std::vector<int64_t> out;
  for (hsize_t d : dims) {
    TANDEM_CHECK(d <= static_cast<hsize_t>(std::numeric_limits<int64_t>::max()), where,
                 ": declares an extent of ", d, " elements; the file is damaged");
    out.push_back(static_cast<int64_t>(d));
  }
  return Shape(out);
}

/// The largest size ratio of HDF5's compression filters (deflate: 1032:1). A compressed dataset
/// may declare more bytes than the file holds, but never more than this many times as many.
constexpr hsize_t kMaxCompressionRatio = 1032;

/// Raises naming the dataset when reading all of it (`element_bytes` per element in memory)
/// would need more bytes than its file could hold: its declared shape is damaged, and
/// allocating for it would cost gigabytes before HDF5 fails.
void check_declared_size(hid_t set, const Shape& shape, size_t element_bytes,
                         const std::string& where) {
  hsize_t bytes = element_bytes;
  bool overflow = false;
  for (int64_t d : shape.dims())
    overflow = overflow || __builtin_mul_overflow(bytes, static_cast<hsize_t>(d), &bytes);
  Handle file(TANDEM_H5_CHECK(H5Iget_file_id(set), "file of ", where));
  hsize_t file_bytes = 0;
  TANDEM_H5_CHECK(H5Fget_filesize(file.id(), &file_bytes), "size of the file of ", where);
  Handle dcpl(TANDEM_H5_CHECK(H5Dget_create_plist(set), "creation properties of ", where));
  const int filters = TANDEM_H5_CHECK(H5Pget_nfilters(dcpl.id()), "filters of ", where);
  bool compressed = false;
  for (int i = 0; i < filters; ++i) {
    unsigned flags = 0, config = 0;
    size_t values = 0;
    const H5Z_filter_t filter = H5Pget_filter2(dcpl.id(), static_cast<unsigned>(i), &flags, &values,
                                               nullptr, 0, nullptr, &config);
    if (filter < 0) H5Eclear2(H5E_DEFAULT);
    compressed = compressed || filter != H5Z_FILTER_FLETCHER32;
  }
  hsize_t limit = file_bytes;
  if (compressed && __builtin_mul_overflow(file_bytes, kMaxCompressionRatio, &limit))
    limit = std::numeric_limits<hsize_t>::max();
  TANDEM_CHECK(!overflow && bytes <= limit, where, ": declares shape ", shape, " (",
               overflow ? std::string("more than 2^64") : std::to_string(bytes),
               " bytes), more than its file of ", file_bytes,
               " bytes can hold; the file is damaged");
}

/// Dataset creation properties that give every dataset a checksum (see write_tensor).
constexpr hsize_t kChunkBytes = hsize_t{16} << 20;

Handle dataset_properties(const Shape& shape, size_t element_bytes) {
  Handle dcpl(TANDEM_H5_CHECK(H5Pcreate(H5P_DATASET_CREATE), "dataset creation properties"));
  if (shape.rank() == 0) {
    // A scalar cannot be chunked (so cannot take a filter); compact layout keeps its value in
    // the object header, whose v2 format (files of HDF5 1.8 and newer) carries a checksum.
    TANDEM_H5_CHECK(H5Pset_layout(dcpl.id(), H5D_COMPACT), "dataset creation properties");
    return dcpl;
  }
  if (shape.numel() == 0) return dcpl;  // no data to protect; the shape is in the header
  // One chunk for the whole dataset up to kChunkBytes (halving leading extents beyond it):
  // the filter buffer HDF5 allocates per chunk stays bounded.
  std::vector<hsize_t> chunk(shape.dims().begin(), shape.dims().end());
  auto chunk_bytes = [&] {
    hsize_t bytes = element_bytes;
    for (hsize_t c : chunk) bytes *= c;
    return bytes;
  };
  for (size_t axis = 0; axis < chunk.size(); ++axis)
    while (chunk_bytes() > kChunkBytes && chunk[axis] > 1) chunk[axis] = (chunk[axis] + 1) / 2;
  TANDEM_H5_CHECK(H5Pset_chunk(dcpl.id(), static_cast<int>(chunk.size()), chunk.data()),
                  "dataset creation properties");
  TANDEM_H5_CHECK(H5Pset_fletcher32(dcpl.id()), "dataset creation properties");
  return dcpl;
}

}  // namespace

std::string Group::where(const std::string& name) const {
  return file_ + ":" + (path_ == "/" ? "" : path_) + "/" + name;
}

Group Group::create_group(const std::string& name) const {
  hid_t id =
      TANDEM_H5_CHECK(H5Gcreate2(handle_.id(), name.c_str(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
                      "creating group ", where(name));
  return Group(Handle(id), file_, path_ == "/" ? "/" + name : path_ + "/" + name);
}

Group Group::open_group(const std::string& name) const {
  TANDEM_CHECK(exists(name), where(name), ": group not found");
  hid_t id = TANDEM_H5_CHECK(H5Gopen2(handle_.id(), name.c_str(), H5P_DEFAULT), "opening group ",
                             where(name));
  return Group(Handle(id), file_, path_ == "/" ? "/" + name : path_ + "/" + name);
}

bool Group::exists(const std::string& name) const {
  silence_hdf5();
  // Check each component: H5Lexists fails (not false) when an intermediate link is missing.
  size_t start = 0;
  while (start <= name.size()) {
    const size_t slash = name.find('/', start);
    const std::string prefix = name.substr(0, slash);
    if (!prefix.empty() && H5Lexists(handle_.id(), prefix.c_str(), H5P_DEFAULT) <= 0) {
      H5Eclear2(H5E_DEFAULT);
      return false;
    }
    if (slash == std::string::npos) break;
    start = slash + 1;
  }
  return true;
}

Group Group::require_group(const std::string& name) const {
  if (exists(name)) return open_group(name);
  Handle lcpl = intermediate_groups_lcpl();
  hid_t id =
      TANDEM_H5_CHECK(H5Gcreate2(handle_.id(), name.c_str(), lcpl.id(), H5P_DEFAULT, H5P_DEFAULT),
                      "creating group ", where(name));
  return Group(Handle(id), file_, path_ == "/" ? "/" + name : path_ + "/" + name);
}

bool Group::is_dataset(const std::string& name) const {
  if (!exists(name)) return false;
  // H5Oopen + H5Iget_type works the same on HDF5 1.10, 1.12 and 1.14 (H5Oget_info does not).
  Handle object(
      TANDEM_H5_CHECK(H5Oopen(handle_.id(), name.c_str(), H5P_DEFAULT), "opening ", where(name)));
  return H5Iget_type(object.id()) == H5I_DATASET;
}

std::vector<std::string> Group::children() const {
  std::vector<std::string> names;
  auto collect = [](hid_t, const char* name, const H5L_info_t*, void* data) -> herr_t {
    static_cast<std::vector<std::string>*>(data)->push_back(name);
    return 0;
  };
  hsize_t index = 0;
  TANDEM_H5_CHECK(H5Literate(handle_.id(), H5_INDEX_NAME, H5_ITER_INC, &index, collect, &names),
                  "listing ", file_, ":", path_);
  return names;
}

void Group::write_tensor(const std::string& name, const Tensor& tensor) const {
  const Tensor host = tensor.to(Device::cpu());
  Handle space = make_space(host.shape());
  Handle lcpl = intermediate_groups_lcpl();
  Handle dcpl = dataset_properties(host.shape(), dtype_size(host.dtype()));
  Handle set(TANDEM_H5_CHECK(H5Dcreate2(handle_.id(), name.c_str(), file_type_of(host.dtype()),
                                        space.id(), lcpl.id(), dcpl.id(), H5P_DEFAULT),
                             "creating dataset ", where(name)));
  if (host.numel() > 0) {
    TANDEM_H5_CHECK(H5Dwrite(set.id(), memory_type_of(host.dtype()), H5S_ALL, H5S_ALL, H5P_DEFAULT,
                             host.raw_data()),
                    "writing dataset ", where(name));
  }
  // Closing writes the buffered chunk: a full disk shows here.
  const std::string why = close_dataset(set.release());
  TANDEM_CHECK(why.empty(), "writing dataset ", where(name), ": ", why);
}

void Group::write_u64(const std::string& name, const std::vector<uint64_t>& values,
                      const Shape& shape) const {
  TANDEM_CHECK(static_cast<int64_t>(values.size()) == shape.numel(), where(name), ": ",
               values.size(), " values for shape ", shape);
  Handle space = make_space(shape);
  Handle lcpl = intermediate_groups_lcpl();
  Handle dcpl = dataset_properties(shape, sizeof(uint64_t));
  Handle set(TANDEM_H5_CHECK(H5Dcreate2(handle_.id(), name.c_str(), H5T_STD_U64LE, space.id(),
                                        lcpl.id(), dcpl.id(), H5P_DEFAULT),
                             "creating dataset ", where(name)));
  if (!values.empty())
    TANDEM_H5_CHECK(
        H5Dwrite(set.id(), H5T_NATIVE_UINT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data()),
        "writing dataset ", where(name));
  // Closing writes the buffered chunk: a full disk shows here.
  const std::string why = close_dataset(set.release());
  TANDEM_CHECK(why.empty(), "writing dataset ", where(name), ": ", why);
}

namespace {

DType dtype_of_type(hid_t type, const std::string& where) {
  const H5T_class_t cls = H5Tget_class(type);
  const size_t size = H5Tget_size(type);
  if (cls == H5T_FLOAT && size == 4) return DType::kFloat32;
  if (cls == H5T_FLOAT && size == 8) return DType::kFloat64;
  if (cls == H5T_INTEGER) {
    const bool is_signed = H5Tget_sign(type) == H5T_SGN_2;
    if (size == 1 && !is_signed) return DType::kUInt8;
    if (size == 4 && is_signed) return DType::kInt32;
    if (size == 8) return DType::kInt64;  // uint64 is read as its int64 bit pattern
  }
  TANDEM_THROW(where, ": unsupported element type (class ", static_cast<int>(cls), ", ", size,
               " bytes)");
}

}  // namespace

DType Group::dataset_dtype(const std::string& name) const {
  TANDEM_CHECK(exists(name), where(name), ": dataset not found");
  Handle set(TANDEM_H5_CHECK(H5Dopen2(handle_.id(), name.c_str(), H5P_DEFAULT), "opening dataset ",
                             where(name)));
  Handle type(TANDEM_H5_CHECK(H5Dget_type(set.id()), "type of ", where(name)));
  return dtype_of_type(type.id(), where(name));
}

std::string Group::dataset_type_name(const std::string& name) const {
  TANDEM_CHECK(exists(name), where(name), ": dataset not found");
  Handle set(TANDEM_H5_CHECK(H5Dopen2(handle_.id(), name.c_str(), H5P_DEFAULT), "opening dataset ",
                             where(name)));
  Handle type(TANDEM_H5_CHECK(H5Dget_type(set.id()), "type of ", where(name)));
  const size_t bits = 8 * H5Tget_size(type.id());
  switch (H5Tget_class(type.id())) {
    case H5T_FLOAT:
      return "float" + std::to_string(bits);
    case H5T_INTEGER:
      return (H5Tget_sign(type.id()) == H5T_SGN_2 ? "int" : "uint") + std::to_string(bits);
    case H5T_STRING:
      return "string";
    default:
      return "other(" + std::to_string(bits) + " bits)";
  }
}

Shape Group::dataset_shape(const std::string& name) const {
  TANDEM_CHECK(exists(name), where(name), ": dataset not found");
  Handle set(TANDEM_H5_CHECK(H5Dopen2(handle_.id(), name.c_str(), H5P_DEFAULT), "opening dataset ",
                             where(name)));
  Handle space(TANDEM_H5_CHECK(H5Dget_space(set.id()), "dataspace of ", where(name)));
  return shape_of_space(space.id(), where(name));
}

int64_t Group::read_scalar_int64(const std::string& name) const {
  const Shape shape = dataset_shape(name);
  TANDEM_CHECK(shape.numel() == 1, where(name), ": expected one value (a scalar), found shape ",
               shape);
  return read_tensor(name).to_vector<int64_t>()[0];
}

double Group::read_scalar_float64(const std::string& name) const {
  const Shape shape = dataset_shape(name);
  TANDEM_CHECK(shape.numel() == 1, where(name), ": expected one value (a scalar), found shape ",
               shape);
  return read_tensor(name).to_vector<double>()[0];
}

bool Group::has_checksum(const std::string& name) const {
  TANDEM_CHECK(exists(name), where(name), ": dataset not found");
  Handle set(TANDEM_H5_CHECK(H5Dopen2(handle_.id(), name.c_str(), H5P_DEFAULT), "opening dataset ",
                             where(name)));
  Handle dcpl(
      TANDEM_H5_CHECK(H5Dget_create_plist(set.id()), "creation properties of ", where(name)));
  unsigned flags = 0, config = 0;
  size_t values = 0;
  const herr_t found = H5Pget_filter_by_id2(dcpl.id(), H5Z_FILTER_FLETCHER32, &flags, &values,
                                            nullptr, 0, nullptr, &config);
  if (found < 0) H5Eclear2(H5E_DEFAULT);
  return found >= 0;
}

void Group::remove(const std::string& name) const {
  TANDEM_CHECK(exists(name), where(name), ": not found");
  TANDEM_H5_CHECK(H5Ldelete(handle_.id(), name.c_str(), H5P_DEFAULT), "deleting ", where(name));
}

Tensor Group::read_tensor(const std::string& name) const {
  const Shape shape = dataset_shape(name);
  return read_rows(name, 0, shape.rank() == 0 ? 1 : shape[0]);
}

Tensor Group::read_rows(const std::string& name, int64_t start, int64_t count) const {
  TANDEM_CHECK(exists(name), where(name), ": dataset not found");
  Handle set(TANDEM_H5_CHECK(H5Dopen2(handle_.id(), name.c_str(), H5P_DEFAULT), "opening dataset ",
                             where(name)));
  Handle type(TANDEM_H5_CHECK(H5Dget_type(set.id()), "type of ", where(name)));
  const DType dtype = dtype_of_type(type.id(), where(name));
  Handle space(TANDEM_H5_CHECK(H5Dget_space(set.id()), "dataspace of ", where(name)));
  const Shape full = shape_of_space(space.id(), where(name));
  check_declared_size(set.id(), full, dtype_size(dtype), where(name));
  if (full.rank() == 0) {
    Tensor out = Tensor::empty(Shape{}, dtype);
    TANDEM_H5_CHECK(
        H5Dread(set.id(), memory_type_of(dtype), H5S_ALL, H5S_ALL, H5P_DEFAULT, out.raw_data()),
        "reading ", where(name));
    return out;
  }
  TANDEM_CHECK(start >= 0 && count >= 0 && start + count <= full[0], where(name), ": rows [", start,
               ", ", start + count, ") are outside its shape ", full);
  Shape out_shape = full;
  out_shape[0] = count;
  Tensor out = Tensor::empty(out_shape, dtype);
  if (count == 0 || out.numel() == 0) return out;
  std::vector<hsize_t> offset(static_cast<size_t>(full.rank()), 0);
  std::vector<hsize_t> extent(out_shape.dims().begin(), out_shape.dims().end());
  offset[0] = static_cast<hsize_t>(start);
  TANDEM_H5_CHECK(H5Sselect_hyperslab(space.id(), H5S_SELECT_SET, offset.data(), nullptr,
                                      extent.data(), nullptr),
                  "selecting rows of ", where(name));
  Handle memory = make_space(out_shape);
  TANDEM_H5_CHECK(H5Dread(set.id(), memory_type_of(dtype), memory.id(), space.id(), H5P_DEFAULT,
                          out.raw_data()),
                  "reading ", where(name));
  return out;
}

std::vector<uint64_t> Group::read_u64(const std::string& name) const {
  const Shape shape = dataset_shape(name);
  Handle set(TANDEM_H5_CHECK(H5Dopen2(handle_.id(), name.c_str(), H5P_DEFAULT), "opening dataset ",
                             where(name)));
  check_declared_size(set.id(), shape, sizeof(uint64_t), where(name));
  std::vector<uint64_t> values(static_cast<size_t>(shape.numel()));
  if (!values.empty())
    TANDEM_H5_CHECK(
        H5Dread(set.id(), H5T_NATIVE_UINT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data()),
        "reading ", where(name));
  return values;
}

void Group::write_attr(const std::string& name, const std::string& value) const {
  Handle type(TANDEM_H5_CHECK(H5Tcopy(H5T_C_S1), "string type"));
  TANDEM_H5_CHECK(H5Tset_size(type.id(), H5T_VARIABLE), "string type");
  TANDEM_H5_CHECK(H5Tset_cset(type.id(), H5T_CSET_UTF8), "string type");
  Handle space(TANDEM_H5_CHECK(H5Screate(H5S_SCALAR), "dataspace"));
  Handle attr(TANDEM_H5_CHECK(
      H5Acreate2(handle_.id(), name.c_str(), type.id(), space.id(), H5P_DEFAULT, H5P_DEFAULT),
      "creating attribute ", where(name)));
  const char* text = value.c_str();
  TANDEM_H5_CHECK(H5Awrite(attr.id(), type.id(), &text), "writing attribute ", where(name));
  attr.close();
}

void Group::write_attr(const std::string& name, int64_t value) const {
  Handle space(TANDEM_H5_CHECK(H5Screate(H5S_SCALAR), "dataspace"));
  Handle attr(TANDEM_H5_CHECK(
      H5Acreate2(handle_.id(), name.c_str(), H5T_STD_I64LE, space.id(), H5P_DEFAULT, H5P_DEFAULT),
      "creating attribute ", where(name)));
  TANDEM_H5_CHECK(H5Awrite(attr.id(), H5T_NATIVE_INT64, &value), "writing attribute ", where(name));
  attr.close();
}

void Group::write_attr(const std::string& name, const std::vector<std::string>& values) const {
  Handle type(TANDEM_H5_CHECK(H5Tcopy(H5T_C_S1), "string type"));
  TANDEM_H5_CHECK(H5Tset_size(type.id(), H5T_VARIABLE), "string type");
  TANDEM_H5_CHECK(H5Tset_cset(type.id(), H5T_CSET_UTF8), "string type");
  const hsize_t n = values.size();
  Handle space(TANDEM_H5_CHECK(H5Screate_simple(1, &n, nullptr), "dataspace"));
  Handle attr(TANDEM_H5_CHECK(
      H5Acreate2(handle_.id(), name.c_str(), type.id(), space.id(), H5P_DEFAULT, H5P_DEFAULT),
      "creating attribute ", where(name)));
  std::vector<const char*> texts;
  for (const std::string& v : values) texts.push_back(v.c_str());
  if (!texts.empty())
    TANDEM_H5_CHECK(H5Awrite(attr.id(), type.id(), texts.data()), "writing attribute ",
                    where(name));
  attr.close();
}

void Group::write_attr_of(const std::string& object, const std::string& name,
                          const std::string& value) const {
  TANDEM_CHECK(exists(object), where(object), ": not found");
  Handle type(TANDEM_H5_CHECK(H5Tcopy(H5T_C_S1), "string type"));
  TANDEM_H5_CHECK(H5Tset_size(type.id(), H5T_VARIABLE), "string type");
  TANDEM_H5_CHECK(H5Tset_cset(type.id(), H5T_CSET_UTF8), "string type");
  Handle space(TANDEM_H5_CHECK(H5Screate(H5S_SCALAR), "dataspace"));
  Handle attr(
      TANDEM_H5_CHECK(H5Acreate_by_name(handle_.id(), object.c_str(), name.c_str(), type.id(),
                                        space.id(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
                      "creating attribute ", name, " of ", where(object)));
  const char* text = value.c_str();
  TANDEM_H5_CHECK(H5Awrite(attr.id(), type.id(), &text), "writing attribute ", name, " of ",
                  where(object));
  attr.close();
}

std::optional<std::string> Group::read_attr_string_of(const std::string& object,
                                                      const std::string& name) const {
  TANDEM_CHECK(exists(object), where(object), ": not found");
  const htri_t present = H5Aexists_by_name(handle_.id(), object.c_str(), name.c_str(), H5P_DEFAULT);
  if (present <= 0) {
    H5Eclear2(H5E_DEFAULT);
    return std::nullopt;
  }
  Handle opened(TANDEM_H5_CHECK(H5Oopen(handle_.id(), object.c_str(), H5P_DEFAULT), "opening ",
                                where(object)));
  const std::string object_path = path_ == "/" ? "/" + object : path_ + "/" + object;
  return Group(std::move(opened), file_, object_path).read_attr_string(name);
}

bool Group::has_attr(const std::string& name) const {
  const htri_t result = H5Aexists(handle_.id(), name.c_str());
  if (result < 0) H5Eclear2(H5E_DEFAULT);
  return result > 0;
}

void Group::remove_attr(const std::string& name) const {
  TANDEM_CHECK(has_attr(name), where(name), ": attribute not found");
  TANDEM_H5_CHECK(H5Adelete(handle_.id(), name.c_str()), "deleting attribute ", where(name));
}

std::string Group::read_attr_string(const std::string& name) const {
  const std::vector<std::string> values = read_attr_strings(name);
  TANDEM_CHECK(values.size() == 1, where(name), ": expected one string, found ", values.size());
  return values[0];
}

int64_t Group::read_attr_int64(const std::string& name) const {
  TANDEM_CHECK(has_attr(name), where(name), ": attribute not found");
  Handle attr(TANDEM_H5_CHECK(H5Aopen(handle_.id(), name.c_str(), H5P_DEFAULT),
                              "opening attribute ", where(name)));
  Handle type(TANDEM_H5_CHECK(H5Aget_type(attr.id()), "type of ", where(name)));
  TANDEM_CHECK(H5Tget_class(type.id()) == H5T_INTEGER, where(name), ": not an integer");
  int64_t value = 0;
  TANDEM_H5_CHECK(H5Aread(attr.id(), H5T_NATIVE_INT64, &value), "reading attribute ", where(name));
  return value;
}

std::vector<std::string> Group::read_attr_strings(const std::string& name) const {
  TANDEM_CHECK(has_attr(name), where(name), ": attribute not found");
  Handle attr(TANDEM_H5_CHECK(H5Aopen(handle_.id(), name.c_str(), H5P_DEFAULT),
                              "opening attribute ", where(name)));
  Handle type(TANDEM_H5_CHECK(H5Aget_type(attr.id()), "type of ", where(name)));
  TANDEM_CHECK(H5Tget_class(type.id()) == H5T_STRING, where(name), ": not a string attribute");
  Handle space(TANDEM_H5_CHECK(H5Aget_space(attr.id()), "dataspace of ", where(name)));
  const hssize_t n = H5Sget_simple_extent_npoints(space.id());
  std::vector<std::string> out;
  if (n <= 0) return out;
  {
    // Bound the allocation by the file's size: every string takes at least a byte in it.
    Handle file(TANDEM_H5_CHECK(H5Iget_file_id(attr.id()), "file of ", where(name)));
    hsize_t file_bytes = 0;
    TANDEM_H5_CHECK(H5Fget_filesize(file.id(), &file_bytes), "size of the file of ", where(name));
    const hsize_t per_string = H5Tis_variable_str(type.id()) > 0 ? 1 : H5Tget_size(type.id());
    TANDEM_CHECK(static_cast<hsize_t>(n) <= file_bytes / std::max<hsize_t>(per_string, 1),
                 where(name), ": declares ", n, " strings, more than its file of ", file_bytes,
                 " bytes can hold; the file is damaged");
  }
  if (H5Tis_variable_str(type.id()) > 0) {
    Handle memtype(TANDEM_H5_CHECK(H5Tcopy(H5T_C_S1), "string type"));
    TANDEM_H5_CHECK(H5Tset_size(memtype.id(), H5T_VARIABLE), "string type");
    TANDEM_H5_CHECK(H5Tset_cset(memtype.id(), H5Tget_cset(type.id())), "string type");
    std::vector<char*> texts(static_cast<size_t>(n), nullptr);
    TANDEM_H5_CHECK(H5Aread(attr.id(), memtype.id(), texts.data()), "reading attribute ",
                    where(name));
    for (char* t : texts) out.emplace_back(t ? t : "");
    H5Dvlen_reclaim(memtype.id(), space.id(), H5P_DEFAULT, texts.data());
  } else {
    const size_t size = H5Tget_size(type.id());
    std::vector<char> buffer(size * static_cast<size_t>(n));
    TANDEM_H5_CHECK(H5Aread(attr.id(), type.id(), buffer.data()), "reading attribute ",
                    where(name));
    for (hssize_t i = 0; i < n; ++i) {
      const char* begin = buffer.data() + static_cast<size_t>(i) * size;
      out.emplace_back(begin, strnlen(begin, size));
    }
  }
  return out;
}

File::File(Handle handle, std::string path) : file_(std::move(handle)), path_(std::move(path)) {
  hid_t root = TANDEM_H5_CHECK(H5Gopen2(file_.id(), "/", H5P_DEFAULT), path_, ": opening /");
  root_ = Group(Handle(root), path_, "/");
}

File File::create(const std::string& path) {
  silence_hdf5();
  // Strong close: H5Fclose then closes every object still open in the file, so that after
  // close() the file on disk is complete and may be fsynced and renamed.
  Handle fapl(TANDEM_H5_CHECK(H5Pcreate(H5P_FILE_ACCESS), "file access properties"));
  TANDEM_H5_CHECK(H5Pset_fclose_degree(fapl.id(), H5F_CLOSE_STRONG), "file access properties");
  // The 1.8 object format or newer: v2 object headers and superblock carry checksums, so the
  // metadata (shapes, attributes, compact scalars) is verified too. h5py and Keras read it.
  TANDEM_H5_CHECK(H5Pset_libver_bounds(fapl.id(), H5F_LIBVER_V18, H5F_LIBVER_LATEST),
                  "file access properties");
  hid_t id = TANDEM_H5_CHECK(H5Fcreate(path.c_str(), H5F_ACC_EXCL, H5P_DEFAULT, fapl.id()),
                             "creating HDF5 file ", path);
  return File(Handle(id), path);
}

namespace {

std::string file_kind(mode_t mode) {
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

/// Opens `path` read-only after checking, on the descriptor itself, that it is a regular file.
/// O_NONBLOCK: opening a FIFO must not wait for a writer. Returns the descriptor (>= 0).
int open_regular_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    const int error = errno;
    TANDEM_THROW(path, ": cannot open the file (missing or unreadable): ", std::strerror(error));
  }
  struct stat info {};
  const int result = ::fstat(fd, &info);
  const int error = errno;
  if (result != 0 || !S_ISREG(info.st_mode)) ::close(fd);
  TANDEM_CHECK(result == 0, path, ": cannot stat the file: ", std::strerror(error));
  TANDEM_CHECK(S_ISREG(info.st_mode), path, " is ", file_kind(info.st_mode),
               ", not a regular file; a checkpoint is a regular file");
  return fd;
}

bool has_hdf5_signature(int fd) {
  char signature[8] = {};
  size_t got = 0;
  while (got < sizeof(signature)) {
    const ssize_t n =
        ::pread(fd, signature + got, sizeof(signature) - got, static_cast<off_t>(got));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += static_cast<size_t>(n);
  }
  return got == sizeof(signature) && std::memcmp(signature, "\x89HDF\r\n\x1a\n", 8) == 0;
}

}  // namespace

void require_regular_file(const std::string& path) { ::close(open_regular_file(path)); }

bool is_hdf5(const std::string& path) {
  int fd = -1;
  try {
    fd = open_regular_file(path);
  } catch (const Error&) {
    return false;
  }
  const bool result = has_hdf5_signature(fd);
  ::close(fd);
  return result;
}

File File::open(const std::string& path) {
  silence_hdf5();
  const int fd = open_regular_file(path);
  const bool signature = has_hdf5_signature(fd);
  ::close(fd);
  TANDEM_CHECK(signature, path, ": not an HDF5 file (bad signature)");
  hid_t id = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  if (id < 0) TANDEM_THROW(path, ": damaged or truncated HDF5 file: ", hdf5_message());
  return File(Handle(id), path);
}

File File::open_for_update(const std::string& path) {
  silence_hdf5();
  const int fd = open_regular_file(path);
  const bool signature = has_hdf5_signature(fd);
  ::close(fd);
  TANDEM_CHECK(signature, path, ": not an HDF5 file (bad signature)");
  hid_t id = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  if (id < 0) TANDEM_THROW(path, ": cannot open for writing: ", hdf5_message());
  return File(Handle(id), path);
}

void File::flush() const {
  TANDEM_H5_CHECK(H5Fflush(file_.id(), H5F_SCOPE_GLOBAL), "flushing ", path_);
}

namespace {

/// Closes the file `id` and returns "" or HDF5's reason. HDF5 writes what it buffered when a
/// file closes; when that fails (a full disk, a file size limit) the close fails half-way, the
/// id stays registered, and HDF5's shutdown at exit crashes on it. So the buffers are flushed
/// first, while the file is intact; if that fails, the pending writes are worth nothing (the
/// caller deletes the incomplete file), so they are dropped (drop_pending_writes) and the close
/// then releases every id of the file.
std::string close_file_id(hid_t id) {
  silence_hdf5();
  std::string why;
  if (H5Fflush(id, H5F_SCOPE_LOCAL) < 0) {
    why = hdf5_message();
    drop_pending_writes(id);
  }
  if (H5Fclose(id) < 0 && why.empty()) why = hdf5_message();
  H5Eclear2(H5E_DEFAULT);
  return why;
}

}  // namespace

File::~File() {
  // Destructors never throw: a failed close is dropped here (close() reports it).
  root_ = Group();
  if (file_.valid()) close_file_id(file_.release());
}

void File::close() {
  // Close the root group first: HDF5 keeps a file open while objects in it are open.
  root_ = Group();
  if (!file_.valid()) return;
  const std::string why = close_file_id(file_.release());
  TANDEM_CHECK(why.empty(), "closing ", path_, ": ", why);
}

}  // namespace tandem::h5
