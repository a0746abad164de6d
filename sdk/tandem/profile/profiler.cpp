// The Profiler (profile/profiler.h): turns recording on, summarises each epoch when a
// distributed dataset reports its end, and writes the Chrome trace when it ends (with several
// workers, the chief gathers every worker's events first).
#include "tandem/profile/profiler.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <utility>

#include "tandem/core/error.h"
#include "tandem/core/logging.h"
#include "tandem/core/workers.h"
#include "tandem/tensor/device_runtime.h"

namespace tandem::profile {
namespace {

std::atomic<bool> g_profiler_alive{false};

/// A figure for the trace's JSON (the loss scale: a power of two, printed whole).
std::string number(double value) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.17g", value);
  return text;
}

// Thread ids of the tracks in the trace, ordered as they are shown.
constexpr int kLoopTid = 1, kInputTid = 2, kReplicaTid = 100, kCommunicatorTid = 200;

int tid(Track track) {
  switch (track.kind) {
    case TrackKind::kLoop:
      return kLoopTid;
    case TrackKind::kInput:
      return kInputTid;
    case TrackKind::kReplica:
      return kReplicaTid + track.index;
    case TrackKind::kCommunicator:
      return kCommunicatorTid + track.index;
  }
  return kLoopTid;
}

/// A string as a JSON string literal.
std::string json_string(std::string_view text) {
  std::string out = "\"";
  for (const char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char escape[8];
      std::snprintf(escape, sizeof(escape), "\\u%04x", c);
      out += escape;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

std::string microseconds(int64_t ns) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.3f", static_cast<double>(ns) / 1000.0);
  return text;
}

/// The trace's event objects for one worker, comma-separated (no enclosing brackets): names of
/// the process and its tracks first, then every span by start, timestamps from the worker's
/// first event.
std::string trace_events(std::vector<Event> events, const std::vector<std::string>& devices,
                         int worker) {
  // By start: a span still open when earlier ones were taken (the input wait that found the
  // end of an epoch) was recorded after them.
  std::stable_sort(events.begin(), events.end(),
                   [](const Event& a, const Event& b) { return a.begin_ns < b.begin_ns; });
  std::ostringstream out;
  const std::string pid = std::to_string(worker);
  bool first = true;
  auto object = [&](const std::string& body) {
    out << (first ? "" : ",\n") << "{" << body << "}";
    first = false;
  };
  auto name_track = [&](int thread, const std::string& name) {
    object("\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":" + pid +
           ",\"tid\":" + std::to_string(thread) + ",\"args\":{\"name\":" + json_string(name) + "}");
    object("\"ph\":\"M\",\"name\":\"thread_sort_index\",\"pid\":" + pid + ",\"tid\":" +
           std::to_string(thread) + ",\"args\":{\"sort_index\":" + std::to_string(thread) + "}");
  };
  object("\"ph\":\"M\",\"name\":\"process_name\",\"pid\":" + pid +
         ",\"tid\":0,\"args\":{\"name\":" + json_string(detail::str_cat("worker ", worker)) + "}");
  name_track(kLoopTid, "training loop");
  name_track(kInputTid, "input pipeline");
  int replicas = static_cast<int>(devices.size());
  for (const Event& e : events)
    if (e.track.kind == TrackKind::kReplica || e.track.kind == TrackKind::kCommunicator)
      replicas = std::max(replicas, e.track.index + 1);
  for (int r = 0; r < replicas; ++r) {
    const std::string device =
        r < static_cast<int>(devices.size()) ? " (" + devices[static_cast<size_t>(r)] + ")" : "";
    name_track(kReplicaTid + r, detail::str_cat("replica ", r, device));
    name_track(kCommunicatorTid + r, detail::str_cat("communicator ", r));
  }
  const int64_t origin = events.empty() ? 0 : events.front().begin_ns;
  for (const Event& e : events) {
    std::string body =
        "\"name\":" + json_string(phase_name(e.phase)) + ",\"cat\":\"tandem\",\"pid\":" + pid +
        ",\"tid\":" + std::to_string(tid(e.track)) + ",\"ts\":" + microseconds(e.begin_ns - origin);
    if (e.phase == Phase::kLossScale) {
      // A counter: the scale drawn as a line over the run.
      object("\"name\":\"loss scale\",\"cat\":\"tandem\",\"ph\":\"C\",\"pid\":" + pid + ",\"ts\":" +
             microseconds(e.begin_ns - origin) + ",\"args\":{\"scale\":" + number(e.value) + "}");
      continue;
    }
    if (e.phase == Phase::kSkippedUpdate)
      body += ",\"ph\":\"i\",\"s\":\"t\",\"args\":{\"loss_scale\":" + number(e.value) + "}";
    else if (e.phase == Phase::kEpochEnd)
      body += ",\"ph\":\"i\",\"s\":\"t\"";
    else
      body += ",\"ph\":\"X\",\"dur\":" + microseconds(e.end_ns - e.begin_ns);
    if (e.bytes > 0) body += ",\"args\":{\"bytes\":" + std::to_string(e.bytes) + "}";
    object(body);
  }
  return out.str();
}

std::string wrap_trace(const std::string& events) {
  return "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n" + events + "\n]}\n";
}

/// Every worker's `mine`, in worker order, on every worker. Every worker must call it.
std::vector<std::string> gather_from_every_worker(const Strategy& strategy,
                                                  const std::string& mine) {
  if (strategy.num_workers() == 1) return {mine};
  const std::shared_ptr<WorkerGroup> workers = worker_group();
  TANDEM_CHECK(workers != nullptr, "Profiler: the strategy has ", strategy.num_workers(),
               " workers, but no multi-worker strategy lives in this process any more");
  std::vector<std::string> out;
  for (const std::vector<char>& theirs :
       workers->all_gather(std::vector<char>(mine.begin(), mine.end()), "profiler trace"))
    out.emplace_back(theirs.begin(), theirs.end());
  return out;
}

/// "a FIFO", "a directory", ... for a path that exists and is not a regular file; "" else.
std::string non_file_kind(const std::string& path) {
  struct stat info {};
  if (::stat(path.c_str(), &info) != 0 || S_ISREG(info.st_mode)) return "";
  if (S_ISDIR(info.st_mode)) return "a directory";
  if (S_ISFIFO(info.st_mode)) return "a FIFO";
  if (S_ISCHR(info.st_mode) || S_ISBLK(info.st_mode)) return "a device";
  if (S_ISSOCK(info.st_mode)) return "a socket";
  return "not a regular file";
}

/// Creates a temporary file beside `path` that did not exist before (O_EXCL: never an existing
/// FIFO or file of that name, which could block or be clobbered); returns its descriptor and
/// name.
std::pair<int, std::string> create_temporary(const std::string& path) {
  for (int attempt = 0; attempt < 100; ++attempt) {
    const std::string name = detail::str_cat(path, ".tmp.", ::getpid(), ".", attempt);
    const int fd = ::open(name.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd >= 0) return {fd, name};
    TANDEM_CHECK(errno == EEXIST, "Profiler: cannot write the trace file \"", path,
                 "\": ", std::strerror(errno));
  }
  TANDEM_THROW("Profiler: cannot write the trace file \"", path,
               "\": 100 temporary names beside it are taken");
}

/// Raises naming `path` unless a trace can be written there: its folder exists (or can be
/// made) and takes a new file, and `path` is not something other than a regular file.
void check_trace_path(const std::string& path) {
  TANDEM_CHECK(!path.empty() && path.back() != '/', "Profiler: the trace file \"", path,
               "\" names a folder, not a file");
  const std::string kind = non_file_kind(path);
  TANDEM_CHECK(kind.empty(), "Profiler: the trace file \"", path, "\" is ", kind,
               ", not a regular file; name a file (it would not be replaced)");
  const std::filesystem::path target(path);
  if (target.has_parent_path()) {
    std::error_code error;
    std::filesystem::create_directories(target.parent_path(), error);
    TANDEM_CHECK(!error, "Profiler: cannot make the folder of the trace file \"", path,
                 "\": ", error.message());
  }
  const auto [fd, temporary] = create_temporary(path);
  ::close(fd);
  ::unlink(temporary.c_str());
}

/// Writes `text` to `path` through a temporary file, so a reader never sees half a trace; on
/// any failure (a full disk) the temporary file is removed and `path` is left as it was.
void write_file(const std::string& path, const std::string& text) {
  check_trace_path(path);
  const auto [fd, temporary] = create_temporary(path);
  std::string failure;
  for (size_t at = 0; at < text.size() && failure.empty();) {
    const ssize_t n = ::write(fd, text.data() + at, text.size() - at);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) failure = n < 0 ? std::strerror(errno) : "nothing written";
    if (n > 0) at += static_cast<size_t>(n);
  }
  if (failure.empty() && ::fsync(fd) != 0) failure = std::strerror(errno);
  if (::close(fd) != 0 && failure.empty()) failure = std::strerror(errno);
  if (failure.empty() && !non_file_kind(path).empty())
    failure = "\"" + path + "\" became " + non_file_kind(path) + " meanwhile";
  if (failure.empty() && ::rename(temporary.c_str(), path.c_str()) != 0)
    failure = std::strerror(errno);
  if (!failure.empty()) {
    ::unlink(temporary.c_str());
    TANDEM_THROW("Profiler: writing the trace file \"", path, "\" failed: ", failure);
  }
}

}  // namespace

std::string chrome_trace(const std::vector<Event>& events, const std::vector<std::string>& devices,
                         int worker) {
  return wrap_trace(trace_events(events, devices, worker));
}

struct Profiler::Impl {
  const Strategy& strategy;
  ProfilerOptions options;
  std::vector<std::string> devices;
  std::mutex mutex;
  std::vector<Event> events;
  size_t summarised = 0;  // events[0, summarised) are in a summary already
  std::vector<Summary> summaries;
  int64_t steps_summarised = 0;

  Impl(const Strategy& s, ProfilerOptions o) : strategy(s), options(std::move(o)) {
    for (const Device& d : s.devices()) devices.push_back(d.to_string());
  }

  /// The largest of every local replica's figures, field by field.
  optim::ReplicaMemory most_held() const {
    optim::ReplicaMemory most;
    for (int r = 0; r < strategy.num_local_replicas(); ++r) {
      const optim::ReplicaMemory m = options.optimizer->memory_of(process_replica_offset() + r);
      most.parameters = std::max(most.parameters, m.parameters);
      most.gradients = std::max(most.gradients, m.gradients);
      most.optimizer_state = std::max(most.optimizer_state, m.optimizer_state);
    }
    return most;
  }

  Summary summarise_new(std::vector<Event> fresh) {
    std::lock_guard<std::mutex> lock(mutex);
    events.insert(events.end(), fresh.begin(), fresh.end());
    const std::vector<Event> window(events.begin() + static_cast<std::ptrdiff_t>(summarised),
                                    events.end());
    summarised = events.size();
    Summary summary = summarize(window, devices);
    if (summary.steps == 0) return summary;
    if (options.optimizer != nullptr) {
      summary.memory = most_held();
      summary.shard_optimizer_state = options.optimizer->shard_optimizer_state();
    }
    if (options.print_summaries)
      TANDEM_LOG_INFO("steps ", steps_summarised + 1, "-", steps_summarised + summary.steps,
                      " (a dataset's epoch ended) ", summary.to_string());
    steps_summarised += summary.steps;
    summaries.push_back(summary);
    if (options.tensorboard) {
      const int64_t step = options.tensorboard_step ? options.tensorboard_step()
                                                    : static_cast<int64_t>(summaries.size());
      write_summary(*options.tensorboard, step, summary);
    }
    return summary;
  }
};

Profiler::Profiler(const Strategy& strategy, ProfilerOptions options) {
  // The chief writes the trace at the end: a path it cannot write fails now, not after training.
  if (!options.trace_file.empty() && strategy.is_chief()) check_trace_path(options.trace_file);
  TANDEM_CHECK(!g_profiler_alive.exchange(true),
               "Profiler: another profiler is recording; end it "
               "before creating a new one");
  impl_ = std::make_unique<Impl>(strategy, std::move(options));
  if (impl_->options.optimizer != nullptr && impl_->options.print_summaries &&
      strategy.is_chief()) {
    const optim::ReplicaMemory memory = impl_->most_held();
    if (memory.parameters > 0)
      TANDEM_LOG_INFO("profile: ",
                      memory_line(memory, impl_->options.optimizer->shard_optimizer_state()));
  }
  install_device_ranges();  // NVTX ranges with CUDA
  start_recording();
  set_epoch_listener([impl = impl_.get()] { impl->summarise_new(take_events()); });
}

std::unique_ptr<Profiler> Profiler::from_environment(const Strategy& strategy) {
  const char* file = std::getenv("TANDEM_PROFILE");
  if (file == nullptr || *file == '\0') return nullptr;
  return std::make_unique<Profiler>(strategy,
                                    ProfilerOptions{.trace_file = file, .print_summaries = true});
}

Profiler::~Profiler() {
  set_epoch_listener({});
  std::vector<Event> rest = stop_recording();
  try {
    impl_->summarise_new(std::move(rest));
    if (!impl_->options.trace_file.empty()) {
      const std::string mine =
          trace_events(impl_->events, impl_->devices, impl_->strategy.worker_index());
      const std::vector<std::string> all = gather_from_every_worker(impl_->strategy, mine);
      if (impl_->strategy.is_chief()) {
        std::string joined;
        for (const std::string& piece : all) {
          if (piece.empty()) continue;
          joined += (joined.empty() ? "" : ",\n") + piece;
        }
        write_file(impl_->options.trace_file, wrap_trace(joined));
        TANDEM_LOG_INFO("profile: trace written to ", impl_->options.trace_file,
                        " (open it in https://ui.perfetto.dev or chrome://tracing)");
      }
    }
  } catch (const std::exception& e) {
    TANDEM_LOG_ERROR("profile: the trace was not written: ", e.what());
  }
  g_profiler_alive.store(false);
}

void write_summary(summary::Writer& writer, int64_t step, const Summary& summary) {
  writer.scalar("profile/step_ms", step, summary.step_ms_mean);
  writer.scalar("profile/step_ms_median", step, summary.step_ms_median);
  const std::pair<const char*, double> shares[] = {
      {"input", summary.input_share},           {"compute", summary.compute_share},
      {"comm_wait", summary.comm_wait_share},   {"comm_data", summary.comm_data_share},
      {"optimizer", summary.optimizer_share},   {"host_sync", summary.host_sync_share},
      {"checkpoint", summary.checkpoint_share}, {"other", summary.other_share}};
  for (const auto& [part, share] : shares)
    writer.scalar(std::string("profile/share/") + part, step, share);
  writer.scalar("profile/speedup", step, summary.speedup);
  writer.scalar("profile/efficiency", step, summary.efficiency);
  for (const ReplicaBreakdown& r : summary.per_replica) {
    const std::string prefix = "profile/replica_" + std::to_string(r.replica) + "/";
    const std::pair<const char*, double> parts[] = {
        {"compute_ms", r.compute_ms},     {"input_ms", r.input_ms},
        {"comm_wait_ms", r.comm_wait_ms}, {"comm_data_ms", r.comm_data_ms},
        {"optimizer_ms", r.optimizer_ms}, {"host_sync_ms", r.host_sync_ms},
        {"other_ms", r.other_ms}};
    for (const auto& [part, ms] : parts) writer.scalar(prefix + part, step, ms);
  }
  if (summary.loss_scale > 0) {
    writer.scalar("profile/loss_scale", step, summary.loss_scale);
    writer.scalar("profile/skipped_updates", step, static_cast<double>(summary.skipped_updates));
  }
  std::string advice;
  for (const Advice& a : summary.advice) advice += "- **" + a.rule + "**: " + a.message + "\n";
  writer.text("profile/advice", step, advice.empty() ? "no advice" : advice);
}

Summary Profiler::end_epoch() { return impl_->summarise_new(take_events()); }

const std::vector<Summary>& Profiler::summaries() const { return impl_->summaries; }

const std::vector<Event>& Profiler::events() const { return impl_->events; }

}  // namespace tandem::profile
