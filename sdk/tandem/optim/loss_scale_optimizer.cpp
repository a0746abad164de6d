// LossScaleOptimizer: Keras 3's dynamic loss scale around any optimizer, decided on the
// gradients combined across the replicas.
#include "tandem/optim/loss_scale_optimizer.h"

#include <cmath>

#include "tandem/autograd/tape.h"
#include "tandem/core/error.h"
#include "tandem/core/spans.h"
#include "tandem/ops/ops.h"
#include "tandem/optim/internal/json_number.h"

namespace tandem::optim {

LossScaleOptimizer::LossScaleOptimizer(Optimizer& inner, LossScaleOptions options)
    : Optimizer("loss_scale_optimizer", inner), inner_(inner), options_(options) {
  TANDEM_CHECK(std::isfinite(options_.initial_scale) && options_.initial_scale > 0,
               "LossScaleOptimizer: initial_scale must be finite and positive, got ",
               options_.initial_scale);
  TANDEM_CHECK(options_.dynamic_growth_steps >= 1,
               "LossScaleOptimizer: dynamic_growth_steps must be >= 1, got ",
               options_.dynamic_growth_steps);
  dynamic_scale_ = make_variable("dynamic_scale",
                                 Tensor::scalar(options_.initial_scale, DType::kFloat32), false);
  step_counter_ = make_variable("step_counter", Tensor::scalar(0, DType::kInt64), false);
  keep_on_host(dynamic_scale_);
  keep_on_host(step_counter_);
}

Tensor LossScaleOptimizer::scale_loss(const Tensor& loss) const { return loss * loss_scale(); }

void LossScaleOptimizer::update_step(std::span<const Tensor> /*gradients*/,
                                     std::span<Tensor> /*variables*/,
                                     std::vector<std::vector<Tensor>>& /*slots*/,
                                     double /*learning_rate*/, int64_t /*step*/) {
  TANDEM_THROW("LossScaleOptimizer: update_step is the wrapped optimizer's (\"", inner_.name(),
               "\")");
}

double LossScaleOptimizer::loss_scale() const {
  return dynamic_scale_.value_untracked().item<double>();
}

int64_t LossScaleOptimizer::step_counter() const {
  return step_counter_.value_untracked().item<int64_t>();
}

void LossScaleOptimizer::set_state(double scale, int64_t step_counter) {
  TANDEM_CHECK(
      std::isfinite(scale) && scale > 0 && static_cast<double>(static_cast<float>(scale)) == scale,
      "LossScaleOptimizer: a loss scale must be a finite positive float32, got ", scale);
  TANDEM_CHECK(step_counter >= 0 && step_counter < options_.dynamic_growth_steps,
               "LossScaleOptimizer: step_counter ", step_counter, " is outside [0, ",
               options_.dynamic_growth_steps, ") (dynamic_growth_steps)");
  for (int r = 0; r < dynamic_scale_.num_copies(); ++r) {
    Tensor copy = dynamic_scale_.copy(r);
    copy.fill_(scale);
  }
  for (int r = 0; r < step_counter_.num_copies(); ++r) {
    Tensor copy = step_counter_.copy(r);
    copy.fill_(static_cast<double>(step_counter));
  }
}

std::string LossScaleOptimizer::config_json() const {
  return tandem::detail::str_cat("{\"name\": \"loss_scale_optimizer\", \"initial_scale\": ",
                                 detail::json_number(options_.initial_scale),
                                 ", \"dynamic_growth_steps\": ", options_.dynamic_growth_steps,
                                 ", \"dynamic\": ", options_.dynamic ? "true" : "false", "}");
}

bool LossScaleOptimizer::transform_gradients(std::vector<Tensor>& gradients, GradientSync* shards) {
  autograd::NoRecordGuard no_record;
  const double scale = loss_scale();
  if (options_.dynamic) {
    int64_t non_finite = 0;
    for (const Tensor& g : gradients) {
      if (!g.defined()) continue;
      non_finite += ops::count_non_finite(g).total();
      if (non_finite > 0 && shards == nullptr) break;  // every replica sees every gradient
    }
    // Sharded: the replicas' counts summed, so that every replica takes the same decision.
    if (shards != nullptr)
      non_finite =
          shards->sum_of_shards(Tensor::scalar(static_cast<double>(non_finite), DType::kFloat64))
                      .item<double>() > 0
              ? 1
              : 0;
    if (non_finite > 0) {
      // Keras 3: halve the scale, restart the count, leave the variables and iterations alone.
      dynamic_scale_.assign(Tensor::scalar(scale * 0.5, DType::kFloat32));
      step_counter_.assign(Tensor::scalar(0, DType::kInt64));
      if (current_replica_binding().replica_id == 0) {
        skipped_.fetch_add(1, std::memory_order_relaxed);
        profile::record_instant(profile::Phase::kSkippedUpdate, scale);  // the timeline
        profile::record_instant(profile::Phase::kLossScale, scale * 0.5);
      }
      return false;
    }
  }
  for (Tensor& g : gradients)
    if (g.defined()) g = g / scale;  // exact: the dynamic scale is a power of two
  if (options_.dynamic) {
    const int64_t counter = step_counter();
    const bool grow = counter == options_.dynamic_growth_steps - 1;
    if (grow) {
      step_counter_.assign(Tensor::scalar(0, DType::kInt64));
      dynamic_scale_.assign(Tensor::scalar(scale * 2.0, DType::kFloat32));
    } else {
      step_counter_.assign(Tensor::scalar(static_cast<double>(counter + 1), DType::kInt64));
    }
    if (current_replica_binding().replica_id == 0)
      profile::record_instant(profile::Phase::kLossScale, grow ? scale * 2.0 : scale);
  } else if (current_replica_binding().replica_id == 0) {
    profile::record_instant(profile::Phase::kLossScale, scale);
  }
  return true;
}

}  // namespace tandem::optim
