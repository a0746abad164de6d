// Fused optimizer updates: SGD (plain, momentum, Nesterov), Adam/AdamW, and any rule of
// TANDEM_FUSED_UPDATE_RULES through fused_update_, each one pass over a variable that
// reads and writes it and its slots once, in place, with no temporary tensor. The
// results are bit for bit those of the same update written with the separate ops of ops.h (the
// Keras operation order the optimizers of optim/ follow). Not recorded on tapes. The batched
// forms update all variables of an optimizer step at once: on CUDA in one multi-tensor launch.
#pragma once

#include <span>
#include <string_view>

#include "tandem/tensor/tensor.h"

namespace tandem::ops {

// Every tensor of one call has the variable's shape, floating dtype and device. The scalars are
// converted to that dtype, as the scalar forms of ops.h convert theirs.

/// Plain SGD: variable -= gradient * learning_rate.
void sgd_update_(Tensor& variable, const Tensor& gradient, double learning_rate);

/// SGD with momentum; `velocity` is the momentum slot (it includes -learning_rate):
///   velocity = velocity * momentum - gradient * learning_rate
///   variable += velocity, or with `nesterov`: variable += velocity * momentum - gradient * lr.
void sgd_momentum_update_(Tensor& variable, const Tensor& gradient, Tensor& velocity,
                          double learning_rate, double momentum, bool nesterov);

/// The scalars of one Adam step, computed by the caller in the variable's precision.
struct AdamStep {
  /// lr * sqrt(1 - beta_2^t) / (1 - beta_1^t).
  double alpha = 0.0;
  /// 1 - beta_1: the first moment's update weight.
  double one_minus_beta_1 = 0.0;
  /// 1 - beta_2: the second moment's update weight.
  double one_minus_beta_2 = 0.0;
  /// Added to sqrt(v).
  double epsilon = 0.0;
  /// AdamW's decoupled weight decay (0: plain Adam): variable -= (variable * weight_decay) *
  /// learning_rate before the Adam step.
  double weight_decay = 0.0;
  /// The step's learning rate (what the weight decay is scaled by).
  double learning_rate = 0.0;
};

/// Adam in place on the variable and its slots `m` and `v` (raw first and second moments):
///   m += (g - m) * (1 - beta_1);  v += (g * g - v) * (1 - beta_2)
///   variable -= (m * alpha) / (sqrt(v) + epsilon)
/// after AdamW's weight decay when step.weight_decay > 0.
void adam_update_(Tensor& variable, const Tensor& gradient, Tensor& m, Tensor& v,
                  const AdamStep& step);

// Batched forms: element i of every span belongs to variables[i], the spans have one length,
// and each variable's tensors follow the rules above (variables may differ in shape, dtype and
// device). The result is that of the single-variable form called on each variable. On the CPU
// the variables are updated one after the other; on CUDA the variables of one dtype and GPU
// are updated by one kernel launch (one per 64 variables).

/// sgd_update_ on every variable.
void sgd_update_(std::span<Tensor> variables, std::span<const Tensor> gradients,
                 double learning_rate);
/// sgd_momentum_update_ on every variable, velocities[i] being variables[i]'s slot.
void sgd_momentum_update_(std::span<Tensor> variables, std::span<const Tensor> gradients,
                          std::span<Tensor> velocities, double learning_rate, double momentum,
                          bool nesterov);
/// adam_update_ on every variable, m[i] and v[i] being variables[i]'s slots.
void adam_update_(std::span<Tensor> variables, std::span<const Tensor> gradients,
                  std::span<Tensor> m, std::span<Tensor> v, const AdamStep& step);

/// Any rule of TANDEM_FUSED_UPDATE_RULES (ops/kernels/optimizer_functors.h) on every variable,
/// as the forms above run theirs: slots[s][i] is slot s of variables[i] (Rule<T>::kSlots kinds,
/// named by slot_names in error messages, which start with `op`); the float32 variables update
/// with f32, the float64 ones with f64. What an optimizer with its own rule calls from its
/// update_step: fused_update_<kernels::MyUpdate>("my_rule", variables, gradients, slots,
/// slot_names, MyUpdate<float>{...}, MyUpdate<double>{...}).
template <template <typename> class Rule>
void fused_update_(std::string_view op, std::span<Tensor> variables,
                   std::span<const Tensor> gradients, std::span<const std::span<Tensor>> slots,
                   std::span<const char* const> slot_names, const Rule<float>& f32,
                   const Rule<double>& f64);

}  // namespace tandem::ops
