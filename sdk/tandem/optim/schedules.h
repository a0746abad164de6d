// Learning-rate schedules as pure functions of the update step (Keras formulas), and
// LearningRate, the optimizer option that holds a constant or a schedule.
#pragma once

#include <concepts>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace tandem::optim {

namespace schedules {

/// A learning rate as a function of `step`, the number of updates applied before this one
/// (0 for the first update; Keras passes optimizer.iterations the same way).
class LearningRateSchedule {
 public:
  virtual ~LearningRateSchedule() = default;
  /// The rate for the update that follows `step` earlier updates (step >= 0).
  virtual double operator()(int64_t step) const = 0;
  /// Keras-style {"class_name": ..., "config": {...}} (stored in checkpoints).
  virtual std::string to_json() const = 0;
};

/// The same rate at every step.
class Constant : public LearningRateSchedule {
 public:
  /// `learning_rate` at every step.
  explicit Constant(double learning_rate);
  double operator()(int64_t step) const override;
  std::string to_json() const override;

 private:
  double learning_rate_;
};

/// initial_learning_rate * decay_rate ^ (step / decay_steps); with staircase the exponent is
/// floor(step / decay_steps).
class ExponentialDecay : public LearningRateSchedule {
 public:
  /// The rate starts at `initial_learning_rate` and is multiplied by `decay_rate` every
  /// `decay_steps` updates (continuously, or in jumps with `staircase`); decay_steps > 0.
  ExponentialDecay(double initial_learning_rate, int64_t decay_steps, double decay_rate,
                   bool staircase = false);
  double operator()(int64_t step) const override;
  std::string to_json() const override;

 private:
  double initial_learning_rate_;
  int64_t decay_steps_;
  double decay_rate_;
  bool staircase_;
};

/// values[0] while step <= boundaries[0], values[i] while boundaries[i-1] < step <=
/// boundaries[i], values.back() after the last boundary. values has one more entry than
/// boundaries, which increase strictly.
class PiecewiseConstant : public LearningRateSchedule {
 public:
  /// `values.size()` must be `boundaries.size() + 1`; boundaries increase strictly.
  PiecewiseConstant(std::vector<int64_t> boundaries, std::vector<double> values);
  double operator()(int64_t step) const override;
  std::string to_json() const override;

 private:
  std::vector<int64_t> boundaries_;
  std::vector<double> values_;
};

/// Keras 3 CosineDecay with optional linear warmup. Without warmup_target:
///   s = min(step, decay_steps); lr = initial * ((1 - alpha) * 0.5 * (1 + cos(pi * s /
///   decay_steps)) + alpha).
/// With warmup_target: s = min(step, warmup_steps + decay_steps); while s < warmup_steps the
/// rate rises linearly from initial to warmup_target (initial + (target - initial) * s /
/// warmup_steps); afterwards the cosine above decays from warmup_target over
/// (s - warmup_steps).
class CosineDecay : public LearningRateSchedule {
 public:
  /// From `initial_learning_rate` down to `alpha` times it over `decay_steps` updates, after
  /// `warmup_steps` of linear warmup to `warmup_target` when that is set (the decay then starts
  /// from warmup_target).
  CosineDecay(double initial_learning_rate, int64_t decay_steps, double alpha = 0.0,
              std::optional<double> warmup_target = std::nullopt, int64_t warmup_steps = 0);
  double operator()(int64_t step) const override;
  std::string to_json() const override;

 private:
  double initial_learning_rate_;
  int64_t decay_steps_;
  double alpha_;
  std::optional<double> warmup_target_;
  int64_t warmup_steps_;
};

}  // namespace schedules

/// An optimizer's learning rate: a number (`.learning_rate = 1e-3`) or any schedule
/// (`.learning_rate = schedules::CosineDecay(1e-3, 10000)`).
class LearningRate {
 public:
  /// A constant rate.
  LearningRate(double value);  // implicit: a constant rate reads naturally in Options
  /// Any schedule, by value (copied into the optimizer).
  template <typename Schedule>
  requires std::derived_from<Schedule, schedules::LearningRateSchedule> LearningRate(
      Schedule schedule)  // implicit, as above
      : schedule_(std::make_shared<Schedule>(std::move(schedule))) {}
  /// A schedule shared with the caller.
  explicit LearningRate(std::shared_ptr<const schedules::LearningRateSchedule> schedule);

  /// The rate for the update that follows `step` earlier updates.
  double operator()(int64_t step) const { return (*schedule_)(step); }
  /// The schedule (a Constant for a number).
  const schedules::LearningRateSchedule& schedule() const { return *schedule_; }

 private:
  std::shared_ptr<const schedules::LearningRateSchedule> schedule_;
};

}  // namespace tandem::optim
