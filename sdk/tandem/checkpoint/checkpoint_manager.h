// CheckpointManager: numbered checkpoints in a directory (ckpt-<step>.h5), the `checkpoint` state
// file in TensorFlow's CheckpointState text format, rotation, chief-only crash-safe saves and
// restores that fall back past damaged files.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tandem/checkpoint/checkpoint.h"

namespace tandem {

class Strategy;

/// The newest checkpoint in `directory` that would restore (tf.train.latest_checkpoint): the
/// one the `checkpoint` state file names when it passes verify_checkpoint (inspect.h: a regular
/// file, a Tandem checkpoint with its groups, every checksum and value checked), else the
/// highest-numbered `ckpt-<N>.h5` that does. std::nullopt when there is none. It reads every
/// dataset of the files it checks.
std::optional<std::string> latest_checkpoint(const std::string& directory);
/// The same; `skipped` (when not null) receives "`<file>: <reason>`" for every newer candidate
/// that was passed over.
std::optional<std::string> latest_checkpoint(const std::string& directory,
                                             std::vector<std::string>* skipped);

/// Saves and restores a Checkpoint in a directory:
///
///   td::CheckpointManager manager(checkpoint, "checkpoints/mlp", {.max_to_keep = 3});
///   manager.restore_or_initialize();            // resume where the last run stopped
///   for (...) { ...; manager.save(); }          // ckpt-`<global step>`.h5
///
/// Who writes. Every replica and worker calls save(); only the chief writes. In one process the
/// calling thread is the chief: call save() from the training loop's thread, between
/// strategy.run calls (the samples do). save() may also be called from inside strategy.run by
/// every replica: replica 0 then waits until all replicas have arrived (so that no replica is
/// changing its per-replica state: the gather), writes, and releases them (the barrier); all
/// replicas return the same result. With Options::strategy set, a process whose strategy is
/// not the chief writes nothing (multi-worker).
///
/// How. The chief writes `ckpt-N.h5.tmp.<pid>` (exclusive create), closes and fsyncs it,
/// renames it to ckpt-N.h5 and fsyncs the directory; then it rewrites `checkpoint` (temp +
/// rename), deletes checkpoints beyond max_to_keep (oldest first) and rewrites `checkpoint`
/// again. A crash at any point leaves the previous checkpoint intact; leftover temporary files
/// are removed when the next CheckpointManager for the directory is constructed.
class CheckpointManager {
 public:
  /// How the manager keeps, spaces and writes checkpoints.
  struct Options {
    /// Checkpoints kept; older ones are deleted, oldest first. 0 keeps every checkpoint.
    int max_to_keep = 5;
    /// save() writes only when at least this many steps (global_step) have passed since the
    /// last checkpoint; 0 writes on every call. TensorFlow's rule: the first save() of a
    /// manager always writes, and later ones when step - last written step >= the interval;
    /// so with save() after every step from step 1 and an interval of 20 the files are
    /// ckpt-1, ckpt-21, ckpt-41, ... (save with check_interval = false to write off the grid).
    int64_t checkpoint_interval = 0;
    /// The strategy whose chief writes; nullptr: this process is the chief (one process).
    const Strategy* strategy = nullptr;
    /// Asynchronous saves: save() returns once the checkpoint is copied into host memory (the
    /// weights, optimizer slots, data position, metrics, accumulators, loss scale: everything
    /// it tracks, taken at that step); a background thread writes the file, checksums, syncs
    /// and renames it, and only then moves the state file (the "latest" marker) and deletes
    /// old checkpoints. The next save(), restore, restore_or_initialize and wait() first wait
    /// for it, and raise its error if it failed (the error is never lost; the destructor logs
    /// one nobody asked for). A crash at any moment leaves the previous checkpoint the newest.
    bool async_save = false;
  };

  /// Manages `directory` (created if missing) for `checkpoint` (copied; its objects must outlive
  /// the manager). The chief removes leftover temporary files of interrupted saves.
  CheckpointManager(const Checkpoint& checkpoint, std::string directory);
  /// The same with `options` (rotation, interval, the strategy whose chief writes, async).
  CheckpointManager(const Checkpoint& checkpoint, std::string directory, Options options);
  ~CheckpointManager();
  CheckpointManager(const CheckpointManager&) = delete;
  CheckpointManager& operator=(const CheckpointManager&) = delete;

  /// Saves `ckpt-<global_step>.h5` and returns its path, or std::nullopt when fewer than
  /// checkpoint_interval steps passed since the last checkpoint. Raises naming the file when
  /// the write fails (the previous checkpoints stay intact).
  std::optional<std::string> save();
  /// The same with an explicit checkpoint number `step` (also what the interval is judged on).
  std::optional<std::string> save(int64_t step);
  /// What one save() writes: its number, and whether the interval applies.
  struct SaveOptions {
    /// The checkpoint number; default: the checkpoint's global_step.
    std::optional<int64_t> step;
    /// false writes even within checkpoint_interval of the last checkpoint (TensorFlow's
    /// check_interval=False; a save before the job stops).
    bool check_interval = true;
  };
  /// The same with `options` (an explicit number, or a write that ignores the interval).
  std::optional<std::string> save(const SaveOptions& options);

  /// Restores `path` (see Checkpoint::restore for the errors). Call it outside strategy.run.
  void restore(const std::string& path);
  /// Restores the newest checkpoint; when the state file is missing, or names a file that does
  /// not restore (truncated, not HDF5, not a regular file, a failed checksum, impossible values,
  /// a group missing, even "another model" or a newer format, which a flipped bit can fake),
  /// falls back to the next-older `ckpt-<N>.h5` and logs which file and why (a warning). Returns
  /// the path restored, or std::nullopt when the directory holds no checkpoint (a fresh start:
  /// the objects keep their initial values). Raises CheckpointMismatchError when every
  /// checkpoint is of another model or a newer format, tandem::Error when none restores for
  /// other reasons; both list every file and its reason.
  /// With a multi-worker Options::strategy, every worker calls it: the chief restores from its
  /// directory and sends the file to the others (their hosts need not see the directory).
  std::optional<std::string> restore_or_initialize();

  /// Waits for a background write (Options::async_save) to be durable; raises its error if it
  /// failed. Returns at once when none is in flight.
  void wait();

  /// The checkpoint the state file names (tf's manager.latest_checkpoint), checked as in
  /// tandem::latest_checkpoint(directory).
  std::optional<std::string> latest_checkpoint() const;
  /// The checkpoints kept, oldest first (paths).
  std::vector<std::string> checkpoints() const;
  /// The directory it manages.
  const std::string& directory() const;

  struct Impl;

 private:
  /// save() and save(step): `step` absent means the checkpoint's global_step().
  std::optional<std::string> save_at(std::optional<int64_t> step, bool check_interval);
  /// restore_or_initialize from this process's view of the directory.
  std::optional<std::string> restore_locally();
  std::unique_ptr<Impl> impl_;
};

}  // namespace tandem
