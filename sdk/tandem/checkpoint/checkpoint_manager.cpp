// CheckpointManager: numbering, the `checkpoint` state file (TensorFlow CheckpointState text
// format), rotation, the chief-only save protocol with its replica rendezvous, and restores that
// fall back past damaged files.
#include "tandem/checkpoint/checkpoint_manager.h"

#include <algorithm>
#include <charconv>
#include <condition_variable>
#include <exception>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>

#include "tandem/autograd/variable.h"
#include "tandem/checkpoint/inspect.h"
#include "tandem/checkpoint/internal/file_io.h"
#include "tandem/checkpoint/internal/gather.h"
#include "tandem/collectives/communicator.h"
#include "tandem/core/logging.h"
#include "tandem/core/spans.h"
#include "tandem/core/workers.h"
#include "tandem/distribute/strategy.h"
#include "tandem/tensor/device_runtime.h"

namespace tandem {

namespace fs = std::filesystem;

namespace {

constexpr const char* kStateFileName = "checkpoint";

/// N of "ckpt-N.h5", or std::nullopt for any other name.
std::optional<int64_t> checkpoint_number(const std::string& file_name) {
  if (!file_name.starts_with("ckpt-") || !file_name.ends_with(".h5")) return std::nullopt;
  const std::string digits = file_name.substr(5, file_name.size() - 8);
  int64_t value = 0;
  const auto [end, error] = std::from_chars(digits.data(), digits.data() + digits.size(), value);
  if (digits.empty() || error != std::errc() || end != digits.data() + digits.size() || value < 0)
    return std::nullopt;
  return value;
}

std::string checkpoint_file_name(int64_t step) { return "ckpt-" + std::to_string(step) + ".h5"; }

/// The ckpt-N.h5 files of `directory` as (N, name), ascending in N.
std::vector<std::pair<int64_t, std::string>> scan_checkpoints(const std::string& directory) {
  std::vector<std::pair<int64_t, std::string>> found;
  std::error_code ec;
  for (const fs::directory_entry& entry : fs::directory_iterator(directory, ec)) {
    const std::string name = entry.path().filename().string();
    if (const auto n = checkpoint_number(name); n && entry.is_regular_file(ec))
      found.emplace_back(*n, name);
  }
  std::sort(found.begin(), found.end());
  return found;
}

// ---- the state file: TensorFlow's CheckpointState in protobuf text format -------------------

struct StateFile {
  std::string latest;            // model_checkpoint_path
  std::vector<std::string> all;  // all_model_checkpoint_paths, oldest first
};

std::string quote(const std::string& text) {
  std::string out = "\"";
  for (char c : text) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

/// The value of `key: "value"`; std::nullopt when the line is not of that form.
std::optional<std::string> unquote(const std::string& text) {
  if (text.size() < 2 || text.front() != '"' || text.back() != '"') return std::nullopt;
  std::string out;
  for (size_t i = 1; i + 1 < text.size(); ++i) {
    char c = text[i];
    if (c == '\\' && i + 2 < text.size()) {
      c = text[++i];
      if (c == 'n') c = '\n';
      if (c == 't') c = '\t';
    }
    out += c;
  }
  return out;
}

/// Parses `directory`/checkpoint; std::nullopt when it is missing or not in the format (other
/// fields, such as TensorFlow's timestamps, are ignored).
std::optional<StateFile> read_state_file(const std::string& directory) {
  // Only a regular file: a FIFO in its place would block the read forever.
  std::error_code ec;
  if (!fs::is_regular_file(fs::path(directory) / kStateFileName, ec)) return std::nullopt;
  std::ifstream in(fs::path(directory) / kStateFileName);
  if (!in) return std::nullopt;
  StateFile state;
  std::string line;
  while (std::getline(in, line)) {
    const size_t first = line.find_first_not_of(" \t\r");
    if (first == std::string::npos) continue;
    const size_t colon = line.find(':', first);
    if (colon == std::string::npos) return std::nullopt;
    const std::string key = line.substr(first, colon - first);
    std::string value = line.substr(colon + 1);
    value.erase(0, value.find_first_not_of(" \t"));
    value.erase(value.find_last_not_of(" \t\r") + 1);
    if (key == "model_checkpoint_path" || key == "all_model_checkpoint_paths") {
      const std::optional<std::string> text = unquote(value);
      if (!text) return std::nullopt;
      (key == "model_checkpoint_path" ? state.latest : state.all.emplace_back()) = *text;
    }
  }
  if (state.latest.empty() && state.all.empty()) return std::nullopt;
  return state;
}

std::string format_state_file(const std::vector<std::string>& kept) {
  std::string text;
  if (!kept.empty()) text += "model_checkpoint_path: " + quote(kept.back()) + "\n";
  for (const std::string& name : kept) text += "all_model_checkpoint_paths: " + quote(name) + "\n";
  return text;
}

std::string resolve(const std::string& directory, const std::string& name) {
  const fs::path p(name);
  return p.is_absolute() ? name : (fs::path(directory) / p).string();
}

/// The candidates to restore, newest first: the state file's target, then every ckpt-N.h5 by
/// descending N. `note` says when the state file was missing.
std::vector<std::string> restore_candidates(const std::string& directory, std::string* note) {
  std::vector<std::string> candidates;
  if (const std::optional<StateFile> state = read_state_file(directory)) {
    const std::string latest = state->latest.empty() ? state->all.back() : state->latest;
    candidates.push_back(resolve(directory, latest));
  } else if (note != nullptr) {
    std::error_code ec;
    *note = fs::symlink_status(fs::path(directory) / kStateFileName, ec).type() !=
                    fs::file_type::not_found
                ? "its state file 'checkpoint' cannot be parsed"
                : "it has no state file 'checkpoint'";
  }
  const auto found = scan_checkpoints(directory);
  for (auto it = found.rbegin(); it != found.rend(); ++it) {
    const std::string path = resolve(directory, it->second);
    if (std::find(candidates.begin(), candidates.end(), path) == candidates.end())
      candidates.push_back(path);
  }
  return candidates;
}

}  // namespace

std::optional<std::string> latest_checkpoint(const std::string& directory) {
  return latest_checkpoint(directory, nullptr);
}

std::optional<std::string> latest_checkpoint(const std::string& directory,
                                             std::vector<std::string>* skipped) {
  for (const std::string& candidate : restore_candidates(directory, nullptr)) {
    const std::string why = verify_checkpoint(candidate);
    if (why.empty()) return candidate;
    if (skipped != nullptr) skipped->push_back(candidate + ": " + why);
  }
  return std::nullopt;
}

// ---- CheckpointManager ---------------------------------------------------------------------

struct CheckpointManager::Impl {
  Impl(const Checkpoint& tracked, std::string dir, Options opts)
      : checkpoint(tracked), directory(std::move(dir)), options(opts) {}

  Checkpoint checkpoint;
  std::string directory;
  Options options;
  std::vector<std::string> kept;     // file names in the directory, oldest first
  std::optional<int64_t> last_step;  // of the last checkpoint written or restored
  std::mutex save_mutex;             // one save at a time from outside replicas

  // The rendezvous of save() called by every replica inside strategy.run.
  std::mutex rendezvous_mutex;
  std::condition_variable rendezvous_cv;
  int arrived = 0;
  uint64_t generation = 0;
  std::optional<std::string> shared_result;
  std::exception_ptr shared_error;

  bool is_chief() const { return options.strategy == nullptr || options.strategy->is_chief(); }
  std::string path_of(const std::string& name) const { return resolve(directory, name); }

  void write_state_file() const {
    detail::write_file_atomically((fs::path(directory) / kStateFileName).string(),
                                  format_state_file(kept));
  }

  std::optional<std::string> save_as_chief(std::optional<int64_t> requested_step,
                                           bool check_interval);
  /// The chief's part of a save: the file, the state file, and rotation.
  void write_and_rotate(const std::string& name, const std::string& path,
                        const detail::GatheredState& gathered);
  std::optional<std::string> save_collectively(std::optional<int64_t> step, bool check_interval,
                                               ReplicaBinding binding);
};

CheckpointManager::CheckpointManager(const Checkpoint& checkpoint, std::string directory)
    : CheckpointManager(checkpoint, std::move(directory), Options{}) {}

CheckpointManager::CheckpointManager(const Checkpoint& checkpoint, std::string directory,
                                     Options options)
    : impl_(std::make_unique<Impl>(checkpoint, directory, options)) {
  TANDEM_CHECK(!directory.empty(), "CheckpointManager: the directory is empty");
  TANDEM_CHECK(options.max_to_keep >= 0, "CheckpointManager: max_to_keep must be >= 0 (0 keeps ",
               "every checkpoint), got ", options.max_to_keep);
  TANDEM_CHECK(options.checkpoint_interval >= 0,
               "CheckpointManager: checkpoint_interval must be >= 0, got ",
               options.checkpoint_interval);
  Impl& m = *impl_;
  std::error_code ec;
  fs::create_directories(m.directory, ec);
  TANDEM_CHECK(fs::is_directory(m.directory), "CheckpointManager: cannot create the directory ",
               m.directory, ": ", ec.message());

  if (m.is_chief()) {
    // Temporary files of saves that never finished (the process died mid-write): they never
    // became checkpoints, so nothing refers to them.
    for (const fs::directory_entry& entry : fs::directory_iterator(m.directory, ec)) {
      const std::string name = entry.path().filename().string();
      if (!detail::is_temp_name(name)) continue;
      std::error_code removed;
      fs::remove(entry.path(), removed);
      if (removed)
        TANDEM_LOG_WARNING("CheckpointManager: cannot remove the leftover temporary file ",
                           entry.path().string(), ": ", removed.message());
      else
        TANDEM_LOG_INFO("CheckpointManager: removed the leftover temporary file ",
                        entry.path().string(), " (an interrupted save)");
    }
  }

  if (const std::optional<StateFile> state = read_state_file(m.directory)) {
    std::vector<std::string> names = state->all;
    if (!state->latest.empty() &&
        std::find(names.begin(), names.end(), state->latest) == names.end())
      names.push_back(state->latest);
    // symlink_status with an error code: a name that is a symbolic-link loop (or otherwise
    // unreadable) is kept like any damaged file, for restore to skip, and never raises here.
    for (const std::string& name : names) {
      std::error_code status_error;
      if (fs::symlink_status(m.path_of(name), status_error).type() != fs::file_type::not_found)
        m.kept.push_back(name);
    }
  } else {
    for (const auto& [n, name] : scan_checkpoints(m.directory)) m.kept.push_back(name);
  }
  if (!m.kept.empty()) m.last_step = checkpoint_number(fs::path(m.kept.back()).filename().string());
}

CheckpointManager::~CheckpointManager() = default;

const std::string& CheckpointManager::directory() const { return impl_->directory; }

std::vector<std::string> CheckpointManager::checkpoints() const {
  std::vector<std::string> out;
  for (const std::string& name : impl_->kept) out.push_back(impl_->path_of(name));
  return out;
}

std::optional<std::string> CheckpointManager::latest_checkpoint() const {
  return tandem::latest_checkpoint(impl_->directory);
}

std::optional<std::string> CheckpointManager::save() { return save_at(std::nullopt, true); }

std::optional<std::string> CheckpointManager::save(int64_t step) {
  TANDEM_CHECK(step >= 0, "CheckpointManager::save: the step must be >= 0, got ", step);
  return save_at(step, true);
}

std::optional<std::string> CheckpointManager::save(const SaveOptions& options) {
  TANDEM_CHECK(!options.step || *options.step >= 0,
               "CheckpointManager::save: the step must be >= 0, got ", options.step.value_or(0));
  return save_at(options.step, options.check_interval);
}

std::optional<std::string> CheckpointManager::save_at(std::optional<int64_t> step,
                                                      bool check_interval) {
  const profile::Span span(profile::Phase::kCheckpoint);
  const ReplicaBinding binding = current_replica_binding();
  if (binding.num_replicas > 1) return impl_->save_collectively(step, check_interval, binding);
  std::lock_guard<std::mutex> lock(impl_->save_mutex);
  return impl_->save_as_chief(step, check_interval);
}

std::optional<std::string> CheckpointManager::Impl::save_as_chief(
    std::optional<int64_t> requested_step, bool check_interval) {
  const int64_t step = requested_step.value_or(checkpoint.global_step());
  // In a multi-worker job every step below is taken by every worker together: the chief's
  // decision to skip holds for all (what each worker remembers of earlier saves may differ),
  // every worker sends its per-replica state, and every worker learns whether the chief's
  // write succeeded.
  const std::shared_ptr<WorkerGroup> workers =
      options.strategy != nullptr && options.strategy->num_workers() > 1 ? worker_group() : nullptr;
  bool skip = check_interval && options.checkpoint_interval > 0 && last_step &&
              step - *last_step < options.checkpoint_interval;
  if (workers) {
    std::vector<double> chief_skips = {is_chief() && skip ? 1.0 : 0.0};
    workers->sum(chief_skips, "checkpoint save (every worker saves together)");
    skip = chief_skips[0] > 0;
  }
  if (skip) return std::nullopt;
  const std::string name = checkpoint_file_name(step);
  const std::string path = path_of(name);
  // Per-replica state (metric partials, accumulators, dropout streams) of every worker goes
  // to the chief: a collective, which is why every worker calls save().
  const detail::GatheredState gathered = detail::gather_state(checkpoint, workers.get());
  std::exception_ptr failure;
  if (is_chief()) {
    try {
      write_and_rotate(name, path, gathered);
    } catch (...) {
      failure = std::current_exception();
    }
  }
  if (workers) {
    std::vector<double> chief_failed = {failure ? 1.0 : 0.0};
    workers->sum(chief_failed, "checkpoint save (the chief's outcome)");
    if (chief_failed[0] > 0 && !failure)
      TANDEM_THROW("CheckpointManager::save: the chief could not write ", path,
                   " (its error is raised on the chief); the previous checkpoint is intact");
  }
  if (failure) std::rethrow_exception(failure);
  last_step = step;
  return path;
}

void CheckpointManager::Impl::write_and_rotate(const std::string& name, const std::string& path,
                                               const detail::GatheredState& gathered) {
  detail::write_gathered(checkpoint, path, gathered);
  kept.erase(std::remove(kept.begin(), kept.end(), name), kept.end());
  kept.push_back(name);
  write_state_file();
  detail::checkpoint_save_point("state_written");
  if (options.max_to_keep > 0 && kept.size() > static_cast<size_t>(options.max_to_keep)) {
    while (kept.size() > static_cast<size_t>(options.max_to_keep)) {
      std::error_code ec;
      fs::remove(path_of(kept.front()), ec);
      if (ec)
        TANDEM_LOG_WARNING("CheckpointManager: cannot delete the old checkpoint ",
                           path_of(kept.front()), ": ", ec.message());
      kept.erase(kept.begin());
    }
    write_state_file();
  }
  detail::checkpoint_save_point("rotated");
}

std::optional<std::string> CheckpointManager::Impl::save_collectively(std::optional<int64_t> step,
                                                                      bool check_interval,
                                                                      ReplicaBinding binding) {
  // Replica 0 reads every replica's state, some of it in GPU memory (accumulators): this
  // replica's queued GPU work must be done first (a no-op on the CPU).
  if (options.strategy != nullptr &&
      binding.replica_id < static_cast<int>(options.strategy->devices().size()))
    synchronize(options.strategy->devices()[static_cast<size_t>(binding.replica_id)]);
  const auto deadline = std::chrono::steady_clock::now() + collectives::collective_timeout();
  std::unique_lock<std::mutex> lock(rendezvous_mutex);
  const uint64_t generation_at_arrival = generation;
  ++arrived;
  if (binding.replica_id == 0) {
    // Gather: once every replica has arrived, none of them is changing its per-replica state
    // (metric partials, dropout streams, variable copies), so replica 0 may read all of it.
    const bool all_arrived =
        rendezvous_cv.wait_until(lock, deadline, [&] { return arrived == binding.num_replicas; });
    if (!all_arrived) {
      --arrived;
      throw TimeoutError(detail::str_cat(
          "CheckpointManager::save: replica 0 waited ", collectives::collective_timeout().count(),
          " ms and only ", arrived + 1, " of ", binding.num_replicas, " replicas called save(); ",
          "every replica must call save() (raise TANDEM_COLLECTIVE_TIMEOUT if one is only slow)"));
    }
    lock.unlock();
    std::optional<std::string> result;
    std::exception_ptr error;
    try {
      std::lock_guard<std::mutex> save_lock(save_mutex);
      result = save_as_chief(step, check_interval);
    } catch (...) {
      error = std::current_exception();
    }
    lock.lock();
    // Barrier: the others wait here until the checkpoint is written, then all return its path.
    shared_result = result;
    shared_error = error;
    arrived = 0;
    ++generation;
    rendezvous_cv.notify_all();
    if (error) std::rethrow_exception(error);
    return result;
  }
  if (arrived == binding.num_replicas) rendezvous_cv.notify_all();
  const bool released =
      rendezvous_cv.wait_until(lock, deadline, [&] { return generation != generation_at_arrival; });
  if (!released) {
    --arrived;
    throw TimeoutError(detail::str_cat(
        "CheckpointManager::save: replica ", binding.replica_id, " waited ",
        collectives::collective_timeout().count(), " ms for replica 0 to write the checkpoint; ",
        "every replica must call save() (raise TANDEM_COLLECTIVE_TIMEOUT if one is only slow)"));
  }
  if (shared_error) std::rethrow_exception(shared_error);
  return shared_result;
}

void CheckpointManager::restore(const std::string& path) {
  impl_->checkpoint.restore(path);
  impl_->last_step = impl_->checkpoint.global_step();
}

namespace {

std::vector<char> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  TANDEM_CHECK(in.good(), "CheckpointManager: cannot read ", path);
  return std::vector<char>(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

/// The chief's result of a restore, for the other workers: "" (fresh) or the path, a NUL, and
/// the checkpoint file's bytes.
std::vector<char> restore_message(const std::optional<std::string>& restored) {
  std::vector<char> out;
  if (!restored) return out;
  out.assign(restored->begin(), restored->end());
  out.push_back('\0');
  const std::vector<char> file = read_bytes(*restored);
  out.insert(out.end(), file.begin(), file.end());
  return out;
}

}  // namespace

std::optional<std::string> CheckpointManager::restore_or_initialize() {
  const Strategy* strategy = impl_->options.strategy;
  if (strategy == nullptr || strategy->num_workers() == 1) return restore_locally();
  // Several workers: the chief picks and reads the checkpoint and sends the file to the others,
  // so their hosts need not see the chief's directory.
  std::optional<std::string> restored;
  std::exception_ptr failure;
  if (strategy->is_chief()) {
    try {
      restored = restore_locally();
    } catch (...) {
      failure = std::current_exception();
    }
  }
  std::vector<char> message;
  if (strategy->is_chief() && !failure) message = restore_message(restored);
  if (strategy->is_chief() && failure) message = {'!'};
  const std::shared_ptr<WorkerGroup> workers = worker_group();
  TANDEM_CHECK(workers != nullptr, "CheckpointManager.restore_or_initialize: the strategy has ",
               strategy->num_workers(),
               " workers, but no multi-worker strategy lives in this "
               "process any more");
  message = workers->broadcast_from_chief(std::move(message), "restore_or_initialize");
  if (strategy->is_chief()) {
    if (failure) std::rethrow_exception(failure);
    return restored;
  }
  if (message.size() == 1 && message[0] == '!')
    TANDEM_THROW("CheckpointManager: the chief could not restore from ", impl_->directory);
  if (message.empty()) return std::nullopt;
  const auto nul = std::find(message.begin(), message.end(), '\0');
  const std::string path(message.begin(), nul);
  const std::string copy =
      detail::temp_path_for((fs::temp_directory_path() / fs::path(path).filename()).string());
  {
    std::ofstream out(copy, std::ios::binary | std::ios::trunc);
    out.write(&*(nul + 1), static_cast<std::streamsize>(message.end() - nul - 1));
    TANDEM_CHECK(out.good(), "CheckpointManager: cannot write the chief's checkpoint to ", copy);
  }
  try {
    impl_->checkpoint.restore(copy);
  } catch (...) {
    std::error_code ignored;
    fs::remove(copy, ignored);
    throw;
  }
  std::error_code ignored;
  fs::remove(copy, ignored);
  impl_->last_step = impl_->checkpoint.global_step();
  TANDEM_LOG_INFO("CheckpointManager: restored ", path, " (sent by the chief)");
  return path;
}

std::optional<std::string> CheckpointManager::restore_locally() {
  Impl& m = *impl_;
  std::string note;
  const std::vector<std::string> candidates = restore_candidates(m.directory, &note);
  if (candidates.empty()) {
    TANDEM_LOG_INFO("CheckpointManager: no checkpoint in ", m.directory, "; starting fresh");
    return std::nullopt;
  }
  if (!note.empty())
    TANDEM_LOG_WARNING("CheckpointManager: ", m.directory, ": ", note,
                       "; restoring the newest complete ckpt-<N>.h5");
  // Any failure of a candidate falls back to the next-older one: damage (unreadable, a failed
  // checksum, impossible values, a file-system error such as a symbolic-link loop) and also
  // "another model" (a flipped bit can change a shape). Only when every candidate fails is it
  // an error: CheckpointMismatchError when every one is of another model, else tandem::Error.
  std::vector<std::string> failures;
  bool all_mismatched = true;
  for (const std::string& candidate : candidates) {
    try {
      m.checkpoint.restore(candidate);
    } catch (const std::exception& e) {
      const bool mismatched = dynamic_cast<const CheckpointMismatchError*>(&e) != nullptr;
      all_mismatched = all_mismatched && mismatched;
      TANDEM_LOG_WARNING("CheckpointManager: cannot restore ", candidate, ": ", e.what(),
                         "; falling back to the previous checkpoint");
      failures.push_back(e.what());
      // A damaged file stays on disk for inspection but is no longer one of the kept ones.
      const std::string name = fs::path(candidate).filename().string();
      m.kept.erase(std::remove(m.kept.begin(), m.kept.end(), name), m.kept.end());
      continue;
    }
    if (!failures.empty() || !note.empty())
      TANDEM_LOG_WARNING("CheckpointManager: restored ", candidate,
                         ", the newest complete checkpoint in ", m.directory);
    else
      TANDEM_LOG_INFO("CheckpointManager: restored ", candidate);
    m.last_step = m.checkpoint.global_step();
    return candidate;
  }
  std::string all;
  for (const std::string& failure : failures) all += "\n  " + failure;
  if (all_mismatched)
    throw CheckpointMismatchError(detail::str_cat("CheckpointManager: every checkpoint in ",
                                                  m.directory, " is of another model:", all));
  TANDEM_THROW("CheckpointManager: no checkpoint in ", m.directory, " can be restored:", all);
}

}  // namespace tandem
