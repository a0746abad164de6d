// SGD update step (keras/src/optimizers/sgd.py, same operation order).
#include "tandem/optim/sgd.h"

#include "tandem/core/error.h"
#include "tandem/ops/ops.h"
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
                options.gradient_accumulation_steps, sgd_slots(options.momentum)),
      options_(std::move(options)) {
  TANDEM_CHECK(options_.momentum >= 0.0 && options_.momentum <= 1.0,
               "SGD: momentum must be in [0, 1], got ", options_.momentum);
}

void SGD::update_step(const Tensor& gradient, Tensor& variable, std::vector<Tensor>& slots,
                      double learning_rate, int64_t step) {
  (void)step;
  const Tensor scaled = ops::mul(gradient, learning_rate);  // g * lr
  if (slots.empty()) {
    ops::add_(variable, scaled, -1.0);  // w -= g * lr
    return;
  }
  Tensor& m = slots[0];
  const double momentum = options_.momentum;
  m.copy_from(ops::sub(ops::mul(m, momentum), scaled));  // m = m * momentum - g * lr
  if (options_.nesterov) {
    ops::add_(variable, ops::sub(ops::mul(m, momentum), scaled));  // w += m * momentum - g * lr
  } else {
    ops::add_(variable, m);  // w += m
  }
}

std::string SGD::config_json() const {
  std::string out = "{";
  out += base_config_json();
  out += ", \"momentum\": " + detail::json_number(options_.momentum);
  out += std::string(", \"nesterov\": ") + (options_.nesterov ? "true" : "false") + "}";
  return out;
}

}  // namespace tandem::optim
