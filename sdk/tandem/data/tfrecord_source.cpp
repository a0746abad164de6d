// data::tfrecord: a random-access source over TFRecord files, indexed by record offsets when
// made; data::list_files.
#include <glob.h>

#include <algorithm>
#include <cstring>
#include <optional>
#include <random>
#include <sstream>

#include "tandem/core/logging.h"
#include "tandem/data/internal/node.h"
#include "tandem/data/tfrecord.h"

namespace tandem::data {
namespace detail {
namespace {

/// The bytes of `text` as a uint8 vector (a record, a file name).
Tensor bytes_tensor(const std::string& text) {
  Tensor out = Tensor::empty(Shape{static_cast<int64_t>(text.size())}, DType::kUInt8);
  if (!text.empty()) std::memcpy(out.raw_data(), text.data(), text.size());
  return out;
}

class TFRecordSource final : public Source, public std::enable_shared_from_this<TFRecordSource> {
 public:
  TFRecordSource(std::vector<std::string> files, io::TFRecordReadOptions options)
      : files_(std::move(files)), options_(options) {
    TANDEM_CHECK(!files_.empty(), "data::tfrecord: no files given");
    first_.push_back(0);
    for (const std::string& path : files_) {
      io::TFRecordReader reader(path, options_);
      std::vector<uint64_t> offsets;
      std::string record;
      for (;;) {
        const uint64_t at = reader.offset();
        // Skipping damaged records means knowing which they are: every record is read whole.
        if (!(options_.skip_damaged ? reader.next(record) : reader.skip_next())) break;
        offsets.push_back(at);
      }
      if (reader.damaged_records() > 0)
        TANDEM_LOG_WARNING("data::tfrecord: ", reader.damaged_records(), " damaged record(s) in '",
                           path, "' left out");
      damaged_ += reader.damaged_records();
      first_.push_back(first_.back() + static_cast<int64_t>(offsets.size()));
      offsets_.push_back(std::move(offsets));
    }
  }

  int64_t size() const override { return first_.back(); }
  bool cheap_random_access() const override {
    return options_.compression == io::Compression::kNone;
  }
  std::vector<TensorSpec> element_spec() const override { return {{Shape{-1}, DType::kUInt8}}; }
  std::string describe() const override {
    std::ostringstream out;
    out << "tfrecord(" << files_.size() << " file(s), " << size() << " records";
    if (options_.compression != io::Compression::kNone)
      out << ", " << io::compression_name(options_.compression);
    if (options_.skip_damaged) out << ", " << damaged_ << " damaged skipped";
    out << ")";
    return out.str();
  }
  std::vector<std::string> files() const override { return files_; }
  std::shared_ptr<const Source> with_files(std::vector<std::string> files) const override {
    return std::make_shared<TFRecordSource>(std::move(files), options_);
  }
  std::unique_ptr<SourceReader> reader() const override;

 private:
  friend class TFRecordSourceReader;
  std::vector<std::string> files_;
  io::TFRecordReadOptions options_;
  std::vector<int64_t> first_;                  // first index of each file; back() = size()
  std::vector<std::vector<uint64_t>> offsets_;  // each file's record offsets
  int64_t damaged_ = 0;
};

/// Keeps the current file open: reading in order is one sequential pass per file.
class TFRecordSourceReader final : public SourceReader {
 public:
  explicit TFRecordSourceReader(std::shared_ptr<const TFRecordSource> source)
      : source_(std::move(source)) {}

  void read(int64_t index, Element& out) override {
    TANDEM_CHECK(index >= 0 && index < source_->size(), "data::tfrecord: record index ", index,
                 " out of range [0, ", source_->size(), ")");
    const auto& first = source_->first_;
    const auto file = static_cast<size_t>(std::upper_bound(first.begin(), first.end(), index) -
                                          first.begin() - 1);
    if (!reader_ || file != file_) {
      // Strict here: a record the index holds is whole, unless the file changed since.
      reader_.emplace(source_->files_[file],
                      io::TFRecordReadOptions{.compression = source_->options_.compression});
      file_ = file;
    }
    const uint64_t offset = source_->offsets_[file][static_cast<size_t>(index - first[file])];
    if (reader_->offset() != offset) reader_->seek(offset);
    TANDEM_CHECK(reader_->next(record_), "data::tfrecord: record ", index - first[file],
                 " at offset ", offset, " of '", source_->files_[file],
                 "' could not be read (the file changed since the dataset was made?)");
    out.resize(1);
    out[0] = bytes_tensor(record_);
  }

 private:
  std::shared_ptr<const TFRecordSource> source_;
  std::optional<io::TFRecordReader> reader_;
  size_t file_ = 0;
  std::string record_;
};

std::unique_ptr<SourceReader> TFRecordSource::reader() const {
  return std::make_unique<TFRecordSourceReader>(shared_from_this());
}

class FileNamesSource final : public Source {
 public:
  explicit FileNamesSource(std::vector<std::string> files) : files_(std::move(files)) {
    TANDEM_CHECK(!files_.empty(), "data::file_names: no files given");
  }
  int64_t size() const override { return static_cast<int64_t>(files_.size()); }
  bool cheap_random_access() const override { return true; }
  std::vector<TensorSpec> element_spec() const override { return {{Shape{-1}, DType::kUInt8}}; }
  std::string describe() const override {
    return "file_names(" + std::to_string(files_.size()) + " file(s))";
  }
  std::vector<std::string> files() const override { return files_; }
  std::shared_ptr<const Source> with_files(std::vector<std::string> files) const override {
    return std::make_shared<FileNamesSource>(std::move(files));
  }
  std::unique_ptr<SourceReader> reader() const override {
    class Reader final : public SourceReader {
     public:
      explicit Reader(const std::vector<std::string>& files) : files_(files) {}
      void read(int64_t index, Element& out) override {
        TANDEM_CHECK(index >= 0 && index < static_cast<int64_t>(files_.size()),
                     "data::file_names: index ", index, " out of range [0, ", files_.size(), ")");
        out = {bytes_tensor(files_[static_cast<size_t>(index)])};
      }

     private:
      std::vector<std::string> files_;
    };
    return std::make_unique<Reader>(files_);
  }

 private:
  std::vector<std::string> files_;
};

}  // namespace
}  // namespace detail

Dataset tfrecord(std::vector<std::string> files, io::TFRecordReadOptions options) {
  return Dataset(detail::make_source_node(
      std::make_shared<detail::TFRecordSource>(std::move(files), options), "tfrecord"));
}

Dataset file_names(std::vector<std::string> files) {
  return Dataset(detail::make_source_node(
      std::make_shared<detail::FileNamesSource>(std::move(files)), "file_names"));
}

std::string as_string(const Tensor& bytes) {
  TANDEM_CHECK(bytes.defined() && bytes.dtype() == DType::kUInt8 && bytes.rank() == 1,
               "data::as_string: expected a uint8 tensor of rank 1, got ",
               bytes.defined() ? bytes.to_string(0) : std::string("an undefined tensor"));
  const Tensor host = bytes.to(Device::cpu());
  return std::string(static_cast<const char*>(host.raw_data()), host.nbytes());
}

std::vector<std::string> list_files(const std::string& pattern, bool shuffle, uint64_t seed) {
  glob_t found{};
  const int rc = ::glob(pattern.c_str(), GLOB_NOSORT, nullptr, &found);
  std::vector<std::string> files;
  for (size_t i = 0; rc == 0 && i < found.gl_pathc; ++i) files.emplace_back(found.gl_pathv[i]);
  globfree(&found);
  TANDEM_CHECK(rc != GLOB_NOSPACE && rc != GLOB_ABORTED, "data::list_files: cannot read the ",
               "folders of '", pattern, "'");
  TANDEM_CHECK(!files.empty(), "data::list_files: no file matches '", pattern, "'");
  std::sort(files.begin(), files.end());
  if (shuffle) {
    // A Fisher-Yates shuffle on a fixed generator: the same order on every machine.
    std::mt19937_64 rng(seed);
    for (size_t i = files.size() - 1; i > 0; --i)
      std::swap(files[i], files[static_cast<size_t>(rng() % (i + 1))]);
  }
  return files;
}

}  // namespace tandem::data
