// Adam/AdamW update step (keras/src/optimizers/adam.py and base_optimizer's
// _apply_weight_decay, same float operation order), one fused pass per variable, all variables
// of a dtype in one batched call.
#include "tandem/optim/adam.h"

#include <cmath>

#include "tandem/core/error.h"
#include "tandem/ops/optimizer_updates.h"
#include "tandem/optim/internal/json_number.h"

namespace tandem::optim {

namespace {

void check_options(const char* who, const Adam::Options& o) {
  TANDEM_CHECK(o.beta_1 >= 0.0 && o.beta_1 < 1.0, who, ": beta_1 must be in [0, 1), got ",
               o.beta_1);
  TANDEM_CHECK(o.beta_2 >= 0.0 && o.beta_2 < 1.0, who, ": beta_2 must be in [0, 1), got ",
               o.beta_2);
  TANDEM_CHECK(o.epsilon >= 0.0, who, ": epsilon must be >= 0, got ", o.epsilon);
}

Adam::Options adam_options(const AdamW::Options& o) {
  return {.learning_rate = o.learning_rate,
          .beta_1 = o.beta_1,
          .beta_2 = o.beta_2,
          .epsilon = o.epsilon,
          .global_clipnorm = o.global_clipnorm,
          .gradient_accumulation_steps = o.gradient_accumulation_steps,
          .shard_optimizer_state = o.shard_optimizer_state};
}

}  // namespace

Adam::Adam() : Adam(Options{}) {}
Adam::Adam(Options options) : Adam("adam", std::move(options), 0.0) {}

Adam::Adam(std::string name, Options options, double weight_decay)
    : Optimizer(std::move(name), options.learning_rate, options.global_clipnorm,
                options.gradient_accumulation_steps, options.shard_optimizer_state, {"m", "v"}),
      options_(std::move(options)),
      weight_decay_(weight_decay) {
  check_options(this->name().c_str(), options_);
  TANDEM_CHECK(weight_decay >= 0.0, this->name(), ": weight_decay must be >= 0, got ",
               weight_decay);
}

void Adam::update_step(std::span<const Tensor> gradients, std::span<Tensor> variables,
                       std::vector<std::vector<Tensor>>& slots, double learning_rate,
                       int64_t step) {
  TANDEM_CHECK(slots.size() == 2, name(), ": expected the 2 slots m and v, got ", slots.size());
  if (variables.empty()) return;
  // Scalars in the variables' precision (one dtype per call), as Keras computes them on
  // tensors of that dtype: beta^t = pow(beta, t); (1 - beta) is the Python double rounded once.
  ops::AdamStep scalars{.epsilon = options_.epsilon,
                        .weight_decay = weight_decay_applies() ? weight_decay_ : 0.0,
                        .learning_rate = learning_rate};
  dispatch_floating(variables[0].dtype(), name(), [&]<typename T>() {
    const T lr = static_cast<T>(learning_rate);
    const T t = static_cast<T>(step);
    const T beta_1_power = std::pow(static_cast<T>(options_.beta_1), t);
    const T beta_2_power = std::pow(static_cast<T>(options_.beta_2), t);
    scalars.alpha =
        static_cast<double>(lr * std::sqrt(T(1) - beta_2_power) / (T(1) - beta_1_power));
    scalars.one_minus_beta_1 = static_cast<double>(static_cast<T>(1.0 - options_.beta_1));
    scalars.one_minus_beta_2 = static_cast<double>(static_cast<T>(1.0 - options_.beta_2));
  });
  // One pass: AdamW's w -= (w * weight_decay) * lr (on the weights before this step), then
  // m += (g - m) * (1 - beta_1); v += (g^2 - v) * (1 - beta_2); w -= m * alpha / (sqrt(v) + eps).
  ops::adam_update_(variables, gradients, slots[0], slots[1], scalars);
}

std::string Adam::config_json() const {
  std::string out = "{";
  out += base_config_json();
  out += ", \"weight_decay\": " + detail::json_number(weight_decay_);
  out += ", \"beta_1\": " + detail::json_number(options_.beta_1);
  out += ", \"beta_2\": " + detail::json_number(options_.beta_2);
  out += ", \"epsilon\": " + detail::json_number(options_.epsilon) + "}";
  return out;
}

AdamW::AdamW() : AdamW(Options{}) {}
AdamW::AdamW(Options options) : Adam("adamw", adam_options(options), options.weight_decay) {}

}  // namespace tandem::optim
