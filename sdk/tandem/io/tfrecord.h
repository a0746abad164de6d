// TFRecord files, as TensorFlow writes and reads them (tf.io.TFRecordWriter,
// tf.data.TFRecordDataset): records framed as a little-endian uint64 length, the masked
// CRC-32C of those 8 bytes, the data and the masked CRC-32C of the data; the whole stream
// optionally compressed with GZIP or ZLIB. Both CRCs are checked on every read.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

namespace tandem::io {

/// A TFRecord file's compression (TensorFlow's compression_type "", "GZIP", "ZLIB").
enum class Compression {
  kNone,  ///< records as they are ("")
  kGzip,  ///< one gzip stream ("GZIP")
  kZlib   ///< one zlib stream ("ZLIB")
};

/// Compression from TensorFlow's names ("", "NONE", "GZIP", "ZLIB"); anything else raises,
/// naming the value.
Compression compression_from_name(std::string_view name);
/// "", "GZIP" or "ZLIB", as TensorFlow names them.
std::string_view compression_name(Compression compression);

/// CRC-32C (Castagnoli) of `data`, with the SSE 4.2 instruction where the CPU has it.
uint32_t crc32c(std::string_view data);
/// TFRecord's masked form of crc32c(data): ((crc >> 15) | (crc << 17)) + 0xa282ead8.
uint32_t masked_crc32c(std::string_view data);
/// `data` framed as one TFRecord (length, its masked CRC, data, its masked CRC).
std::string tfrecord_frame(std::string_view data);

/// How a TFRecordReader treats a damaged record.
struct TFRecordReadOptions {
  /// The file's compression.
  Compression compression = Compression::kNone;
  /// false: a damaged record raises, naming the file and the record's byte offset. true: a
  /// record whose data CRC is wrong is skipped (counted in damaged_records()); a wrong length
  /// CRC or a truncated record ends the file there (counted as one), since nothing after it
  /// can be framed.
  bool skip_damaged = false;
};

/// Writes a TFRecord file. The file is written in place (as TensorFlow's writer does) and
/// complete once close() returns; errors raise naming the file.
class TFRecordWriter {
 public:
  /// Creates (or truncates) `path`.
  explicit TFRecordWriter(const std::string& path, Compression compression = Compression::kNone);
  /// Closes the file if close() was not called (errors are then only logged).
  ~TFRecordWriter();
  TFRecordWriter(const TFRecordWriter&) = delete;
  TFRecordWriter& operator=(const TFRecordWriter&) = delete;

  /// Appends one record.
  void write(std::string_view record);
  /// Ends the compressed stream and closes the file; raises when the bytes could not be
  /// written.
  void close();
  /// Records written so far.
  int64_t records() const { return records_; }

 private:
  class Sink;
  std::unique_ptr<Sink> sink_;
  int64_t records_ = 0;
};

/// Reads the records of one TFRecord file in order. Offsets are byte offsets into the
/// uncompressed stream (for an uncompressed file, into the file), as TensorFlow reports them.
class TFRecordReader {
 public:
  /// Opens `path`; raises naming it when it cannot be opened.
  explicit TFRecordReader(const std::string& path, TFRecordReadOptions options = {});
  ~TFRecordReader();
  /// Takes over the other reader's file and position.
  TFRecordReader(TFRecordReader&&) noexcept;
  /// Closes this reader's file, then takes over the other's file and position.
  TFRecordReader& operator=(TFRecordReader&&) noexcept;

  /// Reads the next record into `record`; false at the end of the file. A damaged record
  /// raises (see TFRecordReadOptions::skip_damaged): "data CRC mismatch in 'f.tfrecord', record
  /// at offset 1234".
  bool next(std::string& record);
  /// Reads the next record's frame and skips its data unchecked (faster than next() on an
  /// uncompressed file: a seek); false at the end. The length's CRC is checked.
  bool skip_next();
  /// Offset of the record next() reads next.
  uint64_t offset() const;
  /// Moves to `offset`, the start of a record (an offset() seen before). Backwards on a
  /// compressed file, this reopens it and decompresses up to there.
  void seek(uint64_t offset);
  /// Records skipped as damaged (skip_damaged only).
  int64_t damaged_records() const { return damaged_; }
  /// The file's path.
  const std::string& path() const { return path_; }

 private:
  class Source;
  bool read_frame(uint64_t& length);
  [[noreturn]] void fail(uint64_t at, const std::string& what) const;
  std::string path_;
  TFRecordReadOptions options_;
  std::unique_ptr<Source> source_;
  int64_t damaged_ = 0;
  bool ended_ = false;
};

}  // namespace tandem::io
