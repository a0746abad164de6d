// The HDF5 wrapper's datasets: checkpoints write and read tensors whole (Group::write_tensor,
// read_tensor, ...); the HDF5 dataset source reads rows in parts (Dataset). Every dataset
// Tandem writes carries a checksum (see Group::write_tensor).
#include <algorithm>
#include <limits>

#include "tandem/io/internal/hdf5_check.h"

namespace tandem::h5 {

// ---- shared by every dataset call ------------------------------------------------------------

hid_t detail::file_type_of(DType dtype) {
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
    case DType::kBFloat16:
    case DType::kFloat16:
      // Variables stay float32 under mixed precision (Keras writes them so too); a 16-bit
      // tensor has no HDF5 type in this libhdf5.
      TANDEM_THROW("HDF5: ", dtype, " tensors cannot be stored; cast them to float32 first");
  }
  return H5T_IEEE_F32LE;
}

hid_t detail::memory_type_of(DType dtype) {
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
    case DType::kBFloat16:
    case DType::kFloat16:
      // Variables stay float32 under mixed precision (Keras writes them so too); a 16-bit
      // tensor has no HDF5 type in this libhdf5.
      TANDEM_THROW("HDF5: ", dtype, " tensors cannot be stored; cast them to float32 first");
  }
  return H5T_NATIVE_FLOAT;
}

Handle detail::make_space(const Shape& shape) {
  if (shape.rank() == 0) return Handle(TANDEM_H5_CHECK(H5Screate(H5S_SCALAR), "dataspace"));
  std::vector<hsize_t> dims(shape.dims().begin(), shape.dims().end());
  return Handle(TANDEM_H5_CHECK(
      H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr), "dataspace"));
}

hsize_t detail::file_size_of(hid_t object, const std::string& context, const std::string& where) {
  Handle file(TANDEM_H5_CHECK(H5Iget_file_id(object), context, "file of ", where));
  hsize_t file_bytes = 0;
  TANDEM_H5_CHECK(H5Fget_filesize(file.id(), &file_bytes), context, "size of the file of ", where);
  return file_bytes;
}

bool detail::has_compression(hid_t dcpl, const std::string& context, const std::string& where) {
  const int filters = TANDEM_H5_CHECK(H5Pget_nfilters(dcpl), context, "filters of ", where);
  bool compressed = false;
  for (int i = 0; i < filters; ++i) {
    unsigned flags = 0, config = 0;
    size_t values = 0;
    const H5Z_filter_t filter = H5Pget_filter2(dcpl, static_cast<unsigned>(i), &flags, &values,
                                               nullptr, 0, nullptr, &config);
    if (filter < 0) H5Eclear2(H5E_DEFAULT);
    compressed = compressed || filter != H5Z_FILTER_FLETCHER32;
  }
  return compressed;
}

void detail::read_hyperslab(hid_t set, hid_t space, int64_t start,
                            const std::vector<hsize_t>& extent, hid_t memory_type, void* out,
                            const std::string& selecting, const std::string& memory_space,
                            const std::string& reading) {
  std::vector<hsize_t> offset(extent.size(), 0);
  offset[0] = static_cast<hsize_t>(start);
  TANDEM_H5_CHECK(
      H5Sselect_hyperslab(space, H5S_SELECT_SET, offset.data(), nullptr, extent.data(), nullptr),
      selecting);
  Handle memory(TANDEM_H5_CHECK(
      H5Screate_simple(static_cast<int>(extent.size()), extent.data(), nullptr), memory_space));
  TANDEM_H5_CHECK(H5Dread(set, memory_type, memory.id(), space, H5P_DEFAULT, out), reading);
}

namespace {

using detail::close_dataset;
using detail::file_type_of;
using detail::intermediate_groups_lcpl;
using detail::make_space;
using detail::memory_type_of;

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

/// Raises naming the dataset when reading all of it (`element_bytes` per element in memory)
/// would need more bytes than its file could hold: its declared shape is damaged, and
/// allocating for it would cost gigabytes before HDF5 fails.
void check_declared_size(hid_t set, const Shape& shape, size_t element_bytes,
                         const std::string& where) {
  hsize_t bytes = element_bytes;
  bool overflow = false;
  for (int64_t d : shape.dims())
    overflow = overflow || __builtin_mul_overflow(bytes, static_cast<hsize_t>(d), &bytes);
  const hsize_t file_bytes = detail::file_size_of(set, "", where);
  Handle dcpl(TANDEM_H5_CHECK(H5Dget_create_plist(set), "creation properties of ", where));
  const bool compressed = detail::has_compression(dcpl.id(), "", where);
  hsize_t limit = file_bytes;
  if (compressed && __builtin_mul_overflow(file_bytes, kMaxCompressionRatio, &limit))
    limit = std::numeric_limits<hsize_t>::max();
  TANDEM_CHECK(!overflow && bytes <= limit, where, ": declares shape ", shape, " (",
               overflow ? std::string("more than 2^64") : std::to_string(bytes),
               " bytes), more than its file of ", file_bytes,
               " bytes can hold; the file is damaged");
}

constexpr hsize_t kChunkBytes = hsize_t{16} << 20;

/// The name HDF5 gives a filter, for messages ("szip", "scaleoffset", "nbit", ...).
std::string filter_name(H5Z_filter_t filter, const char* name) {
  if (name != nullptr && name[0] != '\0')
    return ::tandem::detail::str_cat(name, " (filter ", filter, ")");
  return ::tandem::detail::str_cat("filter ", filter);
}

}  // namespace

/// Raises naming the dataset when its data is said to be elsewhere: external storage, or a
/// virtual dataset (whose source files libhdf5 opens as soon as the extent is asked for).
void detail::refuse_data_elsewhere(hid_t set, const std::string& where) {
  Handle dcpl(TANDEM_H5_CHECK(H5Dget_create_plist(set), "creation properties of ", where));
  const int external =
      TANDEM_H5_CHECK(H5Pget_external_count(dcpl.id()), "external files of ", where);
  TANDEM_CHECK(external == 0, where, ": its data is stored in ", external,
               " external file(s), outside the file; files Tandem reads keep their data inside");
  const H5D_layout_t layout = TANDEM_H5_CHECK(H5Pget_layout(dcpl.id()), "layout of ", where);
  TANDEM_CHECK(layout == H5D_COMPACT || layout == H5D_CONTIGUOUS || layout == H5D_CHUNKED, where,
               ": a ",
               layout == H5D_VIRTUAL ? "virtual dataset (its data comes from other files)"
                                     : "dataset of an unknown layout",
               "; files Tandem reads keep their data inside");
}

namespace {

/// See Group::check_storage: how the dataset `set` keeps its data, against `origin`.
void check_storage_of(hid_t set, Origin origin, const std::string& where) {
  detail::refuse_data_elsewhere(set, where);
  Handle dcpl(TANDEM_H5_CHECK(H5Dget_create_plist(set), "creation properties of ", where));
  const H5D_layout_t layout = TANDEM_H5_CHECK(H5Pget_layout(dcpl.id()), "layout of ", where);
  Handle space(TANDEM_H5_CHECK(H5Dget_space(set), "dataspace of ", where));
  const int rank = TANDEM_H5_CHECK(H5Sget_simple_extent_ndims(space.id()), "rank of ", where);
  std::vector<hsize_t> dims(static_cast<size_t>(rank));
  if (rank > 0)
    TANDEM_H5_CHECK(H5Sget_simple_extent_dims(space.id(), dims.data(), nullptr), "extent of ",
                    where);
  hsize_t elements = 1;
  for (hsize_t d : dims) elements *= d;
  // Only the filters that give back the written bytes exactly.
  bool checksum = false;
  const int filters = TANDEM_H5_CHECK(H5Pget_nfilters(dcpl.id()), "filters of ", where);
  for (int i = 0; i < filters; ++i) {
    unsigned flags = 0, config = 0;
    size_t values = 0;
    char name[64] = {};
    const H5Z_filter_t filter =
        TANDEM_H5_CHECK(H5Pget_filter2(dcpl.id(), static_cast<unsigned>(i), &flags, &values,
                                       nullptr, sizeof(name), name, &config),
                        "filters of ", where);
    TANDEM_CHECK(filter == H5Z_FILTER_FLETCHER32 || filter == H5Z_FILTER_DEFLATE ||
                     filter == H5Z_FILTER_SHUFFLE,
                 where, ": stored through ", filter_name(filter, name),
                 ", which Tandem does not read (only Fletcher-32, deflate and shuffle, which give "
                 "back the written bytes exactly)");
    checksum = checksum || filter == H5Z_FILTER_FLETCHER32;
  }
  if (origin == Origin::kTandem && elements > 0 && layout != H5D_COMPACT) {
    TANDEM_CHECK(layout == H5D_CHUNKED && checksum, where, ": its data carries no checksum (",
                 layout == H5D_CHUNKED ? "no Fletcher-32 filter" : "contiguous layout",
                 "); every dataset Tandem writes does, so the file was altered");
  }
  if (layout != H5D_CHUNKED || elements == 0) return;
  // Where the bytes come from: the chunk index must list each chunk of the dataset once, at
  // its place. (A damaged index could move a chunk outside the dataset, which would then
  // read as the fill value: zeros.)
  std::vector<hsize_t> chunk(static_cast<size_t>(rank));
  TANDEM_H5_CHECK(H5Pget_chunk(dcpl.id(), rank, chunk.data()), "chunk shape of ", where);
  hsize_t expected = 1;
  for (int d = 0; d < rank; ++d) {
    TANDEM_CHECK(chunk[static_cast<size_t>(d)] > 0, where, ": a chunk extent of 0");
    expected *= (dims[static_cast<size_t>(d)] + chunk[static_cast<size_t>(d)] - 1) /
                chunk[static_cast<size_t>(d)];
  }
#if H5_VERSION_GE(1, 10, 5)
  hsize_t stored = 0;
  TANDEM_H5_CHECK(H5Dget_num_chunks(set, space.id(), &stored), "chunks of ", where);
  TANDEM_CHECK(stored == expected, where, ": ", stored, " of its ", expected,
               " chunks are stored; its chunk index is damaged (or it was never fully written)");
  const hsize_t file_bytes = detail::file_size_of(set, "", where);
  std::vector<hsize_t> offset(static_cast<size_t>(rank));
  std::vector<std::vector<hsize_t>> seen;
  for (hsize_t i = 0; i < stored; ++i) {
    unsigned mask = 0;
    haddr_t address = 0;
    hsize_t bytes = 0;
    TANDEM_H5_CHECK(H5Dget_chunk_info(set, space.id(), i, offset.data(), &mask, &address, &bytes),
                    "chunk ", i, " of ", where);
    bool inside = true;
    for (int d = 0; d < rank; ++d) {
      const size_t k = static_cast<size_t>(d);
      inside = inside && offset[k] < dims[k] && offset[k] % chunk[k] == 0;
    }
    auto text = [&] {
      std::string out = "[";
      for (int d = 0; d < rank; ++d)
        out += (d ? ", " : "") + std::to_string(offset[static_cast<size_t>(d)]);
      return out + "]";
    };
    TANDEM_CHECK(inside, where, ": its chunk index puts a chunk at ", text(),
                 ", outside its shape or off the chunk grid; the chunk index is damaged");
    TANDEM_CHECK(std::find(seen.begin(), seen.end(), offset) == seen.end(), where,
                 ": its chunk index lists the chunk at ", text(), " twice; it is damaged");
    seen.push_back(offset);
    TANDEM_CHECK(mask == 0, where, ": the chunk at ", text(),
                 " was stored without its filters (mask ", mask,
                 "), so without its checksum; the file was altered");
    TANDEM_CHECK(bytes > 0 && address != HADDR_UNDEF && address <= file_bytes &&
                     bytes <= file_bytes - address,
                 where, ": the chunk at ", text(), " lies at bytes ", address, "..",
                 address + bytes, ", outside the file of ", file_bytes, " bytes");
  }
#endif
}

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

// ---- checkpoints: tensors written and read whole -----------------------------------------

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
  Handle set = open_set(name);
  Handle type(TANDEM_H5_CHECK(H5Dget_type(set.id()), "type of ", where(name)));
  return dtype_of_type(type.id(), where(name));
}

std::string Group::dataset_type_name(const std::string& name) const {
  TANDEM_CHECK(exists(name), where(name), ": dataset not found");
  Handle set = open_set(name);
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
  Handle set = open_set(name);
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
  Handle set = open_set(name);
  Handle dcpl(
      TANDEM_H5_CHECK(H5Dget_create_plist(set.id()), "creation properties of ", where(name)));
  unsigned flags = 0, config = 0;
  size_t values = 0;
  const herr_t found = H5Pget_filter_by_id2(dcpl.id(), H5Z_FILTER_FLETCHER32, &flags, &values,
                                            nullptr, 0, nullptr, &config);
  if (found < 0) H5Eclear2(H5E_DEFAULT);
  return found >= 0;
}

Tensor Group::read_tensor(const std::string& name) const {
  const Shape shape = dataset_shape(name);
  return read_rows(name, 0, shape.rank() == 0 ? 1 : shape[0]);
}

Handle Group::open_set(const std::string& name) const {
  Handle set(TANDEM_H5_CHECK(H5Dopen2(handle_.id(), name.c_str(), H5P_DEFAULT), "opening dataset ",
                             where(name)));
  // Before anything asks for its extent or type: a virtual dataset with an unlimited mapping
  // opens its source files then (one on a FIFO blocks), and external storage names other files.
  detail::refuse_data_elsewhere(set.id(), where(name));
  return set;
}

void Group::check_storage(const std::string& name) const {
  TANDEM_CHECK(exists(name), where(name), ": dataset not found");
  Handle set = open_set(name);
  check_storage_of(set.id(), origin_, where(name));
}

Tensor Group::read_rows(const std::string& name, int64_t start, int64_t count) const {
  TANDEM_CHECK(exists(name), where(name), ": dataset not found");
  Handle set = open_set(name);
  Handle type(TANDEM_H5_CHECK(H5Dget_type(set.id()), "type of ", where(name)));
  const DType dtype = dtype_of_type(type.id(), where(name));
  Handle space(TANDEM_H5_CHECK(H5Dget_space(set.id()), "dataspace of ", where(name)));
  const Shape full = shape_of_space(space.id(), where(name));
  check_declared_size(set.id(), full, dtype_size(dtype), where(name));
  check_storage_of(set.id(), origin_, where(name));
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
  const std::vector<hsize_t> extent(out_shape.dims().begin(), out_shape.dims().end());
  detail::read_hyperslab(set.id(), space.id(), start, extent, memory_type_of(dtype), out.raw_data(),
                         "selecting rows of " + where(name), "dataspace", "reading " + where(name));
  return out;
}

std::vector<uint64_t> Group::read_u64(const std::string& name) const {
  const Shape shape = dataset_shape(name);
  Handle set = open_set(name);
  check_declared_size(set.id(), shape, sizeof(uint64_t), where(name));
  check_storage_of(set.id(), origin_, where(name));
  std::vector<uint64_t> values(static_cast<size_t>(shape.numel()));
  if (!values.empty())
    TANDEM_H5_CHECK(
        H5Dread(set.id(), H5T_NATIVE_UINT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data()),
        "reading ", where(name));
  return values;
}

// ---- the HDF5 dataset source: datasets read in parts ------------------------------------------

Dataset Group::open_dataset(const std::string& name, std::string context, std::string label) const {
  const hid_t id = TANDEM_H5_CHECK(H5Dopen2(handle_.id(), name.c_str(), H5P_DEFAULT), context,
                                   "cannot open dataset ", label);
  return Dataset(Handle(id), std::move(context), std::move(label));
}

std::vector<uint64_t> Dataset::extents() const {
  Handle space(TANDEM_H5_CHECK(H5Dget_space(handle_.id()), context_, "dataspace of ", label_));
  const int rank =
      TANDEM_H5_CHECK(H5Sget_simple_extent_ndims(space.id()), context_, "rank of ", label_);
  std::vector<hsize_t> dims(static_cast<size_t>(rank));
  if (rank > 0)
    TANDEM_H5_CHECK(H5Sget_simple_extent_dims(space.id(), dims.data(), nullptr), context_,
                    "dimensions of ", label_);
  return std::vector<uint64_t>(dims.begin(), dims.end());
}

ElementType Dataset::element_type() const {
  Handle type(TANDEM_H5_CHECK(H5Dget_type(handle_.id()), context_, "type of ", label_));
  const H5T_class_t type_class =
      TANDEM_H5_CHECK(H5Tget_class(type.id()), context_, "type of ", label_);
  ElementType out;
  out.hdf5_class = static_cast<int>(type_class);
  out.bytes = H5Tget_size(type.id());  // 0 on failure
  TANDEM_CHECK(out.bytes > 0, context_, "size of the type of ", label_);
  if (type_class == H5T_FLOAT) out.kind = ElementType::Kind::kFloat;
  if (type_class == H5T_INTEGER) {
    out.kind = ElementType::Kind::kInteger;
    out.is_signed =
        TANDEM_H5_CHECK(H5Tget_sign(type.id()), context_, "sign of ", label_) != H5T_SGN_NONE;
  }
  return out;
}

Layout Dataset::layout() const {
  Handle dcpl(
      TANDEM_H5_CHECK(H5Dget_create_plist(handle_.id()), context_, "properties of ", label_));
  switch (TANDEM_H5_CHECK(H5Pget_layout(dcpl.id()), context_, "layout of ", label_)) {
    case H5D_COMPACT:
      return Layout::kCompact;
    case H5D_CONTIGUOUS:
      return Layout::kContiguous;
    case H5D_CHUNKED:
      return Layout::kChunked;
    case H5D_VIRTUAL:
      return Layout::kVirtual;
    default:
      return Layout::kOther;
  }
}

int Dataset::external_files() const {
  Handle dcpl(
      TANDEM_H5_CHECK(H5Dget_create_plist(handle_.id()), context_, "properties of ", label_));
  return TANDEM_H5_CHECK(H5Pget_external_count(dcpl.id()), context_, "external files of ", label_);
}

uint64_t Dataset::stored_bytes() const {
  detail::silence_hdf5();
  return H5Dget_storage_size(handle_.id());  // 0 also when never written
}

bool Dataset::compressed() const {
  Handle dcpl(
      TANDEM_H5_CHECK(H5Dget_create_plist(handle_.id()), context_, "properties of ", label_));
  return detail::has_compression(dcpl.id(), context_, label_);
}

uint64_t Dataset::file_bytes() const {
  return detail::file_size_of(handle_.id(), context_, label_);
}

void Dataset::read_rows(int64_t start, int64_t count, const Shape& row_shape, DType dtype,
                        void* out) const {
  std::vector<hsize_t> extent{static_cast<hsize_t>(count)};
  for (int64_t d : row_shape) extent.push_back(static_cast<hsize_t>(d));
  Handle space(TANDEM_H5_CHECK(H5Dget_space(handle_.id()), context_, "dataspace of ", label_));
  const std::string rows =
      ::tandem::detail::str_cat("rows ", start, "..", start + count, " of ", label_);
  detail::read_hyperslab(handle_.id(), space.id(), start, extent, detail::memory_type_of(dtype),
                         out, context_ + "selecting " + rows,
                         context_ + "memory dataspace for " + label_, context_ + "reading " + rows);
}

}  // namespace tandem::h5
