// What the samples print while they train: a progress line (rewritten in place on a terminal,
// plain lines every kPlainLineEvery steps otherwise), the per-epoch summary, and the
// --metrics-json file (one JSON object per line per epoch).
#pragma once

#include <chrono>
#include <cstdint>
#include <fstream>
#include <memory>
#include <optional>
#include <string>

#include "tandem/summary/summary_writer.h"

namespace tandem::profile {
class Profiler;
}  // namespace tandem::profile

namespace samples {

/// Seconds since construction, on the steady clock.
class Stopwatch {
 public:
  Stopwatch() : start_(std::chrono::steady_clock::now()) {}
  double seconds() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }

 private:
  std::chrono::steady_clock::time_point start_;
};

/// Without a terminal on stdout, Progress prints one line every this many steps.
inline constexpr int64_t kPlainLineEvery = 100;

/// The progress of one epoch's training steps.
class Progress {
 public:
  /// `epoch` is 1-based; `steps_in_epoch` is the expected step count (0 if unknown).
  Progress(int64_t epoch, int64_t epochs, int64_t steps_in_epoch);

  /// Records that step `step` of the epoch (1-based; a resumed epoch does not start at 1)
  /// finished with `examples` examples, its loss (reduced over replicas) and the running train
  /// accuracy, and refreshes the line.
  void step(int64_t step, int64_t examples, double loss, double accuracy);
  /// Ends the in-place line (call once the epoch's steps are done).
  void finish();

  /// Seconds since construction.
  double seconds() const { return stopwatch_.seconds(); }
  /// Examples of the steps recorded, per second since construction.
  double samples_per_sec() const;

 private:
  void print_line(int64_t step, double loss, double accuracy);

  int64_t epoch_;
  int64_t epochs_;
  int64_t steps_in_epoch_;
  bool tty_;
  bool line_open_ = false;
  int64_t steps_ = 0;
  int64_t examples_ = 0;
  Stopwatch stopwatch_;
  std::chrono::steady_clock::time_point last_print_;
};

/// One epoch's results, as printed and as written to --metrics-json.
struct EpochResult {
  int64_t epoch = 0;  ///< 1-based
  double loss = 0.0;  ///< mean per-example training loss
  double train_accuracy = 0.0;
  double test_accuracy = 0.0;
  double samples_per_sec = 0.0;  ///< training examples / training time (evaluation excluded)
  double train_seconds = 0.0;
  double eval_seconds = 0.0;
  /// With a LossScaleOptimizer (--precision mixed_float16): the scale at the epoch's end and
  /// the updates of the epoch it skipped for non-finite gradients.
  std::optional<double> loss_scale = std::nullopt;
  int64_t skipped_updates = 0;
  int replicas = 1;
  /// Training examples the epoch's steps took, over every worker (a resumed epoch counts its
  /// steps before the stop too).
  int64_t examples = 0;
};

/// "epoch 3/10: loss 0.3012  train acc 0.8891  test acc 0.8712  12345 samples/s  4.9 s (+0.3 s
/// eval)  60000 examples".
void print_epoch_summary(const EpochResult& result, int64_t epochs);

/// The --metrics-json file: one JSON object per line per epoch, flushed as written. Does
/// nothing when the path is empty.
class MetricsLog {
 public:
  /// Opens `path`; `append` keeps the lines of an earlier run (a resumed one). Raises when
  /// the file cannot be opened.
  MetricsLog(const std::string& path, bool append);
  void write(const EpochResult& result);

 private:
  std::string path_;
  std::ofstream out_;
};

/// The --tensorboard folder: each epoch's figures as TensorBoard scalars (tags under "epoch/",
/// at the epoch's number), written by the chief. Does nothing when the folder is empty.
///
/// The samples write a step's figures only after the checkpoint that covers it is saved: a run
/// stopped before that save resumes from an earlier checkpoint and logs those steps once, when
/// it trains them again, so TensorBoard never shows a step twice across a resume.
class TensorBoardLog {
 public:
  explicit TensorBoardLog(const std::string& logdir);
  /// The writer, or null without --tensorboard.
  tandem::summary::Writer* writer() const { return writer_.get(); }
  /// The epoch under way (1-based; set_epoch at its start): the step the figures are written at.
  int64_t epoch() const { return epoch_; }
  void set_epoch(int64_t epoch) { epoch_ = epoch; }
  void write(const EpochResult& result, double learning_rate);
  /// Marks the newest summary `profiler` made, if it made one since the last mark, as the
  /// epoch's: call when the epoch's training steps end (the summaries made in between, of an
  /// evaluation's steps, are not written). Null: nothing.
  void mark_profile(const tandem::profile::Profiler* profiler);
  /// Writes the marked summary (tags under "profile/") at epoch() and flushes; then none is
  /// marked. The profiler itself is given no writer: the summary it makes of an unfinished
  /// epoch when it ends (a preempted run) is never written. Null: nothing.
  void write_profile(const tandem::profile::Profiler* profiler);

 private:
  std::unique_ptr<tandem::summary::Writer> writer_;
  int64_t epoch_ = 0;
  size_t profiles_seen_ = 0;           // the profiler's summaries made by the last mark
  std::optional<size_t> marked_ = {};  // the one to write
};

}  // namespace samples
