// SGD update step (keras/src/optimizers/sgd.py, same operation order), one fused pass per
// variable, all variables of a dtype in one batched call.
#include "tandem/optim/sgd.h"

#include "tandem/core/error.h"
#include "tandem/ops/optimizer_updates.h"
#include "tandem/optim/internal/json_number.h"

namespace tandem::optim {

namespace {
std::vector<std::string> sgd_slots(double momentum) {
  if (momentum == 0.0) return {};
  return {"momentum"};
}
}  // namespace

SGD::SGD() : SGD(Options{}) {}

SGD::SGD(Options options)
    : Optimizer("sgd", options.learning_rate, options.global_clipnorm,
                options.gradient_accumulation_steps, options.shard_optimizer_state,
                sgd_slots(options.momentum)),
      options_(std::move(options)) {
  TANDEM_CHECK(options_.momentum >= 0.0 && options_.momentum <= 1.0,
               "SGD: momentum must be in [0, 1], got ", options_.momentum);
}

void SGD::update_step(std::span<const Tensor> gradients, std::span<Tensor> variables,
                      std::vector<std::vector<Tensor>>& slots, double learning_rate, int64_t step) {
  (void)step;
  const size_t expected = options_.momentum == 0.0 ? 0 : 1;
  TANDEM_CHECK(slots.size() == expected, "SGD: expected ", expected, " slot(s), got ",
               slots.size());
  if (slots.empty()) {
    ops::sgd_update_(variables, gradients, learning_rate);  // w -= g * lr
    return;
  }
  // m = m * momentum - g * lr; w += m, or with nesterov w += m * momentum - g * lr.
  ops::sgd_momentum_update_(variables, gradients, slots[0], learning_rate, options_.momentum,
                            options_.nesterov);
}

std::string SGD::config_json() const {
  std::string out = "{";
  out += base_config_json();
  out += ", \"momentum\": " + detail::json_number(options_.momentum);
  out += std::string(", \"nesterov\": ") + (options_.nesterov ? "true" : "false") + "}";
  return out;
}

}  // namespace tandem::optim
