// TFRecord reading and writing (tfrecord.h): a byte source (the file, or zlib inflating it)
// under a reader that frames and checks records, and a byte sink (the file, or zlib deflating
// into it) under the writer.
#include "tandem/io/tfrecord.h"

#include <zlib.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <vector>

#include "tandem/core/error.h"
#include "tandem/core/logging.h"

namespace tandem::io {

namespace {

std::array<uint32_t, 256> crc32c_table() {
  std::array<uint32_t, 256> table{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t crc = i;
    for (int bit = 0; bit < 8; ++bit) crc = (crc >> 1) ^ ((crc & 1) ? 0x82F63B78u : 0u);
    table[i] = crc;
  }
  return table;
}

uint32_t crc32c_portable(uint32_t crc, const unsigned char* p, size_t n) {
  static const std::array<uint32_t, 256> table = crc32c_table();
  for (size_t i = 0; i < n; ++i) crc = table[(crc ^ p[i]) & 0xff] ^ (crc >> 8);
  return crc;
}

#if defined(__x86_64__)
[[gnu::target("sse4.2")]] uint32_t crc32c_sse42(uint32_t crc, const unsigned char* p, size_t n) {
  uint64_t c = crc;
  for (; n >= 8; n -= 8, p += 8) {
    uint64_t word;
    std::memcpy(&word, p, 8);
    c = __builtin_ia32_crc32di(c, word);
  }
  auto c32 = static_cast<uint32_t>(c);
  for (; n > 0; --n, ++p) c32 = __builtin_ia32_crc32qi(c32, *p);
  return c32;
}
const bool kHaveSse42 = __builtin_cpu_supports("sse4.2");
#endif

uint32_t crc32c_update(uint32_t crc, const void* data, size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
#if defined(__x86_64__)
  if (kHaveSse42) return crc32c_sse42(crc, p, n);
#endif
  return crc32c_portable(crc, p, n);
}

uint32_t mask(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }

uint32_t masked(const void* data, size_t n) {
  return mask(crc32c_update(0xFFFFFFFFu, data, n) ^ 0xFFFFFFFFu);
}

uint64_t load_le64(const unsigned char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

uint32_t load_le32(const unsigned char* p) {
  return uint32_t{p[0]} | uint32_t{p[1]} << 8 | uint32_t{p[2]} << 16 | uint32_t{p[3]} << 24;
}

void store_le(unsigned char* p, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) p[i] = static_cast<unsigned char>(v >> (8 * i));
}

/// zlib's window bits for a compressed TFRecord stream (gzip: 16 more).
int window_bits(Compression compression) {
  return compression == Compression::kGzip ? MAX_WBITS + 16 : MAX_WBITS;
}

std::string system_error() { return std::strerror(errno); }

using File = std::unique_ptr<FILE, int (*)(FILE*)>;

File open_file(const std::string& path, const char* mode, const char* what) {
  File file(std::fopen(path.c_str(), mode), std::fclose);
  TANDEM_CHECK(file != nullptr, what, ": cannot open '", path, "': ", system_error());
  return file;
}

constexpr size_t kBufferBytes = size_t{1} << 18;

}  // namespace

Compression compression_from_name(std::string_view name) {
  if (name.empty() || name == "NONE") return Compression::kNone;
  if (name == "GZIP") return Compression::kGzip;
  if (name == "ZLIB") return Compression::kZlib;
  TANDEM_THROW("TFRecord compression must be \"\", \"GZIP\" or \"ZLIB\", got \"", name, "\"");
}

std::string_view compression_name(Compression compression) {
  switch (compression) {
    case Compression::kGzip:
      return "GZIP";
    case Compression::kZlib:
      return "ZLIB";
    case Compression::kNone:
      break;
  }
  return "";
}

uint32_t crc32c(std::string_view data) {
  return crc32c_update(0xFFFFFFFFu, data.data(), data.size()) ^ 0xFFFFFFFFu;
}

uint32_t masked_crc32c(std::string_view data) { return masked(data.data(), data.size()); }

std::string tfrecord_frame(std::string_view data) {
  std::string out(data.size() + 16, '\0');
  auto* p = reinterpret_cast<unsigned char*>(out.data());
  store_le(p, data.size(), 8);
  store_le(p + 8, masked(p, 8), 4);
  if (!data.empty()) std::memcpy(p + 12, data.data(), data.size());
  store_le(p + 12 + data.size(), masked_crc32c(data), 4);
  return out;
}

// ---- writing ---------------------------------------------------------------------------------

class TFRecordWriter::Sink {
 public:
  Sink(const std::string& path, Compression compression)
      : path_(path),
        compression_(compression),
        file_(open_file(path, "wb", "TFRecordWriter")),
        out_(kBufferBytes) {
    if (compression_ == Compression::kNone) return;
    const int rc = deflateInit2(&stream_, Z_DEFAULT_COMPRESSION, Z_DEFLATED,
                                window_bits(compression_), 8, Z_DEFAULT_STRATEGY);
    TANDEM_CHECK(rc == Z_OK, "TFRecordWriter: zlib cannot start a ", compression_name(compression_),
                 " stream for '", path_, "' (zlib error ", rc, ")");
    deflating_ = true;
  }
  ~Sink() {
    if (deflating_) deflateEnd(&stream_);
  }

  void write(const void* data, size_t n) {
    if (compression_ == Compression::kNone) {
      put(data, n);
      return;
    }
    while (n > 0) {
      const auto chunk = static_cast<uInt>(std::min<size_t>(n, uInt{1} << 30));
      stream_.next_in = static_cast<Bytef*>(const_cast<void*>(data));
      stream_.avail_in = chunk;
      deflate_all(Z_NO_FLUSH);
      data = static_cast<const char*>(data) + chunk;
      n -= chunk;
    }
  }

  void close() {
    if (deflating_) {
      stream_.avail_in = 0;
      deflate_all(Z_FINISH);
    }
    File file = std::move(file_);
    TANDEM_CHECK(std::fflush(file.get()) == 0, "TFRecordWriter: cannot write '", path_,
                 "': ", system_error());
    TANDEM_CHECK(std::fclose(file.release()) == 0, "TFRecordWriter: cannot close '", path_,
                 "': ", system_error());
  }
  bool open() const { return file_ != nullptr; }

 private:
  void put(const void* data, size_t n) {
    TANDEM_CHECK(std::fwrite(data, 1, n, file_.get()) == n, "TFRecordWriter: cannot write '", path_,
                 "': ", system_error());
  }
  void deflate_all(int flush) {
    int rc;
    do {
      stream_.next_out = out_.data();
      stream_.avail_out = static_cast<uInt>(out_.size());
      rc = deflate(&stream_, flush);
      TANDEM_CHECK(rc != Z_STREAM_ERROR, "TFRecordWriter: zlib failed compressing '", path_, "'");
      put(out_.data(), out_.size() - stream_.avail_out);
    } while (stream_.avail_out == 0 || (flush == Z_FINISH && rc != Z_STREAM_END));
  }

  std::string path_;
  Compression compression_;
  File file_;
  std::vector<Bytef> out_;
  z_stream stream_{};
  bool deflating_ = false;
};

TFRecordWriter::TFRecordWriter(const std::string& path, Compression compression)
    : sink_(std::make_unique<Sink>(path, compression)) {}

TFRecordWriter::~TFRecordWriter() {
  if (!sink_ || !sink_->open()) return;
  try {
    sink_->close();
  } catch (const std::exception& e) {
    TANDEM_LOG_ERROR(e.what());
  }
}

void TFRecordWriter::write(std::string_view record) {
  TANDEM_CHECK(sink_->open(), "TFRecordWriter: write after close()");
  unsigned char header[12];
  store_le(header, record.size(), 8);
  store_le(header + 8, masked(header, 8), 4);
  unsigned char footer[4];
  store_le(footer, masked_crc32c(record), 4);
  sink_->write(header, sizeof header);
  sink_->write(record.data(), record.size());
  sink_->write(footer, sizeof footer);
  ++records_;
}

void TFRecordWriter::close() {
  if (sink_->open()) sink_->close();
}

// ---- reading ---------------------------------------------------------------------------------

/// The file's bytes in order (inflated when compressed), with their offset.
class TFRecordReader::Source {
 public:
  Source(const std::string& path, Compression compression)
      : path_(path), compression_(compression), file_(open_file(path, "rb", "TFRecordReader")) {
    std::setvbuf(file_.get(), nullptr, _IOFBF, kBufferBytes);
    if (compression_ != Compression::kNone) start_inflate();
  }
  ~Source() {
    if (inflating_) inflateEnd(&stream_);
  }

  /// Reads up to n bytes; fewer only at the end of the stream.
  size_t read(void* out, size_t n) {
    const size_t got = compression_ == Compression::kNone ? read_plain(out, n) : inflate_to(out, n);
    offset_ += got;
    return got;
  }
  /// Skips up to n bytes; fewer only at the end of the stream.
  uint64_t skip(uint64_t n) {
    if (compression_ == Compression::kNone) {
      const uint64_t left = size() - std::min(size(), offset_);
      const uint64_t step = std::min(n, left);
      seek(offset_ + step);
      return step;
    }
    std::vector<char> scratch(std::min<uint64_t>(n, kBufferBytes));
    uint64_t done = 0;
    while (done < n) {
      const size_t got = read(scratch.data(), std::min<uint64_t>(n - done, scratch.size()));
      done += got;
      if (got == 0) break;
    }
    return done;
  }
  void seek(uint64_t offset) {
    if (compression_ == Compression::kNone) {
      TANDEM_CHECK(fseeko(file_.get(), static_cast<off_t>(offset), SEEK_SET) == 0,
                   "TFRecordReader: cannot seek in '", path_, "': ", system_error());
      offset_ = offset;
      return;
    }
    if (offset < offset_) {
      inflateEnd(&stream_);
      inflating_ = false;
      std::rewind(file_.get());
      offset_ = 0;
      start_inflate();
    }
    const uint64_t want = offset - offset_;
    TANDEM_CHECK(skip(want) == want, "TFRecordReader: offset ", offset, " lies beyond the end of '",
                 path_, "'");
  }
  uint64_t offset() const { return offset_; }
  bool compressed() const { return compression_ != Compression::kNone; }
  /// The file's size in bytes (uncompressed files).
  uint64_t size() {
    if (size_ < 0) {
      const off_t here = ftello(file_.get());
      fseeko(file_.get(), 0, SEEK_END);
      size_ = ftello(file_.get());
      fseeko(file_.get(), here, SEEK_SET);
    }
    return static_cast<uint64_t>(size_);
  }

 private:
  size_t read_plain(void* out, size_t n) {
    const size_t got = std::fread(out, 1, n, file_.get());
    TANDEM_CHECK(got == n || !std::ferror(file_.get()), "TFRecordReader: cannot read '", path_,
                 "': ", system_error());
    return got;
  }
  void start_inflate() {
    stream_ = z_stream{};
    in_.resize(kBufferBytes);
    const int rc = inflateInit2(&stream_, window_bits(compression_));
    TANDEM_CHECK(rc == Z_OK, "TFRecordReader: zlib cannot start reading '", path_, "' (zlib error ",
                 rc, ")");
    inflating_ = true;
    ended_ = false;
  }
  size_t inflate_to(void* out, size_t n) {
    stream_.next_out = static_cast<Bytef*>(out);
    stream_.avail_out = static_cast<uInt>(n);
    while (stream_.avail_out > 0 && !ended_) {
      if (stream_.avail_in == 0) {
        const size_t got = read_plain(in_.data(), in_.size());
        stream_.next_in = in_.data();
        stream_.avail_in = static_cast<uInt>(got);
        if (got == 0) {
          TANDEM_THROW("TFRecordReader: '", path_, "' ends inside its ",
                       compression_name(compression_),
                       " stream (truncated file?) at uncompressed offset ",
                       offset_ + (n - stream_.avail_out));
        }
      }
      const int rc = inflate(&stream_, Z_NO_FLUSH);
      if (rc == Z_STREAM_END) {
        // gzip files may hold several members one after another.
        if (compression_ == Compression::kGzip && more_input()) {
          inflateReset(&stream_);
          continue;
        }
        ended_ = true;
        break;
      }
      TANDEM_CHECK(rc == Z_OK || rc == Z_BUF_ERROR, "TFRecordReader: corrupt ",
                   compression_name(compression_), " data in '", path_,
                   "' near uncompressed offset ", offset_ + (n - stream_.avail_out),
                   " (zlib: ", stream_.msg ? stream_.msg : "error " + std::to_string(rc), ")");
    }
    return n - stream_.avail_out;
  }
  bool more_input() {
    if (stream_.avail_in > 0) return true;
    const size_t got = read_plain(in_.data(), in_.size());
    stream_.next_in = in_.data();
    stream_.avail_in = static_cast<uInt>(got);
    return got > 0;
  }

  std::string path_;
  Compression compression_;
  File file_;
  uint64_t offset_ = 0;
  int64_t size_ = -1;
  z_stream stream_{};
  std::vector<Bytef> in_;
  bool inflating_ = false;
  bool ended_ = false;
};

TFRecordReader::TFRecordReader(const std::string& path, TFRecordReadOptions options)
    : path_(path),
      options_(options),
      source_(std::make_unique<Source>(path, options.compression)) {}

TFRecordReader::~TFRecordReader() = default;
TFRecordReader::TFRecordReader(TFRecordReader&&) noexcept = default;
TFRecordReader& TFRecordReader::operator=(TFRecordReader&&) noexcept = default;

uint64_t TFRecordReader::offset() const { return source_->offset(); }

void TFRecordReader::seek(uint64_t offset) {
  source_->seek(offset);
  ended_ = false;
}

void TFRecordReader::fail(uint64_t at, const std::string& what) const {
  TANDEM_THROW("TFRecordReader: ", what, " in '", path_, "', record at ",
               source_->compressed() ? "uncompressed offset " : "offset ", at,
               " (damaged file; TFRecordReadOptions::skip_damaged skips damaged records)");
}

bool TFRecordReader::read_frame(uint64_t& length) {
  if (ended_) return false;
  const uint64_t at = source_->offset();
  unsigned char header[12];
  const size_t got = source_->read(header, sizeof header);
  if (got == 0) return false;
  const char* problem = nullptr;
  if (got < sizeof header) {
    problem = "truncated record header";
  } else if (load_le32(header + 8) != masked(header, 8)) {
    problem = "length CRC mismatch";
  } else {
    length = load_le64(header);
    // Compared without overflow: a length near 2^64 must not wrap around to a small one.
    const uint64_t left = source_->compressed()
                              ? std::numeric_limits<uint64_t>::max()
                              : source_->size() - std::min(source_->size(), source_->offset());
    if (left < 4 || length > left - 4)
      problem = "truncated record (its length runs past the end of the file)";
  }
  if (problem == nullptr) return true;
  if (!options_.skip_damaged) fail(at, problem);
  TANDEM_LOG_WARNING("TFRecordReader: ", problem, " in '", path_, "', record at offset ", at,
                     ": skipping the rest of the file");
  ++damaged_;
  ended_ = true;
  return false;
}

bool TFRecordReader::next(std::string& record) {
  for (;;) {
    const uint64_t at = source_->offset();
    uint64_t length = 0;
    if (!read_frame(length)) return false;
    // Grown as bytes arrive, so a damaged length in a compressed file cannot allocate more
    // than the stream holds.
    record.clear();
    uint64_t filled = 0;
    bool truncated = false;
    while (filled < length) {
      const uint64_t chunk = std::min<uint64_t>(length - filled, uint64_t{64} << 20);
      record.resize(filled + chunk);
      const size_t got = source_->read(record.data() + filled, chunk);
      filled += got;
      if (got < chunk) {
        truncated = true;
        break;
      }
    }
    unsigned char footer[4];
    if (!truncated && source_->read(footer, 4) < 4) truncated = true;
    if (truncated) {
      if (!options_.skip_damaged) fail(at, "truncated record");
      TANDEM_LOG_WARNING("TFRecordReader: truncated record in '", path_, "' at offset ", at);
      ++damaged_;
      ended_ = true;
      return false;
    }
    if (load_le32(footer) == masked_crc32c(record)) return true;
    if (!options_.skip_damaged) fail(at, "data CRC mismatch");
    TANDEM_LOG_WARNING("TFRecordReader: data CRC mismatch in '", path_, "', record at offset ", at,
                       ": skipped");
    ++damaged_;
  }
}

bool TFRecordReader::skip_next() {
  const uint64_t at = source_->offset();
  uint64_t length = 0;
  if (!read_frame(length)) return false;
  if (source_->skip(length + 4) < length + 4) {
    if (!options_.skip_damaged) fail(at, "truncated record");
    ++damaged_;
    ended_ = true;
    return false;
  }
  return true;
}

}  // namespace tandem::io
