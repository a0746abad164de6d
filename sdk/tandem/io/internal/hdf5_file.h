// The RAII wrapper over the HDF5 C API that checkpoints and the HDF5 dataset source share.
// Internal header: it does not include hdf5.h (only the wrapper's sources, io/hdf5_*.cpp, do,
// through io/internal/hdf5_check.h); handles are plain int64 ids. Without HDF5 the calls that
// open or create a file raise NotBuiltError (io/no_hdf5.cpp).
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
  /// Gives up ownership: returns the id, which the caller must close.
  int64_t release() {
    const int64_t id = id_;
    id_ = -1;
    return id;
  }

 private:
  int64_t id_ = -1;
};

/// The largest size ratio of HDF5's compression filters (deflate: 1032:1). A compressed dataset
/// may declare more bytes than its file holds, but never more than this many times as many.
constexpr uint64_t kMaxCompressionRatio = 1032;

/// The element type a dataset declares in its file (what a reader maps to a DType).
struct ElementType {
  enum class Kind { kInteger, kFloat, kOther };
  Kind kind = Kind::kOther;
  size_t bytes = 0;        ///< the size of one element in the file
  bool is_signed = false;  ///< integers only
  int hdf5_class = -1;     ///< HDF5's type class number, for messages
};

/// How a dataset keeps its data in the file.
enum class Layout { kCompact, kContiguous, kChunked, kVirtual, kOther };

/// Who wrote a file that is read, which decides what a dataset's storage may be. Either way its
/// objects are reached through hard links only (no soft or external link is followed), its
/// data is stored in the file itself (no external storage, no virtual dataset), every chunk of
/// a chunked dataset is allocated once and inside the dataset, and the only filters are those
/// HDF5 applies losslessly (Fletcher-32, deflate, shuffle).
enum class Origin {
  /// A Tandem checkpoint: every dataset that holds data carries Fletcher-32 (chunked layout;
  /// a scalar is compact, inside its checksummed object header).
  kTandem,
  /// A file another program wrote (Keras weights): contiguous and unchecksummed data too.
  kForeign,
};

/// A dataset opened to be read in parts (the HDF5 dataset source): what it declares (extents,
/// element type, storage) and rows read by hyperslab straight into the caller's memory. Its
/// messages read "<context><what> <label>" ("data::hdf5: dataspace of 'x' in 'part0.h5'"), so
/// that a reader's errors keep its own words. Open one with Group::open_dataset.
class Dataset {
 public:
  Dataset() = default;

  /// The extents its dataspace declares (none for a scalar), unchecked: a damaged header can
  /// declare anything.
  std::vector<uint64_t> extents() const;
  /// The stored element type; raises when HDF5 reports a size of 0.
  ElementType element_type() const;
  Layout layout() const;
  /// How many external files hold its data (0: the data is in this file).
  int external_files() const;
  /// The bytes allocated for its data in the file (0 also when it was never written).
  uint64_t stored_bytes() const;
  /// True when a filter other than Fletcher-32 (a compression filter) applies to its chunks.
  bool compressed() const;
  /// The size of its file in bytes.
  uint64_t file_bytes() const;
  /// Reads rows [start, start + count) along axis 0, each of `row_shape`, into `out` as `dtype`
  /// (HDF5 converts from the stored type): one hyperslab selection, one read. `out` holds
  /// count * row_shape.numel() elements of `dtype`.
  void read_rows(int64_t start, int64_t count, const Shape& row_shape, DType dtype,
                 void* out) const;

 private:
  friend class Group;
  Dataset(Handle handle, std::string context, std::string label)
      : handle_(std::move(handle)), context_(std::move(context)), label_(std::move(label)) {}
  Handle handle_;
  std::string context_;
  std::string label_;
};

/// A group (the root of a file is a group too). Every call names the file and object on error.
class Group {
 public:
  Group() = default;
  Group(Handle handle, std::string file, std::string path, Origin origin = Origin::kTandem)
      : handle_(std::move(handle)),
        file_(std::move(file)),
        path_(std::move(path)),
        origin_(origin) {}

  const std::string& path() const { return path_; }
  const std::string& file() const { return file_; }

  Group create_group(const std::string& name) const;
  Group open_group(const std::string& name) const;
  /// Opens the group `name` (may contain '/'), creating it and any missing parents.
  Group require_group(const std::string& name) const;
  /// True if a link `name` (may contain '/') exists below this group. A soft or external link
  /// on the way raises, naming it: nothing Tandem reads is reached through one.
  bool exists(const std::string& name) const;
  /// What identifies the object `name` ("." for this group) within its file, whichever links
  /// lead to it: walks of a file keep these to tell a cycle of hard links.
  std::string object_id(const std::string& name) const;
  /// Names of the direct children, in creation order where recorded, else by name.
  std::vector<std::string> children() const;
  /// True if `name` exists and is a dataset (false for a group or a missing link).
  bool is_dataset(const std::string& name) const;
  /// Opens the dataset `name` to read it in parts; `context` starts and `label` ends every
  /// message about it (see Dataset). The caller checks that it exists.
  Dataset open_dataset(const std::string& name, std::string context, std::string label) const;

  /// Writes an uncompressed little-endian dataset (float32, float64, int32, int64, uint8; uint64
  /// via write_u64) that carries a checksum: rank >= 1 with data: chunked layout with HDF5's
  /// Fletcher-32 filter; a scalar: compact layout, its value inside the object header, which
  /// the file's v2 object headers checksum; zero elements: no data to protect. A rank-0 tensor
  /// makes a scalar dataset. Missing intermediate groups in `name` ("m/dense/kernel:0") are
  /// created.
  void write_tensor(const std::string& name, const Tensor& tensor) const;
  void write_u64(const std::string& name, const std::vector<uint64_t>& values,
                 const Shape& shape) const;
  /// Reads a whole dataset as a CPU tensor of its stored type (uint64 reads as int64 bits).
  /// Every read is bounded by the file's size before anything is allocated: a dataset whose
  /// declared shape needs more bytes than the file holds (a damaged header) raises naming it.
  /// So does a dataset stored otherwise than its file's Origin allows (check_storage).
  Tensor read_tensor(const std::string& name) const;
  /// Reads a dataset of exactly one element (a scalar, or shape [1]) as int64 / float64; any
  /// other shape (an empty [0] included) raises naming the file, the dataset and its shape.
  int64_t read_scalar_int64(const std::string& name) const;
  double read_scalar_float64(const std::string& name) const;
  /// True when the dataset `name` carries the Fletcher-32 checksum filter.
  bool has_checksum(const std::string& name) const;
  /// Raises naming the dataset unless it is stored as its file's Origin allows (see Origin):
  /// external storage, a virtual dataset, a filter other than Fletcher-32, deflate or shuffle,
  /// a chunk index listing a chunk outside the dataset, twice, or not at all, a chunk whose
  /// filters were skipped, or (kTandem) data without a checksum.
  void check_storage(const std::string& name) const;
  /// Deletes the link `name` (tools and tests that edit a file).
  void remove(const std::string& name) const;
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
  /// A 1-D attribute of fixed-length, null-padded byte strings as wide as the longest value:
  /// what numpy's bytes arrays become (tf-keras writes layer_names and weight_names so).
  void write_attr_fixed(const std::string& name, const std::vector<std::string>& values) const;
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
  /// Reads a 1-D string attribute, variable- or fixed-length; an attribute of no elements (of any
  /// type) reads as an empty list. Variable-length strings live in the file's global heaps,
  /// which the format does not checksum and which libhdf5 reads trustingly (a damaged one can
  /// hang or crash it): before the first such read the file's global heaps are checked
  /// (check_global_heaps), and a damaged one raises naming the file and the offset.
  std::vector<std::string> read_attr_strings(const std::string& name) const;

 private:
  std::string where(const std::string& name) const;
  /// A group below this one, of the same file and origin.
  Group child(Handle handle, const std::string& name) const;
  /// Opens the dataset `name`, refusing one whose data is elsewhere (external storage, virtual)
  /// before anything reads its extent.
  Handle open_set(const std::string& name) const;
  Handle handle_;
  std::string file_;
  std::string path_;
  Origin origin_ = Origin::kTandem;
};

/// An open HDF5 file.
class File {
 public:
  /// Creates `path`; fails if it exists (exclusive create, for crash-safe temp files). The file
  /// uses the HDF5 1.10 format or newer: every piece of metadata carries a checksum (v2 object
  /// headers, and the chunk indexes that decide where a dataset's bytes are).
  static File create(const std::string& path);
  /// Opens an existing file read-only; a missing, truncated or non-HDF5 file, or one that is not
  /// a regular file (a FIFO, a device, a directory: checked before HDF5 opens it, so nothing
  /// blocks), raises an error naming the file. `origin` says what its datasets may be (Origin).
  static File open(const std::string& path, Origin origin = Origin::kTandem);
  /// Opens an existing file for reading and writing (tools and tests that edit a file).
  static File open_for_update(const std::string& path);
  /// Opens `path` read-only as HDF5 finds it, without open()'s checks (the caller makes those
  /// it needs, in its own words; a user block before the signature is fine): a failure raises
  /// `context` with HDF5's reason.
  static File open_as_found(const std::string& path, const std::string& context);
  ~File();
  File(File&&) noexcept = default;
  File& operator=(File&&) noexcept = default;

  const Group& root() const { return root_; }
  const std::string& path() const { return path_; }
  /// Reads the file from now on as `origin` says (the root group is opened again).
  void set_origin(Origin origin);
  /// The version of its superblock: 0 or 1 for the HDF5 1.6 format, 2 for 1.8, 3 for 1.10.
  int superblock_version() const;
  /// Flushes HDF5's buffers to the operating system.
  void flush() const;
  /// Closes the file (also done by the destructor); errors raise here, not in the destructor.
  /// Every HDF5 id of the file is released on every path: when closing fails because the data
  /// cannot be written (a full disk), the file's remaining writes are dropped (its descriptor is
  /// pointed at /dev/null) so that HDF5 lets go of it; the file on disk is then incomplete,
  /// which is why writers create temporaries and delete them on error.
  void close();

 private:
  File(Handle handle, std::string path, Origin origin = Origin::kTandem);
  Handle file_;
  Group root_;
  std::string path_;
};

/// True when `path` is a regular file that starts with the HDF5 signature (cheap check before
/// opening; a FIFO or device is never opened for reading, so this does not block).
bool is_hdf5(const std::string& path);

/// Raises naming `path` unless it is a regular file (after following symbolic links): a
/// missing file, a symbolic-link loop, a FIFO, a device or a directory.
void require_regular_file(const std::string& path);

/// Raises naming the file and the offset unless every global heap collection in it ("GCOL",
/// where variable-length strings live) is well formed: each object inside the collection and
/// of a size that moves the reader forward (libhdf5 1.10.8 loops forever on a free-space object
/// of size 0, and copies past the collection for an object that runs over its end). Scans the
/// file's bytes once per file version (path, inode, size, modification time).
void check_global_heaps(const std::string& path);

}  // namespace tandem::h5
