// SGD with optional (Nesterov) momentum, Keras semantics and float32 operation order.
#pragma once

#include <optional>

#include "tandem/optim/optimizer.h"

namespace tandem::optim {

/// Keras SGD. Without momentum: w -= lr * g. With momentum (slot "momentum", a velocity that
/// already includes -lr, starting at 0): m = momentum * m - lr * g; w += m, or with nesterov
/// w += momentum * m - lr * g (using the new m).
class SGD : public Optimizer {
 public:
  /// Keras's arguments and defaults: `SGD({.learning_rate = 0.1, .momentum = 0.9})`.
  struct Options {
    /// A constant or a schedule of the update step (schedules.h).
    LearningRate learning_rate = 0.01;
    /// In [0, 1]; 0: plain gradient descent, no slot.
    double momentum = 0.0;
    /// Nesterov momentum (needs momentum > 0 to matter).
    bool nesterov = false;
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
  /// Keras's defaults: learning rate 0.01, no momentum.
  /// Write `td::optim::SGD optimizer;` for it: `optimizer({})` does not compile, since `{}`
  /// could as well be an empty SGD to copy as empty options.
  SGD();
  /// With `options`.
  explicit SGD(Options options);
  /// The options the optimizer was made with.
  const Options& options() const { return options_; }
  std::string config_json() const override;

 protected:
  void update_step(std::span<const Tensor> gradients, std::span<Tensor> variables,
                   std::vector<std::vector<Tensor>>& slots, double learning_rate,
                   int64_t step) override;

 private:
  Options options_;
};

}  // namespace tandem::optim
