// BatchNormalization (normalization.h): the batch statistics, local or summed over the replicas
// (autograd::replica_sum), composed from recorded ops so that gradients flow through them.
#include "tandem/nn/normalization.h"

#include <utility>
#include <vector>

#include "tandem/autograd/replica_sum.h"
#include "tandem/autograd/tape.h"
#include "tandem/core/error.h"
#include "tandem/nn/initializers.h"
#include "tandem/ops/ops.h"

namespace tandem::nn {

BatchNormalizationImpl::BatchNormalizationImpl(const BatchNormalizationOptions& options)
    : ModuleImpl("batch_normalization"), options_(options) {
  TANDEM_CHECK(options.momentum >= 0.0 && options.momentum <= 1.0,
               "BatchNormalization: momentum must be in [0, 1], got ", options.momentum);
  TANDEM_CHECK(options.epsilon > 0.0, "BatchNormalization: epsilon must be > 0, got ",
               options.epsilon);
  TANDEM_CHECK(options.activation == Activation::kNone || options.activation == Activation::kRelu,
               "BatchNormalization: activation must be kNone or kRelu (fused), got \"",
               activation_name(options.activation),
               "\"; add an ActivationLayer after it for others");
}

void BatchNormalizationImpl::build_variables(const Shape& input_shape, Generator&) {
  TANDEM_CHECK(input_shape.rank() >= 1, describe(),
               " needs inputs with a feature axis, got an input shape ", input_shape);
  const int64_t features = input_shape[-1];
  const DType type = dtype();
  // Keras's order and initial values: gamma ones, beta zeros, moving mean zeros, moving
  // variance ones.
  if (options_.scale) gamma_ = add_weight("gamma", Tensor::ones({features}, type));
  if (options_.center) beta_ = add_weight("beta", Tensor::zeros({features}, type));
  const VariableOptions statistic{.trainable = false,
                                  .synchronization = VariableSynchronization::kOnRead,
                                  .aggregation = VariableAggregation::kMean};
  moving_mean_ = add_weight("moving_mean", Tensor::zeros({features}, type), statistic);
  moving_variance_ = add_weight("moving_variance", Tensor::ones({features}, type), statistic);
}

Tensor BatchNormalizationImpl::call(const Tensor& x, bool training) {
  return normalize(x, training, options_.activation == Activation::kRelu);
}

Tensor BatchNormalizationImpl::call_then_relu(const Tensor& x, bool training) {
  return normalize(x, training, /*relu=*/true);
}

Tensor BatchNormalizationImpl::normalize(const Tensor& x, bool training, bool relu) {
  const DType type = moving_mean_.dtype();  // the variables' (float32 under a mixed policy)
  const Tensor input = x.dtype() == type ? x : ops::cast(x, type);
  const int64_t features = input.dim(-1);
  const int64_t rows = features > 0 ? input.numel() / features : 0;
  const Tensor flat = ops::reshape(input, Shape{rows, features});
  const auto scalar = [&](double v) { return Tensor::scalar(v, type).to(input.device()); };
  Tensor mean, variance;
  if (training && !options_.synchronized && ops::batch_norm_supported(flat)) {
    // One op for the statistics, the output and its backward (this replica's rows).
    Tensor y = ops::batch_norm(flat, options_.scale ? gamma_.value() : Tensor(),
                               options_.center ? beta_.value() : Tensor(), options_.epsilon, mean,
                               variance, relu);
    {
      const autograd::NoRecordGuard no_record;
      const Tensor keep = scalar(options_.momentum), take = scalar(1.0 - options_.momentum);
      moving_mean_.assign(ops::add(ops::mul(moving_mean_.value(), keep), ops::mul(mean, take)));
      moving_variance_.assign(
          ops::add(ops::mul(moving_variance_.value(), keep), ops::mul(variance, take)));
    }
    y = ops::reshape(y, input.shape());
    return y.dtype() == x.dtype() ? y : ops::cast(y, x.dtype());
  }
  if (training) {
    if (options_.synchronized) {
      // One all-reduce of [sum, sum of squares, count] over every replica (an empty replica
      // adds zeros); the variance as E[x^2] - E[x]^2, clamped at 0 (Keras's synchronized
      // moments, which can round below 0).
      const std::vector<Tensor> sums = autograd::replica_sum(
          {ops::sum(flat, 0), ops::sum(ops::square(flat), 0),
           Tensor::full({1}, static_cast<double>(rows), type).to(input.device())});
      mean = ops::div(sums[0], sums[2]);
      variance = ops::relu(ops::sub(ops::div(sums[1], sums[2]), ops::square(mean)));
    } else {
      mean = ops::mean(flat, 0);
      variance = ops::mean(ops::square(ops::sub(flat, mean)), 0);
    }
    // This replica's copies of the moving statistics (synchronized on read).
    const autograd::NoRecordGuard no_record;
    const Tensor keep = scalar(options_.momentum), take = scalar(1.0 - options_.momentum);
    moving_mean_.assign(ops::add(ops::mul(moving_mean_.value(), keep), ops::mul(mean, take)));
    moving_variance_.assign(
        ops::add(ops::mul(moving_variance_.value(), keep), ops::mul(variance, take)));
  } else {
    mean = moving_mean_.value();
    variance = moving_variance_.value();
  }
  const Tensor inverse =
      ops::div(scalar(1.0), ops::sqrt(ops::add(variance, scalar(options_.epsilon))));
  Tensor y = ops::mul(ops::sub(flat, mean), inverse);
  if (options_.scale) y = ops::mul(y, gamma_.value());
  if (options_.center) y = ops::add(y, beta_.value());
  if (relu) y = ops::relu(y);
  y = ops::reshape(y, input.shape());
  return y.dtype() == x.dtype() ? y : ops::cast(y, x.dtype());
}

// ---- LayerNormalization ------------------------------------------------------------------------

LayerNormalizationImpl::LayerNormalizationImpl(const LayerNormalizationOptions& options)
    : ModuleImpl("layer_normalization"), options_(options) {
  TANDEM_CHECK(options.epsilon > 0.0, "LayerNormalization: epsilon must be > 0, got ",
               options.epsilon);
}

void LayerNormalizationImpl::build_variables(const Shape& input_shape, Generator&) {
  TANDEM_CHECK(input_shape.rank() >= 1, describe(),
               " needs inputs with a feature axis, got an input shape ", input_shape);
  const int64_t features = input_shape[-1];
  if (options_.scale) gamma_ = add_weight("gamma", Tensor::ones({features}, dtype()));
  if (options_.center) beta_ = add_weight("beta", Tensor::zeros({features}, dtype()));
}

void LayerNormalizationImpl::check_input(const Tensor& x) const {
  const Shape& in = input_shape();
  TANDEM_CHECK(x.rank() >= 2 && in.rank() >= 1 && x.dim(-1) == in[-1], describe(),
               " was built for ", in[-1], " features (the last axis) but got an input of shape ",
               x.shape());
}

Tensor LayerNormalizationImpl::call(const Tensor& x, bool) {
  const DType type = dtype();
  const Tensor input = x.dtype() == type ? x : ops::cast(x, type);
  const int64_t features = input.dim(-1);
  const int64_t rows = features > 0 ? input.numel() / features : 0;
  const Tensor flat = ops::reshape(input, Shape{rows, features});
  if (ops::layer_norm_supported(flat)) {  // one fused op on the CPU
    const Tensor y = ops::layer_norm(flat, options_.scale ? gamma_.value() : Tensor(),
                                     options_.center ? beta_.value() : Tensor(), options_.epsilon);
    const Tensor shaped = ops::reshape(y, input.shape());
    return shaped.dtype() == x.dtype() ? shaped : ops::cast(shaped, x.dtype());
  }
  const Tensor mean = ops::mean(flat, 1, /*keepdims=*/true);
  const Tensor centered = ops::sub(flat, mean);
  const Tensor variance = ops::mean(ops::square(centered), 1, /*keepdims=*/true);
  const Tensor one = Tensor::scalar(1.0, type).to(input.device());
  const Tensor inverse = ops::div(
      one,
      ops::sqrt(ops::add(variance, Tensor::scalar(options_.epsilon, type).to(input.device()))));
  Tensor y = ops::mul(centered, inverse);
  if (options_.scale) y = ops::mul(y, gamma_.value());
  if (options_.center) y = ops::add(y, beta_.value());
  y = ops::reshape(y, input.shape());
  return y.dtype() == x.dtype() ? y : ops::cast(y, x.dtype());
}

LayerNormalization::LayerNormalization(const LayerNormalizationOptions& options)
    : Module(std::make_shared<LayerNormalizationImpl>(options)) {}
LayerNormalization::LayerNormalization(std::shared_ptr<LayerNormalizationImpl> impl)
    : Module(std::move(impl)) {}

BatchNormalization::BatchNormalization(const BatchNormalizationOptions& options)
    : Module(std::make_shared<BatchNormalizationImpl>(options)) {}
BatchNormalization::BatchNormalization(std::shared_ptr<BatchNormalizationImpl> impl)
    : Module(std::move(impl)) {}

}  // namespace tandem::nn
