// What the HDF5 wrapper's sources (io/hdf5_*.cpp) share: hdf5.h itself, TANDEM_H5_CHECK and
// the helpers behind it. The only file of the SDK that includes hdf5.h; nothing outside the
// wrapper's sources includes it (everything else goes through io/internal/hdf5_file.h).
#pragma once

#include <hdf5.h>

#include <string>
#include <vector>

#include "tandem/core/error.h"
#include "tandem/io/internal/hdf5_file.h"

namespace tandem::h5::detail {

/// HDF5 prints its error stack to stderr by default; Tandem reports errors itself. In a
/// thread-safe HDF5 build the setting is per thread (checkpoints may be written from a replica
/// thread, datasets are read on prefetch threads), so every thread turns it off once.
void silence_hdf5();

/// HDF5's reason for the last failure on this thread: the message of the API call and, when it
/// differs, the innermost one, which says what actually failed ("can't read data: data error
/// detected by Fletcher32 checksum"). Clears the error stack.
std::string hdf5_message();

/// Closes a dataset; returns "" or why writing its buffered chunks failed. They are written
/// first (H5Dflush), while the dataset is intact: if that fails, they are dropped, so that the
/// close still releases the id.
std::string close_dataset(hid_t id);

/// The little-endian file type and the native memory type of a DType (bool as uint8).
hid_t file_type_of(DType dtype);
hid_t memory_type_of(DType dtype);

/// A simple dataspace of `shape` (a scalar one for rank 0).
Handle make_space(const Shape& shape);

/// Link creation properties that make missing intermediate groups ("m/dense/kernel:0" creates
/// m and m/dense).
Handle intermediate_groups_lcpl();

/// Raises naming `where` when the dataset `set` keeps its data outside its file: external
/// storage, or a virtual dataset. Called before its extent or type is asked for.
void refuse_data_elsewhere(hid_t set, const std::string& where);

/// The `count` variable-length strings of the attribute `name` of the object `object` (its
/// object_id) of `file`, read as `memtype` in a forked child process: whatever libhdf5 does on
/// a damaged file (crash, wild allocation, endless loop) happens there and becomes an error
/// naming `where` here. The first such read of a file (of one version: path, inode, size,
/// modification time) reads every variable-length string attribute of the file in one child;
/// later ones are answered from that until the file is closed (forget_vlen_strings).
std::vector<std::string> read_vlen_strings(hid_t attr, hid_t memtype, size_t count,
                                           const std::string& file, const std::string& object,
                                           const std::string& name, const std::string& where);

/// Drops what read_vlen_strings kept of `file`: called when a File of that path closes, so that
/// a file rewritten in place within the clock's granularity (same inode, size and time) is
/// read again when it is opened again.
void forget_vlen_strings(const std::string& file);

/// The size of the file holding `object`, in bytes; `context` and `where` name the object in
/// messages ("<context>file of <where>").
hsize_t file_size_of(hid_t object, const std::string& context, const std::string& where);

/// True when the dataset creation properties `dcpl` list a filter other than Fletcher-32 (a
/// compression filter): its data may then take fewer bytes in the file than it declares.
bool has_compression(hid_t dcpl, const std::string& context, const std::string& where);

/// Reads `extent` (rows along axis 0 from `start`, then whole rows) of the dataset `set` into
/// `out` as `memory_type`: a hyperslab of its dataspace `space` (which this selects). Each
/// message names the step that failed.
void read_hyperslab(hid_t set, hid_t space, int64_t start, const std::vector<hsize_t>& extent,
                    hid_t memory_type, void* out, const std::string& selecting,
                    const std::string& memory_space, const std::string& reading);

}  // namespace tandem::h5::detail

/// Evaluates an HDF5 call; a negative result raises tandem::Error with the message parts,
/// HDF5's own reason and the call. Yields the call's result.
#define TANDEM_H5_CHECK(expr, ...)                                                             \
  [&]() {                                                                                      \
    ::tandem::h5::detail::silence_hdf5();                                                      \
    auto tandem_h5_result = (expr);                                                            \
    if (tandem_h5_result < 0) [[unlikely]]                                                     \
      TANDEM_THROW(__VA_ARGS__, ": ", ::tandem::h5::detail::hdf5_message(), " (", #expr, ")"); \
    return tandem_h5_result;                                                                   \
  }()
