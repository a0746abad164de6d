// An RAII wrapper over the HDF5 C API for checkpoints and HDF5 datasets. Internal header: it
// does not include hdf5.h (only hdf5_file.cpp does); handles are plain int64 ids.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "tandem/tensor/tensor.h"

namespace tandem::h5 {

/// Owns one HDF5 identifier (file, group, dataset, ...) and closes it when destroyed.
class Handle {
 public:
  Handle() = default;
  explicit Handle(int64_t id) : id_(id) {}
  ~Handle();
  Handle(Handle&& other) noexcept : id_(other.id_) { other.id_ = -1; }
  Handle& operator=(Handle&& other) noexcept;
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  int64_t id() const { return id_; }
  bool valid() const { return id_ >= 0; }
  void close();

 private:
  int64_t id_ = -1;
};

/// A group (the root of a file is a group too). Every call names the file and object on error.
class Group {
 public:
  Group() = default;
  Group(Handle handle, std::string file, std::string path)
      : handle_(std::move(handle)), file_(std::move(file)), path_(std::move(path)) {}

  const std::string& path() const { return path_; }
  const std::string& file() const { return file_; }

  Group create_group(const std::string& name) const;
  Group open_group(const std::string& name) const;
  /// Opens the group `name` (may contain '/'), creating it and any missing parents.
  Group require_group(const std::string& name) const;
  /// True if a link `name` (may contain '/') exists below this group.
  bool exists(const std::string& name) const;
  /// Names of the direct children, in creation order where recorded, else by name.
  std::vector<std::string> children() const;
  /// True if `name` exists and is a dataset (false for a group or a missing link).
  bool is_dataset(const std::string& name) const;

  /// Writes a contiguous, uncompressed little-endian dataset (float32, float64, int32, int64,
  /// uint8; uint64 via write_u64). A rank-0 tensor makes a scalar dataset. Missing
  /// intermediate groups in `name` ("m/dense/kernel:0") are created.
  void write_tensor(const std::string& name, const Tensor& tensor) const;
  void write_u64(const std::string& name, const std::vector<uint64_t>& values,
                 const Shape& shape) const;
  /// Reads a whole dataset as a CPU tensor of its stored type (uint64 reads as int64 bits).
  Tensor read_tensor(const std::string& name) const;
  std::vector<uint64_t> read_u64(const std::string& name) const;
  /// Rows [start, start + count) along axis 0 of a dataset (hyperslab read).
  Tensor read_rows(const std::string& name, int64_t start, int64_t count) const;
  Shape dataset_shape(const std::string& name) const;
  DType dataset_dtype(const std::string& name) const;
  /// The stored element type by name: "float32", "int64", "uint64", ... (for inspection; unlike
  /// dataset_dtype it tells unsigned from signed).
  std::string dataset_type_name(const std::string& name) const;

  void write_attr(const std::string& name, const std::string& value) const;
  void write_attr(const std::string& name, int64_t value) const;
  /// A 1-D attribute of variable-length UTF-8 strings (Keras' layer_names, weight_names).
  void write_attr(const std::string& name, const std::vector<std::string>& values) const;
  /// A string attribute on the dataset (or group) `object` below this group, e.g. the
  /// algorithm="philox4x32-10" of rng/replica_state.
  void write_attr_of(const std::string& object, const std::string& name,
                     const std::string& value) const;
  /// Reads a string attribute of `object`; std::nullopt when it has none of that name.
  std::optional<std::string> read_attr_string_of(const std::string& object,
                                                 const std::string& name) const;
  bool has_attr(const std::string& name) const;
  /// Deletes the attribute `name` (raises when it does not exist).
  void remove_attr(const std::string& name) const;
  std::string read_attr_string(const std::string& name) const;
  int64_t read_attr_int64(const std::string& name) const;
  /// Reads a 1-D string attribute, variable- or fixed-length.
  std::vector<std::string> read_attr_strings(const std::string& name) const;

 private:
  std::string where(const std::string& name) const;
  Handle handle_;
  std::string file_;
  std::string path_;
};

/// An open HDF5 file.
class File {
 public:
  /// Creates `path`; fails if it exists (exclusive create, for crash-safe temp files).
  static File create(const std::string& path);
  /// Opens an existing file read-only; a missing, truncated or non-HDF5 file raises an error
  /// naming the file.
  static File open(const std::string& path);
  /// Opens an existing file for reading and writing (tools and tests that edit a file).
  static File open_for_update(const std::string& path);

  const Group& root() const { return root_; }
  const std::string& path() const { return path_; }
  /// Flushes HDF5's buffers to the operating system.
  void flush() const;
  /// Closes the file (also done by the destructor); errors raise here, not in the destructor.
  void close();

 private:
  File(Handle handle, std::string path);
  Handle file_;
  Group root_;
  std::string path_;
};

/// True when `path` starts with the HDF5 signature (cheap check before opening).
bool is_hdf5(const std::string& path);

}  // namespace tandem::h5
