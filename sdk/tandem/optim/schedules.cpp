// Learning-rate schedules (Keras formulas, evaluated in double precision).
#include "tandem/optim/schedules.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "tandem/core/error.h"
#include "tandem/optim/internal/json_number.h"

namespace tandem::optim {

using detail::json_number;

namespace schedules {

Constant::Constant(double learning_rate) : learning_rate_(learning_rate) {
  TANDEM_CHECK(std::isfinite(learning_rate) && learning_rate >= 0.0,
               "learning rate must be finite and >= 0, got ", learning_rate);
}

double Constant::operator()(int64_t step) const {
  (void)step;
  return learning_rate_;
}

std::string Constant::to_json() const { return json_number(learning_rate_); }

ExponentialDecay::ExponentialDecay(double initial_learning_rate, int64_t decay_steps,
                                   double decay_rate, bool staircase)
    : initial_learning_rate_(initial_learning_rate),
      decay_steps_(decay_steps),
      decay_rate_(decay_rate),
      staircase_(staircase) {
  TANDEM_CHECK(decay_steps > 0, "ExponentialDecay: decay_steps must be positive, got ",
               decay_steps);
}

double ExponentialDecay::operator()(int64_t step) const {
  double p = static_cast<double>(step) / static_cast<double>(decay_steps_);
  if (staircase_) p = std::floor(p);
  return initial_learning_rate_ * std::pow(decay_rate_, p);
}

std::string ExponentialDecay::to_json() const {
  return "{\"class_name\": \"ExponentialDecay\", \"config\": {\"initial_learning_rate\": " +
         json_number(initial_learning_rate_) +
         ", \"decay_steps\": " + std::to_string(decay_steps_) +
         ", \"decay_rate\": " + json_number(decay_rate_) +
         ", \"staircase\": " + (staircase_ ? "true" : "false") + "}}";
}

PiecewiseConstant::PiecewiseConstant(std::vector<int64_t> boundaries, std::vector<double> values)
    : boundaries_(std::move(boundaries)), values_(std::move(values)) {
  TANDEM_CHECK(values_.size() == boundaries_.size() + 1, "PiecewiseConstant: ", boundaries_.size(),
               " boundaries need ", boundaries_.size() + 1, " values, got ", values_.size());
  for (size_t i = 1; i < boundaries_.size(); ++i) {
    TANDEM_CHECK(boundaries_[i - 1] < boundaries_[i],
                 "PiecewiseConstant: boundaries must increase, but boundary ", i - 1, " is ",
                 boundaries_[i - 1], " and boundary ", i, " is ", boundaries_[i]);
  }
}

double PiecewiseConstant::operator()(int64_t step) const {
  // The first boundary >= step selects its value; past the last boundary, the last value.
  const auto it = std::lower_bound(boundaries_.begin(), boundaries_.end(), step);
  return values_[static_cast<size_t>(it - boundaries_.begin())];
}

std::string PiecewiseConstant::to_json() const {
  std::string b, v;
  for (int64_t x : boundaries_) {
    if (!b.empty()) b += ", ";
    b += std::to_string(x);
  }
  for (double x : values_) {
    if (!v.empty()) v += ", ";
    v += json_number(x);
  }
  return "{\"class_name\": \"PiecewiseConstantDecay\", \"config\": {\"boundaries\": [" + b +
         "], \"values\": [" + v + "]}}";
}

CosineDecay::CosineDecay(double initial_learning_rate, int64_t decay_steps, double alpha,
                         std::optional<double> warmup_target, int64_t warmup_steps)
    : initial_learning_rate_(initial_learning_rate),
      decay_steps_(decay_steps),
      alpha_(alpha),
      warmup_target_(warmup_target),
      warmup_steps_(warmup_steps) {
  TANDEM_CHECK(decay_steps > 0, "CosineDecay: decay_steps must be positive, got ", decay_steps);
  TANDEM_CHECK(warmup_steps >= 0, "CosineDecay: warmup_steps must be >= 0, got ", warmup_steps);
}

double CosineDecay::operator()(int64_t step) const {
  const double decay_steps = static_cast<double>(decay_steps_);
  auto decay = [&](double s, double from) {
    const double cosine = 0.5 * (1.0 + std::cos(std::numbers::pi * s / decay_steps));
    return from * ((1.0 - alpha_) * cosine + alpha_);
  };
  double s = static_cast<double>(step);
  if (!warmup_target_) return decay(std::min(s, decay_steps), initial_learning_rate_);
  const double warmup_steps = static_cast<double>(warmup_steps_);
  s = std::min(s, decay_steps + warmup_steps);
  if (s < warmup_steps) {
    return (*warmup_target_ - initial_learning_rate_) * (s / warmup_steps) + initial_learning_rate_;
  }
  return decay(s - warmup_steps, *warmup_target_);
}

std::string CosineDecay::to_json() const {
  return "{\"class_name\": \"CosineDecay\", \"config\": {\"initial_learning_rate\": " +
         json_number(initial_learning_rate_) +
         ", \"decay_steps\": " + std::to_string(decay_steps_) +
         ", \"alpha\": " + json_number(alpha_) + ", \"warmup_target\": " +
         (warmup_target_ ? json_number(*warmup_target_) : std::string("null")) +
         ", \"warmup_steps\": " + std::to_string(warmup_steps_) + "}}";
}

}  // namespace schedules

LearningRate::LearningRate(double value)
    : schedule_(std::make_shared<schedules::Constant>(value)) {}

LearningRate::LearningRate(std::shared_ptr<const schedules::LearningRateSchedule> schedule)
    : schedule_(std::move(schedule)) {
  TANDEM_CHECK(schedule_ != nullptr, "LearningRate: null schedule");
}

}  // namespace tandem::optim
