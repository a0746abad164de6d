// Batch normalization in training mode and layer normalization as one op each: the
// statistics, the normalized output and, in the backward, the gradients of x, gamma and beta,
// each a few passes over x (ops/cpu/batch_norm.cpp, ops/cpu/layer_norm.cpp) instead of a chain
// of elementwise ops and reductions.
#include "tandem/ops/cpu/batch_norm.h"
#include "tandem/ops/cpu/layer_norm.h"
#include "tandem/ops/internal/op_helpers.h"
#include "tandem/ops/ops.h"

namespace tandem::ops {

using internal::record_op;
using internal::tracked;

namespace {

/// Both ops' arguments: x [rows, `axis`] of float32 or float64 on the CPU, gamma and beta
/// undefined or [axis] of x's dtype and device, epsilon > 0.
void check_arguments(std::string_view op, std::string_view axis, const Tensor& x,
                     const Tensor& gamma, const Tensor& beta, double epsilon) {
  TANDEM_CHECK(batch_norm_supported(x), op, ": needs x [rows, ", axis,
               "] of float32 or float64 on the CPU, got ", x.dtype(), " ", x.shape(), " on ",
               x.device());
  const int64_t width = x.dim(1);
  for (const Tensor* p : {&gamma, &beta})
    TANDEM_CHECK(!p->defined() || (p->dtype() == x.dtype() && p->shape() == Shape{width} &&
                                   p->device() == x.device()),
                 op, ": gamma and beta must be ", x.dtype(), " [", width, "] on ", x.device(),
                 ", got ", p->dtype(), " ", p->shape());
  TANDEM_CHECK(epsilon > 0.0, op, ": epsilon must be > 0, got ", epsilon);
}

}  // namespace

bool batch_norm_supported(const Tensor& x) {
  return x.defined() && x.device().is_cpu() && x.rank() == 2 &&
         (x.dtype() == DType::kFloat32 || x.dtype() == DType::kFloat64);
}

Tensor batch_norm(const Tensor& x, const Tensor& gamma, const Tensor& beta, double epsilon,
                  Tensor& mean, Tensor& variance, bool relu) {
  constexpr std::string_view op = "batch_norm";
  check_arguments(op, "channels", x, gamma, beta, epsilon);
  const int64_t rows = x.dim(0), channels = x.dim(1);
  Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());
  mean = Tensor::empty(Shape{channels}, x.dtype(), x.device());
  variance = Tensor::empty(Shape{channels}, x.dtype(), x.device());
  Tensor inverse = Tensor::empty(Shape{channels}, x.dtype(), x.device());
  dispatch_floating(x.dtype(), op, [&]<typename T>() {
    cpu::batch_norm_forward(x.data<T>(), rows, channels,
                            gamma.defined() ? gamma.data<T>() : nullptr,
                            beta.defined() ? beta.data<T>() : nullptr, epsilon, relu, y.data<T>(),
                            mean.data<T>(), variance.data<T>(), inverse.data<T>());
  });
  std::vector<Tensor> inputs{x};
  if (gamma.defined()) inputs.push_back(gamma);
  if (beta.defined()) inputs.push_back(beta);
  if (tracked(y, {&x, &gamma, &beta}))
    record_op(
        op, inputs, y,
        [x, gamma, has_beta = beta.defined(), mean = mean, inverse,
         relu_output = relu ? y : Tensor()](const Tensor& g) {
          const int64_t rows = x.dim(0), channels = x.dim(1);
          Tensor dx = Tensor::empty(x.shape(), x.dtype(), x.device());
          Tensor dgamma =
              gamma.defined() ? Tensor::empty(Shape{channels}, x.dtype(), x.device()) : Tensor();
          Tensor dbeta =
              has_beta ? Tensor::empty(Shape{channels}, x.dtype(), x.device()) : Tensor();
          dispatch_floating(x.dtype(), "batch_norm", [&]<typename T>() {
            cpu::batch_norm_backward(
                x.data<T>(), g.data<T>(), relu_output.defined() ? relu_output.data<T>() : nullptr,
                rows, channels, gamma.defined() ? gamma.data<T>() : nullptr, mean.data<T>(),
                inverse.data<T>(), dx.data<T>(), dgamma.defined() ? dgamma.data<T>() : nullptr,
                dbeta.defined() ? dbeta.data<T>() : nullptr);
          });
          std::vector<Tensor> grads{dx};
          if (gamma.defined()) grads.push_back(dgamma);
          if (has_beta) grads.push_back(dbeta);
          return grads;
        });
  return y;
}

bool layer_norm_supported(const Tensor& x) { return batch_norm_supported(x); }

Tensor layer_norm(const Tensor& x, const Tensor& gamma, const Tensor& beta, double epsilon) {
  constexpr std::string_view op = "layer_norm";
  check_arguments(op, "features", x, gamma, beta, epsilon);
  const int64_t rows = x.dim(0), features = x.dim(1);
  Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());
  Tensor mean = Tensor::empty(Shape{rows}, x.dtype(), x.device());
  Tensor inverse = Tensor::empty(Shape{rows}, x.dtype(), x.device());
  dispatch_floating(x.dtype(), op, [&]<typename T>() {
    cpu::layer_norm_forward(x.data<T>(), rows, features,
                            gamma.defined() ? gamma.data<T>() : nullptr,
                            beta.defined() ? beta.data<T>() : nullptr, epsilon, y.data<T>(),
                            mean.data<T>(), inverse.data<T>());
  });
  std::vector<Tensor> inputs{x};
  if (gamma.defined()) inputs.push_back(gamma);
  if (beta.defined()) inputs.push_back(beta);
  if (tracked(y, {&x, &gamma, &beta}))
    record_op(op, inputs, y, [x, gamma, has_beta = beta.defined(), mean, inverse](const Tensor& g) {
      const int64_t rows = x.dim(0), features = x.dim(1);
      Tensor dx = Tensor::empty(x.shape(), x.dtype(), x.device());
      Tensor dgamma =
          gamma.defined() ? Tensor::empty(Shape{features}, x.dtype(), x.device()) : Tensor();
      Tensor dbeta = has_beta ? Tensor::empty(Shape{features}, x.dtype(), x.device()) : Tensor();
      const Tensor g_in = g.dtype() == x.dtype() ? g : cast(g, x.dtype());
      dispatch_floating(x.dtype(), "layer_norm", [&]<typename T>() {
        cpu::layer_norm_backward(x.data<T>(), g_in.data<T>(), rows, features,
                                 gamma.defined() ? gamma.data<T>() : nullptr, mean.data<T>(),
                                 inverse.data<T>(), dx.data<T>(),
                                 dgamma.defined() ? dgamma.data<T>() : nullptr,
                                 dbeta.defined() ? dbeta.data<T>() : nullptr);
      });
      std::vector<Tensor> grads{dx};
      if (gamma.defined()) grads.push_back(dgamma);
      if (has_beta) grads.push_back(dbeta);
      return grads;
    });
  return y;
}

}  // namespace tandem::ops
