// TensorBoard summaries: tandem::summary::Writer writes scalars, histograms and text into
// TensorBoard event files in a log folder, the chief alone (every worker and every replica may
// call; only worker 0's replica 0, or a call outside strategy.run on worker 0, writes).
//
//   tandem::summary::Writer writer("logs/run1");
//   writer.scalar("loss", step, loss);           // tf.summary.scalar("loss", loss, step=step)
//   writer.histogram("dense/kernel", step, model.weights()[0].value());
//   writer.text("config", 0, "batch 128, Adam 1e-3");
//
// Then `tensorboard --logdir logs`. Files are named events.out.tfevents.<time>.<host>.<pid>.<n>
// (TensorBoard reads every file of the folder in name order); records are buffered and written
// at flush(), every WriterOptions::flush_seconds, and when the writer is destroyed.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tandem/tensor/tensor.h"

namespace tandem::summary {

/// How a Writer buffers and splits its event files.
struct WriterOptions {
  /// Buffered records reach the file at most this many seconds after they were written
  /// (checked at each call; flush() writes at once). TensorFlow's flush_millis, in seconds.
  double flush_seconds = 2.0;
  /// When a file passes this many bytes, the next record starts a new file (0: never).
  int64_t max_file_bytes = 0;
};

/// Writes TensorBoard event files into a log folder (tf.summary.create_file_writer). Every
/// worker and replica may call it; only the chief's replica 0 (or a call outside strategy.run
/// on the chief) writes, so a training step can log without checking who it is.
class Writer {
 public:
  /// Writes into `logdir` (created by the first record). Raises when it exists as a file.
  explicit Writer(std::string logdir, WriterOptions options = {});
  ~Writer();
  Writer(const Writer&) = delete;
  Writer& operator=(const Writer&) = delete;

  /// One value of a time series (written as a float, as TensorBoard shows it).
  void scalar(const std::string& tag, int64_t step, double value);
  /// The distribution of `values` (any floating or integer CPU or GPU tensor), in `buckets`
  /// equal-width buckets between its minimum and maximum. Non-finite values raise.
  void histogram(const std::string& tag, int64_t step, const Tensor& values, int buckets = 30);
  /// The same from host values.
  void histogram(const std::string& tag, int64_t step, const std::vector<double>& values,
                 int buckets = 30);
  /// Text (Markdown) for TensorBoard's Text dashboard.
  void text(const std::string& tag, int64_t step, const std::string& text);
  /// Writes the buffered records to the file and flushes it.
  void flush();

  /// The log folder given at construction.
  const std::string& logdir() const;
  /// The event file written now ("" before this writer's first record, or when it does not
  /// write: on a worker other than the chief).
  std::string current_file() const;
  /// Whether calls made here, on this thread, are written: worker 0 (the chief), and replica 0
  /// inside strategy.run.
  static bool writes_here();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tandem::summary
