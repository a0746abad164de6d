// The samples' progress line, epoch summary and --metrics-json writer.
#include "common/reporting.h"

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <iomanip>
#include <iostream>
#include <sstream>
#include <stdexcept>
#include <vector>

#include "tandem/profile/profiler.h"

namespace samples {

namespace {

/// A terminal redraws the line at most this often (a step can take well under a millisecond).
constexpr std::chrono::milliseconds kRedrawInterval(100);

/// A JSON number; null for NaN or infinity (JSON has no spelling for them).
std::string json_number(double value) {
  if (!std::isfinite(value)) return "null";
  std::ostringstream out;
  out << std::setprecision(9) << value;
  return out.str();
}

}  // namespace

Progress::Progress(int64_t epoch, int64_t epochs, int64_t steps_in_epoch)
    : epoch_(epoch),
      epochs_(epochs),
      steps_in_epoch_(steps_in_epoch),
      tty_(isatty(STDOUT_FILENO) == 1),
      last_print_(std::chrono::steady_clock::now()) {}

void Progress::step(int64_t step, int64_t examples, double loss, double accuracy) {
  ++steps_;
  examples_ += examples;
  if (tty_) {
    const auto now = std::chrono::steady_clock::now();
    if (steps_ == 1 || step == steps_in_epoch_ || now - last_print_ >= kRedrawInterval) {
      last_print_ = now;
      print_line(step, loss, accuracy);
    }
  } else if (step % kPlainLineEvery == 0) {
    print_line(step, loss, accuracy);
  }
}

void Progress::print_line(int64_t step, double loss, double accuracy) {
  std::ostringstream line;
  line << "epoch " << epoch_ << "/" << epochs_ << "  step " << step;
  if (steps_in_epoch_ > 0) line << "/" << steps_in_epoch_;
  line << std::fixed << "  loss " << std::setprecision(4) << loss << "  train acc "
       << std::setprecision(4) << accuracy << "  " << std::setprecision(0) << samples_per_sec()
       << " samples/s";
  if (tty_) {
    // Carriage return, the line, then erase whatever a longer previous line left behind.
    std::cout << '\r' << line.str() << "\x1b[K" << std::flush;
    line_open_ = true;
  } else {
    std::cout << line.str() << std::endl;
  }
}

void Progress::finish() {
  if (line_open_) std::cout << std::endl;
  line_open_ = false;
}

double Progress::samples_per_sec() const {
  const double s = seconds();
  return s > 0.0 ? static_cast<double>(examples_) / s : 0.0;
}

void print_epoch_summary(const EpochResult& result, int64_t epochs) {
  std::cout << std::fixed << "epoch " << result.epoch << "/" << epochs << ": loss "
            << std::setprecision(4) << result.loss << "  train acc " << result.train_accuracy
            << "  test acc " << result.test_accuracy << "  " << std::setprecision(0)
            << result.samples_per_sec << " samples/s  " << std::setprecision(1)
            << result.train_seconds << " s (+" << result.eval_seconds << " s eval)  "
            << result.examples << " examples" << std::defaultfloat;
  if (result.loss_scale) {
    std::cout << "  loss scale " << std::setprecision(8) << *result.loss_scale << " ("
              << result.skipped_updates << " update" << (result.skipped_updates == 1 ? "" : "s")
              << " skipped)";
  }
  std::cout << std::endl;
  // A scale at or below 1 no longer scales anything up: the gradients overflow float16 even
  // unscaled, and every update is being skipped.
  if (result.loss_scale && *result.loss_scale <= 1.0) {
    std::cout << "advice: the loss scale fell to " << *result.loss_scale
              << ": the gradients overflow float16 even unscaled. Train with --precision "
                 "mixed_bfloat16 (float32's range) or a lower learning rate"
              << std::endl;
  }
}

MetricsLog::MetricsLog(const std::string& path, bool append) : path_(path) {
  if (path_.empty()) return;
  out_.open(path_, append ? std::ios::app : std::ios::trunc);
  if (!out_.is_open()) {
    throw std::runtime_error("--metrics-json: cannot open \"" + path_ + "\" for writing");
  }
}

void MetricsLog::write(const EpochResult& result) {
  if (path_.empty()) return;
  out_ << "{\"epoch\": " << result.epoch << ", \"loss\": " << json_number(result.loss)
       << ", \"train_accuracy\": " << json_number(result.train_accuracy)
       << ", \"test_accuracy\": " << json_number(result.test_accuracy)
       << ", \"samples_per_sec\": " << json_number(result.samples_per_sec)
       << ", \"replicas\": " << result.replicas
       << ", \"epoch_seconds\": " << json_number(result.train_seconds);
  if (result.loss_scale) {
    out_ << ", \"loss_scale\": " << json_number(*result.loss_scale)
         << ", \"skipped_updates\": " << result.skipped_updates;
  }
  out_ << "}\n";
  out_.flush();
  if (!out_.good()) throw std::runtime_error("--metrics-json: writing \"" + path_ + "\" failed");
}

TensorBoardLog::TensorBoardLog(const std::string& logdir) {
  if (!logdir.empty()) writer_ = std::make_unique<tandem::summary::Writer>(logdir);
}

void TensorBoardLog::write(const EpochResult& result, double learning_rate) {
  if (!writer_) return;
  const int64_t step = result.epoch;
  writer_->scalar("epoch/loss", step, result.loss);
  writer_->scalar("epoch/train_accuracy", step, result.train_accuracy);
  writer_->scalar("epoch/test_accuracy", step, result.test_accuracy);
  writer_->scalar("epoch/learning_rate", step, learning_rate);
  writer_->scalar("epoch/samples_per_sec", step, result.samples_per_sec);
  writer_->scalar("epoch/replicas", step, result.replicas);
  if (result.loss_scale) {
    writer_->scalar("epoch/loss_scale", step, *result.loss_scale);
    writer_->scalar("epoch/skipped_updates", step, static_cast<double>(result.skipped_updates));
  }
  writer_->flush();
}

void TensorBoardLog::mark_profile(const tandem::profile::Profiler* profiler) {
  if (profiler == nullptr) return;
  const size_t made = profiler->summaries().size();
  if (made > profiles_seen_) marked_ = made - 1;
  profiles_seen_ = made;
}

void TensorBoardLog::write_profile(const tandem::profile::Profiler* profiler) {
  if (!writer_ || profiler == nullptr || !marked_) return;
  tandem::profile::write_summary(*writer_, epoch_, profiler->summaries().at(*marked_));
  marked_.reset();
  writer_->flush();
}

}  // namespace samples
