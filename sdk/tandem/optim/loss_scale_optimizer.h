// LossScaleOptimizer: loss scaling for float16 (and, when wanted, bfloat16) training, with
// Keras 3's dynamic rule, wrapped around any optimizer. The loss is multiplied by the scale
// before the backward pass (scale_loss), so that small float16 gradients do not flush to zero;
// each update then sees the gradients combined across every replica and worker, and
//   - when all of them are finite: divides them by the scale (before clipping), lets the inner
//     optimizer update, and doubles the scale after dynamic_growth_steps finite updates in a
//     row;
//   - when any is not: skips the update (the inner optimizer's iterations() does not count it,
//     as in Keras 3) and halves the scale.
// The decision is taken on the combined gradients, which every replica holds bitwise alike (an
// Inf or NaN in one replica's gradient makes the sum non-finite everywhere), so every replica
// and worker skips or applies the same update without an extra collective. With gradient
// accumulation it is taken once per update, on the mean of the micro-steps' gradients.
#pragma once

#include <atomic>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "tandem/autograd/variable.h"
#include "tandem/optim/optimizer.h"
#include "tandem/tensor/tensor.h"

namespace tandem::optim {

/// LossScaleOptimizer's options, Keras 3's defaults.
struct LossScaleOptions {
  /// The scale the first update uses (Keras's initial_scale, 2^15).
  double initial_scale = 32768.0;
  /// Finite updates in a row after which the scale doubles (Keras's dynamic_growth_steps).
  int64_t dynamic_growth_steps = 2000;
  /// false: a fixed scale (Keras's loss_scale_factor): the gradients are divided by it and no
  /// update is skipped.
  bool dynamic = true;
};

/// Loss scaling around an optimizer (Keras 3's LossScaleOptimizer), for float16 training. It is
/// an Optimizer, so the step reads as with any other: differentiate optimizer.scale_loss(loss)
/// and pass the gradients to optimizer.apply_gradients(ctx, ...), which unscales them and
/// updates, or skips the update when they are not finite. Everything else (iterations, slots,
/// learning rate, accumulation) is the wrapped optimizer's.
class LossScaleOptimizer final : public Optimizer {
 public:
  /// Wraps `inner`, which must outlive this object and be wrapped by no other. Make it where
  /// the inner optimizer is made (inside strategy.scope()): its scale ("dynamic_scale",
  /// float32) and counter ("step_counter", int64) are variables, mirrored on every replica.
  explicit LossScaleOptimizer(Optimizer& inner, LossScaleOptions options = {});

  /// The wrapped optimizer.
  Optimizer& inner_optimizer() const { return inner_; }
  /// The options it was made with.
  const LossScaleOptions& options() const { return options_; }

  /// loss x the current scale (recorded: differentiate the scaled loss).
  Tensor scale_loss(const Tensor& loss) const override;

  /// The current scale: inside strategy.run this replica's copy, outside replica 0's (all
  /// replicas hold the same).
  double loss_scale() const;
  /// Finite updates since the scale last changed (Keras's step_counter).
  int64_t step_counter() const;
  /// Updates skipped for non-finite gradients since this object was made (not checkpointed).
  int64_t skipped_updates() const { return skipped_.load(std::memory_order_relaxed); }
  /// Sets the scale and the counter on every replica copy (checkpoint restore). Raises for a
  /// scale that is not finite and positive or a counter outside [0, dynamic_growth_steps).
  void set_state(double scale, int64_t step_counter);

  /// The scale as the float32 variable "dynamic_scale" (one copy per replica; checkpointed).
  const Variable& dynamic_scale_variable() const { return dynamic_scale_; }
  /// The counter as the int64 variable "step_counter" (one copy per replica; checkpointed).
  const Variable& step_counter_variable() const { return step_counter_; }

  /// Keras-style JSON of the options.
  std::string config_json() const override;

 protected:
  /// Run by the inner optimizer before each update: unscales `gradients` in place and returns
  /// true, or returns false (skip) for non-finite ones, moving the scale either way.
  bool transform_gradients(std::vector<Tensor>& gradients, GradientSync* shards) override;
  /// A dynamic scale skips non-finite updates (a fixed one does not).
  bool expects_non_finite_gradients() const override { return options_.dynamic; }
  /// Never called: the inner optimizer updates.
  void update_step(std::span<const Tensor> gradients, std::span<Tensor> variables,
                   std::vector<std::vector<Tensor>>& slots, double learning_rate,
                   int64_t step) override;

 private:
  Optimizer& inner_;
  LossScaleOptions options_;
  Variable dynamic_scale_;
  Variable step_counter_;
  std::atomic<int64_t> skipped_{0};
};

}  // namespace tandem::optim
