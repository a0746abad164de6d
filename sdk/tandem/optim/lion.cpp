// Lion update step (keras/src/optimizers/lion.py and base_optimizer's _apply_weight_decay, same
// float operation order): one fused pass per variable, all variables of a dtype in one call.
#include "tandem/optim/lion.h"

#include <array>

#include "tandem/core/error.h"
#include "tandem/ops/kernels/optimizer_functors.h"
#include "tandem/ops/optimizer_updates.h"
#include "tandem/optim/internal/json_number.h"

namespace tandem::optim {

Lion::Lion() : Lion(Options{}) {}

Lion::Lion(Options options)
    : Optimizer("lion", options.learning_rate, options.global_clipnorm,
                options.gradient_accumulation_steps, options.shard_optimizer_state, {"m"}),
      options_(std::move(options)) {
  // Keras refuses beta_1 <= 0: the update would ignore the gradient (sign of the momentum).
  TANDEM_CHECK(options_.beta_1 > 0.0 && options_.beta_1 <= 1.0,
               "lion: beta_1 must be in (0, 1], got ", options_.beta_1);
  TANDEM_CHECK(options_.beta_2 >= 0.0 && options_.beta_2 <= 1.0,
               "lion: beta_2 must be in [0, 1], got ", options_.beta_2);
  TANDEM_CHECK(options_.weight_decay >= 0.0, "lion: weight_decay must be >= 0, got ",
               options_.weight_decay);
}

void Lion::update_step(std::span<const Tensor> gradients, std::span<Tensor> variables,
                       std::vector<std::vector<Tensor>>& slots, double learning_rate,
                       int64_t /*step*/) {
  TANDEM_CHECK(slots.size() == 1, name(), ": expected the slot m, got ", slots.size(), " slots");
  if (variables.empty()) return;
  const bool decay = options_.weight_decay > 0.0 && weight_decay_applies();
  // Keras casts lr, beta_1 and beta_2 to the variable's dtype and computes 1 - beta there.
  auto rule = [&]<typename T>() {
    const T beta_1 = static_cast<T>(options_.beta_1), beta_2 = static_cast<T>(options_.beta_2);
    return ops::kernels::LionUpdate<T>{.learning_rate = static_cast<T>(learning_rate),
                                       .beta_1 = beta_1,
                                       .one_minus_beta_1 = T(1) - beta_1,
                                       .beta_2 = beta_2,
                                       .one_minus_beta_2 = T(1) - beta_2,
                                       .decay = decay,
                                       .weight_decay = static_cast<T>(options_.weight_decay)};
  };
  const std::array<std::span<Tensor>, 1> slot_kinds{slots[0]};
  constexpr std::array<const char*, 1> kSlotNames{"slot m"};
  ops::fused_update_<ops::kernels::LionUpdate>(name(), variables, gradients, slot_kinds, kSlotNames,
                                               rule.operator()<float>(), rule.operator()<double>());
}

std::string Lion::config_json() const {
  std::string out = "{";
  out += base_config_json();
  out += ", \"weight_decay\": " + detail::json_number(options_.weight_decay);
  out += ", \"beta_1\": " + detail::json_number(options_.beta_1);
  out += ", \"beta_2\": " + detail::json_number(options_.beta_2) + "}";
  return out;
}

}  // namespace tandem::optim
