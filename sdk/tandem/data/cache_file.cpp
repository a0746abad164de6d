// cache(filename): elements kept in a file, written beside it ("<filename>.tmp-<pid>-<n>",
// created exclusively) as they are read and renamed to `filename` once complete, so a file of
// that name is always whole; read back with pread from any thread. Format (little-endian):
//   "TNDMCACH", u32 version (1), u32 signature length, the signature (the input's description)
//   records: u32 tensors, then per tensor u8 dtype, u8 rank, i64 dims[rank], the bytes
//   i64 offset of each element's record, u64 count, u64 offset of that table, "TNDMCEND"
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <vector>

#include "tandem/core/error.h"
#include "tandem/data/internal/cache_store.h"

namespace tandem::data::detail {
namespace {

constexpr char kMagic[8] = {'T', 'N', 'D', 'M', 'C', 'A', 'C', 'H'};
constexpr char kEndMagic[8] = {'T', 'N', 'D', 'M', 'C', 'E', 'N', 'D'};
constexpr uint32_t kVersion = 1;
constexpr int kMaxRank = 16;
constexpr size_t kFooterBytes = 8 + 8 + sizeof(kEndMagic);

template <typename T>
void append(std::string& out, T value) {
  out.append(reinterpret_cast<const char*>(&value), sizeof(T));
}

std::string errno_text() { return std::strerror(errno); }

class FileCache final : public CacheStore {
 public:
  FileCache(std::string filename, std::string signature, int64_t expected)
      : filename_(std::move(filename)), signature_(std::move(signature)), expected_(expected) {}
  ~FileCache() override {
    if (write_fd_ >= 0) {
      ::close(write_fd_);
      ::unlink(temp_.c_str());  // never completed: nothing of it stays
    }
    if (read_fd_ >= 0) ::close(read_fd_);
  }

  std::optional<int64_t> complete() override {
    std::lock_guard<std::mutex> lock(mutex_);
    open_existing();
    return complete_;
  }

  void get(int64_t i, Element& out) override {
    uint64_t at = 0, end = 0;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      TANDEM_CHECK(complete_ && i >= 0 && i < *complete_, "internal error: cache element ", i,
                   " read before the cache is complete");
      at = static_cast<uint64_t>(offsets_[static_cast<size_t>(i)]);
      end = data_end_;
    }
    uint32_t tensors = 0;
    read_at(&tensors, sizeof tensors, at, end, i);
    at += sizeof tensors;
    TANDEM_CHECK(tensors <= 1024, "cache file '", filename_, "': element ", i, " claims ", tensors,
                 " tensors (the file is damaged; delete it)");
    out.clear();
    for (uint32_t t = 0; t < tensors; ++t) {
      uint8_t head[2];
      read_at(head, sizeof head, at, end, i);
      at += sizeof head;
      TANDEM_CHECK(head[0] <= static_cast<uint8_t>(DType::kFloat16) && head[1] <= kMaxRank,
                   "cache file '", filename_, "': element ", i, " has a bad dtype or rank (the ",
                   "file is damaged; delete it)");
      std::vector<int64_t> dims(head[1]);
      read_at(dims.data(), dims.size() * sizeof(int64_t), at, end, i);
      at += dims.size() * sizeof(int64_t);
      uint64_t numel = 1;
      for (const int64_t d : dims) {
        TANDEM_CHECK(d >= 0 && (d == 0 || numel <= (end - at) / static_cast<uint64_t>(d)),
                     "cache file '", filename_, "': element ", i, " has a bad shape (the file is ",
                     "damaged; delete it)");
        numel *= static_cast<uint64_t>(d);
      }
      Tensor tensor = Tensor::empty(Shape(dims), static_cast<DType>(head[0]));
      read_at(tensor.raw_data(), tensor.nbytes(), at, end, i);
      at += tensor.nbytes();
      out.push_back(std::move(tensor));
    }
  }

  void put(int64_t i, const Element& element) override {
    std::lock_guard<std::mutex> lock(mutex_);
    open_existing();
    if (complete_) return;
    if (static_cast<size_t>(i) >= offsets_.size()) offsets_.resize(static_cast<size_t>(i) + 1, -1);
    if (offsets_[static_cast<size_t>(i)] >= 0) return;
    if (write_fd_ < 0) start_writing();
    std::string record;
    append<uint32_t>(record, static_cast<uint32_t>(element.size()));
    for (const Tensor& tensor : element) {
      const Tensor host = tensor.to(Device::cpu());
      append<uint8_t>(record, static_cast<uint8_t>(host.dtype()));
      append<uint8_t>(record, static_cast<uint8_t>(host.rank()));
      for (int64_t d = 0; d < host.rank(); ++d) append<int64_t>(record, host.dim(d));
      record.append(static_cast<const char*>(host.raw_data()), host.nbytes());
    }
    offsets_[static_cast<size_t>(i)] = static_cast<int64_t>(written_);
    write_all(record);
    ++kept_;
    if (expected_ >= 0 && kept_ == expected_) seal(expected_);
  }

  void finish(int64_t count) override {
    std::lock_guard<std::mutex> lock(mutex_);
    open_existing();
    if (complete_) return;
    if (count == 0 && write_fd_ < 0) start_writing();
    for (int64_t i = 0; i < count; ++i)
      TANDEM_CHECK(
          static_cast<size_t>(i) < offsets_.size() && offsets_[static_cast<size_t>(i)] >= 0,
          "internal error: cache pass ended without element ", i);
    seal(count);
  }

 private:
  /// On first use (a dataset that is never read, such as the global pipeline a worker's share is
  /// made from, never opens the file): reads the file when it exists.
  void open_existing() {
    if (looked_) return;
    looked_ = true;
    const int fd = ::open(filename_.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      TANDEM_CHECK(errno == ENOENT, "cache: cannot open '", filename_, "': ", errno_text());
      return;
    }
    read_fd_ = fd;
    open_complete();
  }

  void start_writing() {
    static std::atomic<int> counter{0};
    temp_ = filename_ + ".tmp-" + std::to_string(::getpid()) + "-" + std::to_string(counter++);
    write_fd_ = ::open(temp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    TANDEM_CHECK(write_fd_ >= 0, "cache: cannot create '", temp_, "': ", errno_text());
    std::string header(kMagic, sizeof kMagic);
    append<uint32_t>(header, kVersion);
    append<uint32_t>(header, static_cast<uint32_t>(signature_.size()));
    header += signature_;
    write_all(header);
  }

  void write_all(const std::string& bytes) {
    size_t done = 0;
    while (done < bytes.size()) {
      const ssize_t n = ::write(write_fd_, bytes.data() + done, bytes.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        const std::string why = errno_text();
        ::close(write_fd_);
        write_fd_ = -1;
        ::unlink(temp_.c_str());
        TANDEM_THROW("cache: cannot write '", temp_, "': ", why, " (nothing is kept in '",
                     filename_, "')");
      }
      done += static_cast<size_t>(n);
    }
    written_ += bytes.size();
  }

  /// Writes the table and renames the file into place; then reads from it.
  void seal(int64_t count) {
    const uint64_t table = written_;
    std::string footer;
    for (int64_t i = 0; i < count; ++i) append<int64_t>(footer, offsets_[static_cast<size_t>(i)]);
    append<uint64_t>(footer, static_cast<uint64_t>(count));
    append<uint64_t>(footer, table);
    footer.append(kEndMagic, sizeof kEndMagic);
    write_all(footer);
    const int fd = write_fd_;
    write_fd_ = -1;
    const bool ok = ::fsync(fd) == 0 && ::close(fd) == 0;
    if (!ok || std::rename(temp_.c_str(), filename_.c_str()) != 0) {
      const std::string why = errno_text();
      ::unlink(temp_.c_str());
      TANDEM_THROW("cache: cannot write '", filename_, "': ", why);
    }
    read_fd_ = ::open(filename_.c_str(), O_RDONLY | O_CLOEXEC);
    TANDEM_CHECK(read_fd_ >= 0, "cache: cannot open '", filename_, "': ", errno_text());
    offsets_.resize(static_cast<size_t>(count));
    data_end_ = table;
    complete_ = count;
  }

  /// Checks a file written earlier and reads its table.
  void open_complete() {
    struct stat st {};
    TANDEM_CHECK(::fstat(read_fd_, &st) == 0, "cache: cannot stat '", filename_, "'");
    const auto size = static_cast<uint64_t>(st.st_size);
    const auto damaged = [&](const std::string& what) {
      TANDEM_THROW("cache file '", filename_, "' is not a complete cache file (", what,
                   "); delete it to write it again");
    };
    if (size < sizeof kMagic + 8 + kFooterBytes) damaged("too short");
    char magic[8];
    uint32_t version = 0, signature_size = 0;
    pread_exact(magic, 8, 0);
    pread_exact(&version, 4, 8);
    pread_exact(&signature_size, 4, 12);
    if (std::memcmp(magic, kMagic, 8) != 0) damaged("no header");
    if (version != kVersion) damaged("version " + std::to_string(version));
    const uint64_t header_end = 16 + uint64_t{signature_size};
    if (header_end + kFooterBytes > size) damaged("truncated header");
    std::string signature(signature_size, '\0');
    pread_exact(signature.data(), signature_size, 16);
    uint64_t count = 0, table = 0;
    char end[8];
    pread_exact(&count, 8, size - kFooterBytes);
    pread_exact(&table, 8, size - kFooterBytes + 8);
    pread_exact(end, 8, size - 8);
    if (std::memcmp(end, kEndMagic, 8) != 0) damaged("no end marker: written in part?");
    if (table < header_end || count > (size - kFooterBytes - table) / 8 ||
        table + count * 8 + kFooterBytes != size)
      damaged("bad table");
    TANDEM_CHECK(signature == signature_, "cache file '", filename_, "' was written by another ",
                 "pipeline (", signature, "), not this one (", signature_,
                 "); delete it or name another file");
    TANDEM_CHECK(expected_ < 0 || static_cast<int64_t>(count) == expected_, "cache file '",
                 filename_, "' holds ", count, " elements; its input has ", expected_);
    offsets_.resize(count);
    if (count > 0) pread_exact(offsets_.data(), count * 8, table);
    for (const int64_t offset : offsets_)
      if (offset < static_cast<int64_t>(header_end) || static_cast<uint64_t>(offset) >= table)
        damaged("an element outside the data");
    data_end_ = table;
    complete_ = static_cast<int64_t>(count);
  }

  void pread_exact(void* out, size_t bytes, uint64_t at) const {
    size_t done = 0;
    while (done < bytes) {
      const ssize_t n = ::pread(read_fd_, static_cast<char*>(out) + done, bytes - done,
                                static_cast<off_t>(at + done));
      if (n < 0 && errno == EINTR) continue;
      TANDEM_CHECK(n > 0, "cache: cannot read '", filename_, "' at offset ", at + done, ": ",
                   n == 0 ? std::string("end of file") : errno_text());
      done += static_cast<size_t>(n);
    }
  }

  /// `bytes` at `at` of element `i`'s record, which must end before `end`.
  void read_at(void* out, size_t bytes, uint64_t at, uint64_t end, int64_t i) const {
    TANDEM_CHECK(at <= end && bytes <= end - at, "cache file '", filename_, "': element ", i,
                 " runs past the data at offset ", at, " (the file is damaged; delete it)");
    if (bytes > 0) pread_exact(out, bytes, at);
  }

  std::string filename_;
  std::string signature_;
  int64_t expected_;
  std::mutex mutex_;
  bool looked_ = false;  // open_existing() ran
  std::optional<int64_t> complete_;
  std::vector<int64_t> offsets_;  // each element's record; -1: not written yet
  int64_t kept_ = 0;
  std::string temp_;
  int write_fd_ = -1;
  uint64_t written_ = 0;
  int read_fd_ = -1;
  uint64_t data_end_ = 0;  // where the records end (the table's offset)
};

}  // namespace

std::shared_ptr<CacheStore> make_file_cache(std::string filename, std::string signature,
                                            int64_t expected) {
  return std::make_shared<FileCache>(std::move(filename), std::move(signature), expected);
}

}  // namespace tandem::data::detail
