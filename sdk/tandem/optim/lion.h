// Lion (Chen et al., "Symbolic Discovery of Optimization Algorithms", 2023) with Keras 3's
// semantics and float32 operation order: the update is the sign of an interpolation of the
// momentum and the gradient, so every element moves by the learning rate.
#pragma once

#include <optional>

#include "tandem/optim/optimizer.h"

namespace tandem::optim {

/// Keras Lion. Slot "m" (the momentum, starting at 0). At each update, after the decoupled
/// weight decay w -= w * weight_decay * lr when weight_decay > 0:
///   w -= lr * sign(m * beta_1 + g * (1 - beta_1));  m = m * beta_2 + g * (1 - beta_2).
/// Lion's steps are as large as the learning rate in every element: its learning rate is
/// usually 3-10x smaller than AdamW's, and its weight decay as much larger.
class Lion : public Optimizer {
 public:
  /// Keras's arguments and defaults: `Lion({.learning_rate = 1e-4})`.
  struct Options {
    /// A constant or a schedule of the update step (schedules.h).
    LearningRate learning_rate = 0.001;
    /// Interpolation weight of the momentum in the update's direction, in (0, 1].
    double beta_1 = 0.9;
    /// Decay of the momentum m, in [0, 1].
    double beta_2 = 0.99;
    /// Decoupled decay per update, scaled by the learning rate (0: none; Keras's None);
    /// exclude_from_weight_decay exempts variables.
    double weight_decay = 0.0;
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
  /// Keras's defaults. Write `td::optim::Lion optimizer;` for it.
  Lion();
  /// With `options`.
  explicit Lion(Options options);

  std::string config_json() const override;

 protected:
  void update_step(std::span<const Tensor> gradients, std::span<Tensor> variables,
                   std::vector<std::vector<Tensor>>& slots, double learning_rate,
                   int64_t step) override;

 private:
  Options options_;
};

}  // namespace tandem::optim
