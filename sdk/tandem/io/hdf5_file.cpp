// The HDF5 wrapper's errors, handles and files: TANDEM_H5_CHECK's helpers, Handle, and File
// (create, the checked opens, close). Every HDF5 call goes through TANDEM_H5_CHECK, which raises
// tandem::Error with the file, the object and HDF5's own message.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>

#include "tandem/io/internal/hdf5_check.h"

namespace tandem::h5 {

namespace {

herr_t collect_messages(unsigned, const H5E_error2_t* err, void* data) {
  if (err->desc != nullptr && err->desc[0] != '\0')
    static_cast<std::vector<std::string>*>(data)->push_back(err->desc);
  return 0;
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

}  // namespace

namespace detail {

void silence_hdf5() {
  thread_local bool silenced = false;
  if (!silenced) {
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
    silenced = true;
  }
}

std::string hdf5_message() {
  std::vector<std::string> messages;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_DOWNWARD, collect_messages, &messages);
  H5Eclear2(H5E_DEFAULT);
  if (messages.empty()) return "unknown HDF5 error";
  if (messages.size() == 1 || messages.back() == messages.front()) return messages.front();
  return messages.front() + ": " + messages.back();
}

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

}  // namespace detail

using detail::close_dataset;
using detail::hdf5_message;
using detail::silence_hdf5;

namespace {

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

File::File(Handle handle, std::string path, Origin origin)
    : file_(std::move(handle)), path_(std::move(path)) {
  hid_t root = TANDEM_H5_CHECK(H5Gopen2(file_.id(), "/", H5P_DEFAULT), path_, ": opening /");
  root_ = Group(Handle(root), path_, "/", origin);
}

File File::create(const std::string& path) {
  silence_hdf5();
  // Strong close: H5Fclose then closes every object still open in the file, so that after
  // close() the file on disk is complete and may be fsynced and renamed.
  Handle fapl(TANDEM_H5_CHECK(H5Pcreate(H5P_FILE_ACCESS), "file access properties"));
  TANDEM_H5_CHECK(H5Pset_fclose_degree(fapl.id(), H5F_CLOSE_STRONG), "file access properties");
  // The 1.10 format or newer: v2 object headers and superblock carry checksums, so the
  // metadata (shapes, attributes, compact scalars) is verified, and so are the chunk indexes
  // (a single chunk's address inside the checksummed layout message; a fixed array with its
  // own checksum for several), which decide where a dataset's bytes come from: the 1.8
  // format's v1 B-tree has none, and one flipped byte there moved a chunk outside its dataset,
  // which then read back as zeros. h5py and Keras (libhdf5 1.10 and newer) read it.
  TANDEM_H5_CHECK(H5Pset_libver_bounds(fapl.id(), H5F_LIBVER_V110, H5F_LIBVER_LATEST),
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

File File::open(const std::string& path, Origin origin) {
  silence_hdf5();
  const int fd = open_regular_file(path);
  const bool signature = has_hdf5_signature(fd);
  ::close(fd);
  TANDEM_CHECK(signature, path, ": not an HDF5 file (bad signature)");
  hid_t id = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  if (id < 0) TANDEM_THROW(path, ": damaged or truncated HDF5 file: ", hdf5_message());
  return File(Handle(id), path, origin);
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

File File::open_as_found(const std::string& path, const std::string& context) {
  const hid_t id = TANDEM_H5_CHECK(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), context);
  return File(Handle(id), path);
}

void File::set_origin(Origin origin) {
  hid_t root = TANDEM_H5_CHECK(H5Gopen2(file_.id(), "/", H5P_DEFAULT), path_, ": opening /");
  root_ = Group(Handle(root), path_, "/", origin);
}

int File::superblock_version() const {
  H5F_info2_t info{};
  TANDEM_H5_CHECK(H5Fget_info2(file_.id(), &info), path_, ": file information");
  return static_cast<int>(info.super.version);
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
  if (file_.valid()) {
    close_file_id(file_.release());
    detail::forget_vlen_strings(path_);
  }
}

void File::close() {
  // Close the root group first: HDF5 keeps a file open while objects in it are open.
  root_ = Group();
  if (!file_.valid()) return;
  const std::string why = close_file_id(file_.release());
  detail::forget_vlen_strings(path_);
  TANDEM_CHECK(why.empty(), "closing ", path_, ": ", why);
}

}  // namespace tandem::h5

// ---- global heaps --------------------------------------------------------------------------

namespace tandem::h5 {

namespace {

/// Why the global heap collection at `at` of `bytes` (the file, or the part read of it) is
/// malformed; "" when it is fine or is no collection after all (only "GCOL" matched).
std::string check_collection(const unsigned char* bytes, size_t length, size_t at,
                             uint64_t file_size) {
  // "GCOL", version 1, three reserved bytes, the collection's size (8-byte lengths, as every
  // file h5py, Keras and Tandem write has); objects from byte 16.
  if (at + 16 > length || bytes[at + 4] != 1 || bytes[at + 5] != 0 || bytes[at + 6] != 0 ||
      bytes[at + 7] != 0)
    return "";
  uint64_t size = 0;
  std::memcpy(&size, bytes + at + 8, sizeof(size));
  if (size < 4096 || size > file_size - at)
    return ::tandem::detail::str_cat("it declares ", size, " bytes (at least 4096, within the ",
                                     file_size - at, " left in the file)");
  if (at + size > length) return "";  // cut by the part read: checked with the next part
  constexpr size_t kHeader = 16;      // index u16, references u16, reserved u32, size u64
  size_t p = at + 16;
  const size_t end = at + size;
  while (p < end) {
    if (p + kHeader > end) break;  // a tail too small for an object: free space
    uint16_t index = 0;
    uint64_t object = 0;
    std::memcpy(&index, bytes + p, sizeof(index));
    std::memcpy(&object, bytes + p + 8, sizeof(object));
    uint64_t need = 0;
    if (index == 0) {
      // The free space: its size counts its header, and must move the reader forward.
      if (object < kHeader || object > end - p)
        return ::tandem::detail::str_cat("its free space at byte ", p - at, " has size ", object,
                                         " (between ", kHeader, " and ", end - p, ")");
      need = object;
    } else {
      const uint64_t aligned = (object + 7) / 8 * 8;
      if (object > end - p || aligned > end - p - kHeader)
        return ::tandem::detail::str_cat("its object ", index, " at byte ", p - at, " has size ",
                                         object, ", past the collection's end (", end - p - kHeader,
                                         " bytes left)");
      need = kHeader + aligned;
    }
    p += need;
  }
  return "";
}

}  // namespace

void check_global_heaps(const std::string& path) {
  static std::mutex mutex;
  static std::map<std::string, std::string> checked;  // file version -> "" or why it is damaged
  struct stat info {};
  TANDEM_CHECK(::stat(path.c_str(), &info) == 0, path,
               ": cannot stat the file: ", std::strerror(errno));
  const std::string version =
      ::tandem::detail::str_cat(path, "|", info.st_dev, ":", info.st_ino, "|", info.st_size, "|",
                                info.st_mtim.tv_sec, ".", info.st_mtim.tv_nsec);
  std::lock_guard<std::mutex> lock(mutex);
  auto found = checked.find(version);
  if (found == checked.end()) {
    const int fd = open_regular_file(path);
    const uint64_t file_size = static_cast<uint64_t>(info.st_size);
    // Parts of 4 MiB that overlap by a collection's minimum: a collection that starts in one
    // part is checked in the part that holds it whole (collections are small; a larger one is
    // read on its own).
    constexpr size_t kPart = size_t{4} << 20;
    std::vector<unsigned char> part;
    std::string why;
    for (uint64_t start = 0; start < file_size && why.empty();) {
      const size_t length =
          static_cast<size_t>(std::min<uint64_t>(kPart + 65536, file_size - start));
      part.resize(length);
      size_t got = 0;
      while (got < length) {
        const ssize_t n =
            ::pread(fd, part.data() + got, length - got, static_cast<off_t>(start + got));
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        got += static_cast<size_t>(n);
      }
      const size_t scan_end = std::min<size_t>(got, kPart);
      for (size_t at = 0; at + 4 <= scan_end && why.empty(); ++at) {
        const void* hit = std::memchr(part.data() + at, 'G', scan_end - at);
        if (hit == nullptr) break;
        at = static_cast<size_t>(static_cast<const unsigned char*>(hit) - part.data());
        if (at + 4 > got || std::memcmp(part.data() + at, "GCOL", 4) != 0) continue;
        std::string bad = check_collection(part.data(), got, at, file_size - start);
        if (bad.empty() && at + 16 <= got) {
          // A collection longer than what was read: read it whole.
          uint64_t size = 0;
          std::memcpy(&size, part.data() + at + 8, sizeof(size));
          if (part[at + 4] == 1 && size >= 4096 && size <= file_size - start - at &&
              at + size > got && size <= (uint64_t{64} << 20)) {
            std::vector<unsigned char> whole(static_cast<size_t>(size));
            const ssize_t n =
                ::pread(fd, whole.data(), whole.size(), static_cast<off_t>(start + at));
            if (n == static_cast<ssize_t>(whole.size()))
              bad = check_collection(whole.data(), whole.size(), 0, file_size - start - at);
          }
        }
        if (!bad.empty())
          why = ::tandem::detail::str_cat(path, ": the global heap collection at offset ",
                                          start + at, " is damaged: ", bad,
                                          "; its variable-length strings cannot be read safely");
      }
      if (got < length) break;
      start += kPart;
    }
    ::close(fd);
    found = checked.emplace(version, why).first;
  }
  TANDEM_CHECK(found->second.empty(), found->second);
}

}  // namespace tandem::h5
