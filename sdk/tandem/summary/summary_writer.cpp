// TensorBoard summaries (summary_writer.h).
#include "tandem/summary/summary_writer.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <mutex>

#include "tandem/autograd/variable.h"
#include "tandem/core/error.h"
#include "tandem/summary/internal/event_file.h"

namespace tandem::summary {

namespace fs = std::filesystem;

namespace {

// Numbers the event files of this process: two writers of one folder in the same second
// (training and evaluation, say) never pick the same name.
std::atomic<int> g_files{0};

double wall_time() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

struct Writer::Impl {
  std::string logdir;
  WriterOptions options;
  std::mutex mutex;
  FILE* file = nullptr;
  std::string path;
  int64_t file_bytes = 0;  // of the current file, written or pending
  std::string pending;     // records not yet handed to the file
  std::chrono::steady_clock::time_point last_flush = std::chrono::steady_clock::now();

  void open_next() {
    if (file) std::fclose(file);
    file = nullptr;
    std::error_code ec;
    fs::create_directories(logdir, ec);
    TANDEM_CHECK(!ec && fs::is_directory(logdir), "summary::Writer: cannot make the log folder \"",
                 logdir, "\": ", ec ? ec.message() : "it exists and is not a folder");
    char host[256] = {};
    ::gethostname(host, sizeof(host) - 1);
    char counter[16];
    std::snprintf(counter, sizeof(counter), "%04d", g_files.fetch_add(1));
    const double now = wall_time();
    path = (fs::path(logdir) / ("events.out.tfevents." + std::to_string(static_cast<int64_t>(now)) +
                                "." + host + "." + std::to_string(::getpid()) + "." + counter))
               .string();
    file = std::fopen(path.c_str(), "wbx");  // never over another writer's file
    TANDEM_CHECK(file != nullptr, "summary::Writer: cannot create \"", path,
                 "\": ", std::strerror(errno));
    pending = detail::tfrecord(detail::file_version_event(now));
    file_bytes = static_cast<int64_t>(pending.size());
  }

  /// Adds one encoded Event (under the mutex).
  void add(const std::string& event) {
    if (!file || (options.max_file_bytes > 0 && file_bytes >= options.max_file_bytes)) {
      write_pending();
      open_next();
    }
    const std::string record = detail::tfrecord(event);
    pending += record;
    file_bytes += static_cast<int64_t>(record.size());
    if (std::chrono::steady_clock::now() - last_flush >=
        std::chrono::duration<double>(options.flush_seconds))
      write_pending();
  }

  void write_pending() {
    last_flush = std::chrono::steady_clock::now();
    if (!file || pending.empty()) return;
    const size_t written = std::fwrite(pending.data(), 1, pending.size(), file);
    const bool flushed = std::fflush(file) == 0;
    const int error = errno;
    const size_t size = pending.size();
    pending.clear();
    if (written != size || !flushed) {
      // A record cut short would hide every later one from TensorBoard: the next record
      // starts a new file.
      std::fclose(file);
      file = nullptr;
      TANDEM_THROW("summary::Writer: writing \"", path, "\" failed: ", std::strerror(error),
                   "; the records written before are intact, the next goes to a new file");
    }
  }
};

Writer::Writer(std::string logdir, WriterOptions options) : impl_(std::make_unique<Impl>()) {
  TANDEM_CHECK(!logdir.empty(), "summary::Writer: the log folder is empty");
  TANDEM_CHECK(options.flush_seconds >= 0 && std::isfinite(options.flush_seconds),
               "summary::Writer: flush_seconds ", options.flush_seconds, " must be >= 0");
  TANDEM_CHECK(options.max_file_bytes >= 0, "summary::Writer: max_file_bytes ",
               options.max_file_bytes, " must be >= 0");
  std::error_code ec;
  TANDEM_CHECK(!fs::exists(logdir, ec) || fs::is_directory(logdir, ec), "summary::Writer: \"",
               logdir, "\" exists and is not a folder");
  impl_->logdir = std::move(logdir);
  impl_->options = options;
}

Writer::~Writer() {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  try {
    impl_->write_pending();
  } catch (const std::exception&) {
    // A destructor does not raise; flush() is where a failed write is reported.
  }
  if (impl_->file) std::fclose(impl_->file);
}

bool Writer::writes_here() {
  return process_replica_offset() == 0 && current_replica_binding().replica_id == 0;
}

void Writer::scalar(const std::string& tag, int64_t step, double value) {
  if (!writes_here()) return;
  const std::string event = detail::scalar_event(wall_time(), step, tag, static_cast<float>(value));
  std::lock_guard<std::mutex> lock(impl_->mutex);
  impl_->add(event);
}

void Writer::histogram(const std::string& tag, int64_t step, const Tensor& values, int buckets) {
  if (!writes_here()) return;
  TANDEM_CHECK(values.defined(), "summary::Writer::histogram(\"", tag, "\"): undefined tensor");
  histogram(tag, step, values.to_vector<double>(), buckets);
}

void Writer::histogram(const std::string& tag, int64_t step, const std::vector<double>& values,
                       int buckets) {
  if (!writes_here()) return;
  TANDEM_CHECK(buckets >= 1, "summary::Writer::histogram(\"", tag, "\"): buckets ", buckets,
               " must be >= 1");
  detail::Histogram h;
  if (!values.empty()) {
    h.min = values[0];
    h.max = values[0];
  }
  for (size_t i = 0; i < values.size(); ++i) {
    const double v = values[i];
    TANDEM_CHECK(std::isfinite(v), "summary::Writer::histogram(\"", tag, "\"): value ", v,
                 " at index ", i, " is not finite");
    h.min = std::min(h.min, v);
    h.max = std::max(h.max, v);
    h.sum += v;
    h.sum_squares += v * v;
  }
  h.num = static_cast<double>(values.size());
  const int count = values.empty() || h.min == h.max ? 1 : buckets;
  const double width = (h.max - h.min) / count;
  h.bucket.assign(static_cast<size_t>(count), 0.0);
  for (int b = 0; b < count; ++b)
    h.bucket_limit.push_back(b + 1 == count ? h.max : h.min + width * (b + 1));
  for (const double v : values) {
    const int b = width > 0 ? std::min(count - 1, static_cast<int>((v - h.min) / width)) : 0;
    h.bucket[static_cast<size_t>(b)] += 1;
  }
  const std::string event = detail::histogram_event(wall_time(), step, tag, h);
  std::lock_guard<std::mutex> lock(impl_->mutex);
  impl_->add(event);
}

void Writer::text(const std::string& tag, int64_t step, const std::string& text) {
  if (!writes_here()) return;
  const std::string event = detail::text_event(wall_time(), step, tag, text);
  std::lock_guard<std::mutex> lock(impl_->mutex);
  impl_->add(event);
}

void Writer::flush() {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  impl_->write_pending();
}

const std::string& Writer::logdir() const { return impl_->logdir; }

std::string Writer::current_file() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  return impl_->file ? impl_->path : "";
}

}  // namespace tandem::summary
