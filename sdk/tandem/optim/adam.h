// Adam and AdamW with Keras semantics (epsilon added to sqrt of the uncorrected v; decoupled
// weight decay scaled by the learning rate) and Keras' float32 operation order.
#pragma once

#include <optional>

#include "tandem/optim/optimizer.h"

namespace tandem::optim {

/// Keras Adam. Slots "m" and "v" (raw moments, starting at 0). At update t (1-based):
///   m += (g - m) * (1 - beta_1);  v += (g * g - v) * (1 - beta_2)
///   alpha = lr * sqrt(1 - beta_2^t) / (1 - beta_1^t);  w -= m * alpha / (sqrt(v) + epsilon)
class Adam : public Optimizer {
 public:
  /// Keras's arguments and defaults: `Adam({.learning_rate = 1e-3})`.
  struct Options {
    /// A constant or a schedule of the update step (schedules.h).
    LearningRate learning_rate = 0.001;
    /// Decay of the first moment m, in [0, 1).
    double beta_1 = 0.9;
    /// Decay of the second moment v, in [0, 1).
    double beta_2 = 0.999;
    /// Added to sqrt(v) (Keras's placement, not sqrt(v_hat)).
    double epsilon = 1e-7;
    /// Clip the gradients to this global norm before the update (unset: no clipping).
    std::optional<double> global_clipnorm = std::nullopt;
    /// Update once every N calls of apply_gradients, with the mean of the N gradients (N >= 1;
    /// see Optimizer::gradient_accumulation_steps()).
    int gradient_accumulation_steps = 1;
    /// Optimizer-state sharding (ZeRO): 0 every replica holds every slot; 1 each replica holds
    /// the slots of the variables it owns only, updates those and sends them to the others;
    /// 2 it also receives only those variables' summed gradients (see
    /// Optimizer::shard_optimizer_state()).
    int shard_optimizer_state = 0;
  };
  /// Keras's defaults.
  /// Write `td::optim::Adam optimizer;` for it: `optimizer({})` does not compile, since `{}`
  /// could as well be an empty Adam to copy as empty options.
  Adam();
  /// With `options`.
  explicit Adam(Options options);
  std::string config_json() const override;

 protected:
  /// AdamW's constructor: the same update after a decoupled weight decay.
  Adam(std::string name, Options options, double weight_decay);
  void update_step(std::span<const Tensor> gradients, std::span<Tensor> variables,
                   std::vector<std::vector<Tensor>>& slots, double learning_rate,
                   int64_t step) override;

 private:
  Options options_;
  double weight_decay_;
};

/// Keras AdamW: first w -= w * weight_decay * lr (on every variable, before its Adam step),
/// then the Adam update.
class AdamW : public Adam {
 public:
  /// Keras's arguments and defaults: Adam's plus weight_decay.
  struct Options {
    /// A constant or a schedule of the update step (schedules.h).
    LearningRate learning_rate = 0.001;
    /// Decoupled decay per update, scaled by the learning rate: w -= w * weight_decay * lr.
    double weight_decay = 0.004;
    /// Decay of the first moment m, in [0, 1).
    double beta_1 = 0.9;
    /// Decay of the second moment v, in [0, 1).
    double beta_2 = 0.999;
    /// Added to sqrt(v) (Keras's placement, not sqrt(v_hat)).
    double epsilon = 1e-7;
    /// Clip the gradients to this global norm before the update (unset: no clipping).
    std::optional<double> global_clipnorm = std::nullopt;
    /// Update once every N calls of apply_gradients, with the mean of the N gradients (N >= 1;
    /// see Optimizer::gradient_accumulation_steps()).
    int gradient_accumulation_steps = 1;
    /// Optimizer-state sharding (ZeRO): 0 every replica holds every slot; 1 each replica holds
    /// the slots of the variables it owns only, updates those and sends them to the others;
    /// 2 it also receives only those variables' summed gradients (see
    /// Optimizer::shard_optimizer_state()).
    int shard_optimizer_state = 0;
  };
  /// Keras's defaults (weight decay 0.004).
  AdamW();
  /// With `options`.
  explicit AdamW(Options options);
};

}  // namespace tandem::optim
