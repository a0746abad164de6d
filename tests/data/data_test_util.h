// Helpers shared by the data tests: collecting int64 datasets into plain vectors and a
// temporary directory that removes itself.
#pragma once

#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include "tandem/tandem.h"

namespace tandem::data::testing {

/// Tensor 0 of every element, as int64 values, concatenated (for range-based pipelines).
inline std::vector<int64_t> flat_values(Iterator& it, int64_t max_elements = -1) {
  std::vector<int64_t> out;
  Element e;
  for (int64_t n = 0; (max_elements < 0 || n < max_elements) && it.next(e); ++n) {
    const std::vector<int64_t> v = e[0].to_vector<int64_t>();
    out.insert(out.end(), v.begin(), v.end());
  }
  return out;
}

inline std::vector<int64_t> flat_values(const Dataset& ds) {
  Iterator it = ds.iterator();
  return flat_values(it);
}

/// Tensor 0 of every element (each a batch), one vector per element.
inline std::vector<std::vector<int64_t>> batches_of(Iterator& it, int64_t max_batches = -1) {
  std::vector<std::vector<int64_t>> out;
  Element e;
  for (int64_t n = 0; (max_batches < 0 || n < max_batches) && it.next(e); ++n)
    out.push_back(e[0].to_vector<int64_t>());
  return out;
}

inline std::vector<std::vector<int64_t>> batches_of(const Dataset& ds) {
  Iterator it = ds.iterator();
  return batches_of(it);
}

/// A fresh directory under the system temp directory, removed with its contents at the end.
class TempDir {
 public:
  TempDir() {
    static std::atomic<int> counter{0};
    path_ = std::filesystem::temp_directory_path() /
            ("tandem_data_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string file(const std::string& name) const { return (path_ / name).string(); }
  std::string str() const { return path_.string(); }

 private:
  std::filesystem::path path_;
};

/// Uncompressed TFRecord files `dir`/part-<f>.tfrecord of counts[f] Examples {y: int64}, numbered
/// across the files: example n holds y = n. Returns the file names; `all` gets every y.
inline std::vector<std::string> write_numbered_tfrecords(const TempDir& dir,
                                                         const std::vector<int>& counts,
                                                         std::multiset<int64_t>& all) {
  std::vector<std::string> files;
  int64_t n = 0;
  for (size_t f = 0; f < counts.size(); ++f) {
    files.push_back(dir.file("part-" + std::to_string(f) + ".tfrecord"));
    io::TFRecordWriter writer(files.back());
    for (int i = 0; i < counts[f]; ++i, ++n) {
      Example e;
      e.set_int64s("y", {n});
      writer.write(e.serialize());
      all.insert(n);
    }
  }
  return files;
}

}  // namespace tandem::data::testing
