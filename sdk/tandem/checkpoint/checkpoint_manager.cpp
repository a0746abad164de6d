// CheckpointManager: rotation, the chief-only save protocol with its replica rendezvous and its
// asynchronous writes, and restores that fall back past damaged files (the directory's files
// and state file: state_file.cpp).
#include "tandem/checkpoint/checkpoint_manager.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <thread>
#include <utility>

#include "tandem/autograd/variable.h"
#include "tandem/checkpoint/inspect.h"
#include "tandem/checkpoint/internal/file_io.h"
#include "tandem/checkpoint/internal/gather.h"
#include "tandem/checkpoint/internal/state_file.h"
#include "tandem/collectives/communicator.h"
#include "tandem/core/logging.h"
#include "tandem/core/spans.h"
#include "tandem/core/workers.h"
#include "tandem/distribute/strategy.h"
#include "tandem/tensor/device_runtime.h"

namespace tandem {

namespace fs = std::filesystem;

using detail::checkpoint_file_name;
using detail::checkpoint_number;
using detail::format_state_file;
using detail::kStateFileName;
using detail::read_state_file;
using detail::resolve;
using detail::restore_candidates;
using detail::scan_checkpoints;
using detail::StateFile;

// ---- CheckpointManager ---------------------------------------------------------------------

struct CheckpointManager::Impl {
  Impl(const Checkpoint& tracked, std::string dir, Options opts)
      : checkpoint(tracked), directory(std::move(dir)), options(opts) {}
  ~Impl() {
    if (writer.joinable()) {
      {
        const std::lock_guard<std::mutex> lock(writer_mutex);
        stopping = true;  // the writer finishes a write in flight first
      }
      writer_cv.notify_all();
      writer.join();
    }
    if (background_error) {
      try {
        std::rethrow_exception(background_error);
      } catch (const std::exception& e) {
        TANDEM_LOG_ERROR("CheckpointManager: a background save failed and nobody waited for it: ",
                         e.what());
      } catch (...) {
        TANDEM_LOG_ERROR("CheckpointManager: a background save failed and nobody waited for it");
      }
    }
  }

  Checkpoint checkpoint;
  std::string directory;
  Options options;
  std::vector<std::string> kept;     // file names in the directory, oldest first
  std::optional<int64_t> last_step;  // of the last checkpoint written or restored
  std::mutex save_mutex;             // one save at a time from outside replicas
  // What a save derives from the structure alone, kept for the next (under save_mutex).
  const std::shared_ptr<detail::SnapshotCache> snapshot_cache = detail::make_snapshot_cache();
  // Options::async_save: one writer thread, started by the first such save, writes the image
  // of `pending` and keeps the error of a write that failed; all under writer_mutex.
  struct PendingWrite {
    detail::FileImage image;
    std::string name, path;
    int64_t step = 0;
  };
  std::thread writer;
  std::mutex writer_mutex;
  std::condition_variable writer_cv;
  std::optional<PendingWrite> pending;     // handed over, not yet taken by the writer
  std::vector<detail::ImageOp> spare_ops;  // the last written image's op list, emptied
  bool writing = false;                    // a write is pending or in flight
  bool stopping = false;
  std::exception_ptr background_error;
  std::optional<int64_t> last_written_step;  // the last_step of the last write that succeeded

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

  /// Waits for the background write, if any (its error stays in background_error).
  void finish_background() {
    std::unique_lock<std::mutex> lock(writer_mutex);
    writer_cv.wait(lock, [&] { return !writing; });
  }
  /// Waits for the background write and raises its error, once (the interval then counts
  /// from the last checkpoint that was written).
  void wait_background() {
    std::unique_lock<std::mutex> lock(writer_mutex);
    writer_cv.wait(lock, [&] { return !writing; });
    if (std::exception_ptr error = std::exchange(background_error, nullptr)) {
      last_step = last_written_step;
      std::rethrow_exception(error);
    }
  }
  /// Hands `write` to the writer thread (started on first use). The previous write has ended.
  void submit(PendingWrite write) {
    {
      const std::lock_guard<std::mutex> lock(writer_mutex);
      pending = std::move(write);
      writing = true;
    }
    if (!writer.joinable()) writer = std::thread([this] { writer_loop(); });
    writer_cv.notify_all();
  }
  void writer_loop() {
    // The lowest priority of the normal class (nice 19): the writes take mostly what the
    // training leaves, yet always progress (SCHED_IDLE could starve the thread while it holds
    // HDF5's library lock, which the input pipeline's HDF5 reads need too).
    setpriority(PRIO_PROCESS, static_cast<id_t>(gettid()), 19);
    std::unique_lock<std::mutex> lock(writer_mutex);
    for (;;) {
      writer_cv.wait(lock, [&] { return pending.has_value() || stopping; });
      if (!pending) return;  // stopping, nothing left to write
      PendingWrite write = std::move(*pending);
      pending.reset();
      lock.unlock();
      std::exception_ptr error;
      try {
        const std::string refused = refusal(write.image, write.path, write.step);
        if (!refused.empty()) TANDEM_THROW(refused);
        detail::write_image(write.image, write.path);
        keep_and_rotate(write.name);
      } catch (...) {
        error = std::current_exception();
      }
      write.image.ops.clear();  // the copies are freed here, off the training thread
      lock.lock();
      spare_ops = std::move(write.image.ops);
      if (error)
        background_error = error;
      else
        last_written_step = write.step;
      writing = false;
      writer_cv.notify_all();
    }
  }

  /// The error of a save whose weights or optimizer slots hold a NaN or Inf ("" when all are
  /// finite), raised before anything is written: such a checkpoint would not restore, and its
  /// rotation would delete the checkpoints that do (a diverged run saving on would leave
  /// nothing to resume from).
  std::string refusal(const detail::FileImage& image, const std::string& path, int64_t step) const {
    const std::string non_finite = detail::non_finite_state(image);
    if (non_finite.empty()) return "";
    return detail::str_cat("CheckpointManager::save: not writing ", path, " (step ", step,
                           "): ", non_finite,
                           ". Nothing was written and no checkpoint was deleted; ",
                           kept.empty() ? std::string("there is no earlier checkpoint")
                                        : "the newest earlier one is " + path_of(kept.back()));
  }
  std::optional<std::string> save_as_chief(std::optional<int64_t> requested_step,
                                           bool check_interval);
  /// The chief's part of a save once the file is in place: the state file, and rotation.
  void keep_and_rotate(const std::string& name);
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

void CheckpointManager::wait() { impl_->wait_background(); }

std::vector<std::string> CheckpointManager::checkpoints() const {
  impl_->finish_background();
  std::vector<std::string> out;
  for (const std::string& name : impl_->kept) out.push_back(impl_->path_of(name));
  return out;
}

std::optional<std::string> CheckpointManager::latest_checkpoint() const {
  impl_->finish_background();
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
  // An asynchronous save in flight ends first; its error is this save's.
  std::exception_ptr previous_failure;
  if (is_chief()) {
    try {
      wait_background();
    } catch (...) {
      previous_failure = std::current_exception();
    }
  }
  // In a multi-worker job every step below is taken by every worker together: the chief's
  // decision to skip holds for all (what each worker remembers of earlier saves may differ),
  // every worker sends its per-replica state, and every worker learns whether the chief's
  // write succeeded.
  const std::shared_ptr<WorkerGroup> workers =
      options.strategy != nullptr && options.strategy->num_workers() > 1 ? worker_group() : nullptr;
  bool skip = check_interval && options.checkpoint_interval > 0 && last_step &&
              step - *last_step < options.checkpoint_interval;
  bool previous_failed = previous_failure != nullptr;
  if (workers) {
    std::vector<double> decision = {is_chief() && skip ? 1.0 : 0.0, previous_failed ? 1.0 : 0.0};
    workers->sum(decision, "checkpoint save (every worker saves together)");
    skip = decision[0] > 0;
    previous_failed = decision[1] > 0;
  }
  if (previous_failure) std::rethrow_exception(previous_failure);
  if (previous_failed)
    TANDEM_THROW("CheckpointManager::save: the chief's previous background save failed (its ",
                 "error is raised on the chief); the checkpoint before it is intact");
  if (skip) return std::nullopt;
  const std::string name = checkpoint_file_name(step);
  const std::string path = path_of(name);
  // Per-replica state (metric partials, accumulators, dropout streams) of every worker goes
  // to the chief: a collective, which is why every worker calls save().
  const detail::GatheredState gathered = detail::gather_state(checkpoint, workers.get());
  std::exception_ptr failure;
  bool refused = false;  // the values are not finite (the chief checks the gathered values)
  if (is_chief()) {
    try {
      std::vector<detail::ImageOp> recycled;
      if (options.async_save) {
        const std::lock_guard<std::mutex> writer_lock(writer_mutex);
        recycled = std::move(spare_ops);
      }
      detail::FileImage image = detail::snapshot_gathered(
          checkpoint, gathered, snapshot_cache.get(), std::move(recycled));
      if (options.async_save) {
        // The writer checks the values (off this thread); a refusal is raised like a failed
        // write, by the next save() or wait().
        last_written_step = last_step;  // before this write (the writer is idle here)
        submit({std::move(image), name, path, step});
      } else {
        const std::string why = refusal(image, path, step);
        refused = !why.empty();
        if (refused) TANDEM_THROW(why);
        detail::write_image(image, path);
        keep_and_rotate(name);
      }
    } catch (...) {
      failure = std::current_exception();
    }
  }
  if (workers) {
    // Every worker learns the chief's outcome: 0 written, 1 the write failed, 2 refused.
    std::vector<double> chief_failed = {!failure ? 0.0 : refused ? 2.0 : 1.0};
    workers->sum(chief_failed, "checkpoint save (the chief's outcome)");
    if (chief_failed[0] > 1.5 && !failure)
      TANDEM_THROW("CheckpointManager::save: the chief refused to write ", path,
                   ": the model weights or optimizer slots hold NaN or Inf (its error names ",
                   "them); no checkpoint was written or deleted");
    if (chief_failed[0] > 0 && !failure)
      TANDEM_THROW("CheckpointManager::save: the chief could not write ", path,
                   " (its error is raised on the chief); the previous checkpoint is intact");
  }
  if (failure) std::rethrow_exception(failure);
  last_step = step;
  return path;
}

void CheckpointManager::Impl::keep_and_rotate(const std::string& name) {
  // Runs only once `name` is written, its weights and slots checked finite (refusal): the
  // oldest go first and `name`, the newest, always stays, so rotation never deletes the
  // newest checkpoint that restores for the sake of one that would not.
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
  // A background write in flight ends first (its error, if any, stays for save() or wait()).
  impl_->finish_background();
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
  // A background write in flight ends first (its error, if any, stays for save() or wait()).
  impl_->finish_background();
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
  // The file the chief sent is restored from a private copy (mode 0600) in this worker's own
  // directory, made by an exclusive create that never opens an existing name: a symbolic link
  // or FIFO someone placed there is passed over, never followed or blocked on. The copy is
  // removed once restored (a crash leaves a ckpt-N.h5.tmp.* name, as an interrupted save does).
  const detail::TempFile copy =
      detail::create_temp_beside(impl_->path_of(fs::path(path).filename().string()), 0600);
  std::string failed;
  try {
    detail::write_all(copy.fd, &*(nul + 1), static_cast<size_t>(message.end() - nul - 1),
                      copy.path);
  } catch (const std::exception& e) {
    failed = e.what();
  }
  if (::close(copy.fd) != 0 && failed.empty())
    failed = detail::str_cat(copy.path, ": close failed: ", std::strerror(errno));
  if (!failed.empty()) {
    ::unlink(copy.path.c_str());
    TANDEM_THROW("CheckpointManager: cannot write the chief's checkpoint ", path,
                 " to this worker's copy: ", failed);
  }
  try {
    impl_->checkpoint.restore(copy.path);
  } catch (...) {
    ::unlink(copy.path.c_str());
    throw;
  }
  ::unlink(copy.path.c_str());
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
  // Each failure is told once: in the warning of the restore that fell back past it, or in the
  // error when nothing could be restored.
  std::vector<std::string> failures;
  std::string skipped;  // "cannot restore <file>: <why>" lines
  bool all_mismatched = true;
  for (const std::string& candidate : candidates) {
    try {
      m.checkpoint.restore(candidate);
    } catch (const std::exception& e) {
      const bool mismatched = dynamic_cast<const CheckpointMismatchError*>(&e) != nullptr;
      all_mismatched = all_mismatched && mismatched;
      failures.push_back(e.what());
      skipped += detail::str_cat("\n  cannot restore ", candidate, ": ", e.what());
      // A damaged file stays on disk for inspection but is no longer one of the kept ones.
      const std::string name = fs::path(candidate).filename().string();
      m.kept.erase(std::remove(m.kept.begin(), m.kept.end(), name), m.kept.end());
      continue;
    }
    if (!failures.empty()) {
      TANDEM_LOG_WARNING("CheckpointManager: restored ", candidate, ", the newest checkpoint in ",
                         m.directory, " that could be restored; newer ones could not:", skipped);
    } else if (!note.empty()) {
      TANDEM_LOG_WARNING("CheckpointManager: restored ", candidate,
                         ", the newest complete checkpoint in ", m.directory);
    } else {
      TANDEM_LOG_INFO("CheckpointManager: restored ", candidate);
    }
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
