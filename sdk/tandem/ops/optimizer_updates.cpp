// The fused optimizer updates: argument checks and the dispatch of the shared update functors
// (ops/kernels/optimizer_functors.h) to the CPU loop or the CUDA kernel.
#include "tandem/ops/optimizer_updates.h"

#include <string_view>

#include "tandem/ops/cpu/optimizer_updates.h"
#include "tandem/ops/internal/dispatch.h"

namespace tandem::ops {

namespace k = kernels;

using internal::common_device;
using internal::dispatch;
using internal::ptr;

namespace {

/// Raises unless `variable` holds floating-point values and each of `others` (named by
/// `names`) matches its shape and dtype; the device check is common_device's.
void check_update(std::string_view op, const Tensor& variable,
                  std::initializer_list<const Tensor*> others,
                  std::initializer_list<const char*> names) {
  TANDEM_CHECK(variable.defined(), op, ": the variable is an undefined tensor");
  TANDEM_CHECK(is_floating(variable.dtype()), op, ": the variable holds ", variable.dtype(),
               "; optimizer updates need a floating dtype");
  const char* const* name = names.begin();
  for (const Tensor* t : others) {
    TANDEM_CHECK(t->defined(), op, ": the ", *name, " is an undefined tensor");
    TANDEM_CHECK(t->shape() == variable.shape(), op, ": the ", *name, " has shape ", t->shape(),
                 " but the variable has shape ", variable.shape());
    TANDEM_CHECK(t->dtype() == variable.dtype(), op, ": the ", *name, " is ", t->dtype(),
                 " but the variable is ", variable.dtype());
    ++name;
  }
}

}  // namespace

void sgd_update_(Tensor& variable, const Tensor& gradient, double learning_rate) {
  check_update("sgd_update_", variable, {&gradient}, {"gradient"});
  common_device("sgd_update_", {&variable, &gradient});
  const int64_t n = variable.numel();
  if (n == 0) return;
  dispatch_floating(variable.dtype(), "sgd_update_", [&]<typename T>() {
    const k::SgdUpdate<T> f{static_cast<T>(learning_rate)};
    dispatch(
        "sgd_update_", variable.device(),
        [&] { cpu::optimizer_update(f, n, ptr<T>(variable), ptr<T>(gradient)); },
        TANDEM_ON_CUDA(cuda::optimizer_update(f, n, ptr<T>(variable), ptr<T>(gradient), stream)));
  });
}

void sgd_momentum_update_(Tensor& variable, const Tensor& gradient, Tensor& velocity,
                          double learning_rate, double momentum, bool nesterov) {
  check_update("sgd_momentum_update_", variable, {&gradient, &velocity}, {"gradient", "velocity"});
  common_device("sgd_momentum_update_", {&variable, &gradient, &velocity});
  const int64_t n = variable.numel();
  if (n == 0) return;
  dispatch_floating(variable.dtype(), "sgd_momentum_update_", [&]<typename T>() {
    const k::SgdMomentumUpdate<T> f{static_cast<T>(learning_rate), static_cast<T>(momentum),
                                    nesterov};
    dispatch(
        "sgd_momentum_update_", variable.device(),
        [&] { cpu::optimizer_update(f, n, ptr<T>(variable), ptr<T>(gradient), ptr<T>(velocity)); },
        TANDEM_ON_CUDA(cuda::optimizer_update(f, n, ptr<T>(variable), ptr<T>(gradient),
                                              ptr<T>(velocity), stream)));
  });
}

void adam_update_(Tensor& variable, const Tensor& gradient, Tensor& m, Tensor& v,
                  const AdamStep& step) {
  check_update("adam_update_", variable, {&gradient, &m, &v}, {"gradient", "slot m", "slot v"});
  common_device("adam_update_", {&variable, &gradient, &m, &v});
  TANDEM_CHECK(step.weight_decay >= 0.0, "adam_update_: weight_decay must be >= 0, got ",
               step.weight_decay);
  const int64_t n = variable.numel();
  if (n == 0) return;
  dispatch_floating(variable.dtype(), "adam_update_", [&]<typename T>() {
    const k::AdamUpdate<T> f{.alpha = static_cast<T>(step.alpha),
                             .one_minus_beta_1 = static_cast<T>(step.one_minus_beta_1),
                             .one_minus_beta_2 = static_cast<T>(step.one_minus_beta_2),
                             .epsilon = static_cast<T>(step.epsilon),
                             .decay = step.weight_decay > 0.0,
                             .weight_decay = static_cast<T>(step.weight_decay),
                             .learning_rate = static_cast<T>(step.learning_rate)};
    dispatch(
        "adam_update_", variable.device(),
        [&] {
          cpu::optimizer_update(f, n, ptr<T>(variable), ptr<T>(gradient), ptr<T>(m), ptr<T>(v));
        },
        TANDEM_ON_CUDA(cuda::optimizer_update(f, n, ptr<T>(variable), ptr<T>(gradient), ptr<T>(m),
                                              ptr<T>(v), stream)));
  });
}

}  // namespace tandem::ops
