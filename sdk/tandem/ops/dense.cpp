// The fused dense op, act(x @ kernel + bias), and its backward: one recorded node instead of
// matmul, add and relu, one pass over the output each way, and no input GEMM for an input no
// tape tracks.
#include "tandem/ops/cpu/dense.h"

#include "tandem/ops/internal/op_helpers.h"
#include "tandem/ops/kernels/functors.h"
#include "tandem/ops/ops.h"

namespace tandem::ops {

using internal::check_floating;
using internal::check_same_dtype;
using internal::common_device;
using internal::dispatch;
using internal::ptr;
using internal::record_op;
using internal::run_gemm;
using internal::run_relu_backward;
using internal::run_sum;

namespace {

constexpr std::string_view kOp = "dense";

/// The forward on the device of its inputs: CPU as one fused kernel; CUDA as one cuBLASLt
/// matmul with a bias and ReLU epilogue for float32 and the 16-bit types (cuda::dense_forward).
void run_dense(const Tensor& x, const Tensor& kernel, const Tensor& bias, bool relu, Tensor& y) {
  const int64_t m = x.dim(0), depth = x.dim(1), n = kernel.dim(1);
  const bool has_bias = bias.defined();
  dispatch_any_floating(x.dtype(), kOp, [&]<typename T>() {
    dispatch(
        kOp, x.device(),
        [&] {
          cpu::dense(m, n, depth, x.data<T>(), kernel.data<T>(),
                     has_bias ? bias.data<T>() : nullptr, relu, y.data<T>());
        },
        TANDEM_ON_CUDA(cuda::dense_forward(m, n, depth, ptr<T>(x), ptr<T>(kernel),
                                           has_bias ? ptr<T>(bias) : nullptr, relu, ptr<T>(y),
                                           stream)));
  });
}

}  // namespace

Tensor dense(const Tensor& x, const Tensor& kernel, const Tensor& bias,
             FusedActivation activation) {
  const bool has_bias = bias.defined();
  if (has_bias)
    common_device(kOp, {&x, &kernel, &bias});
  else
    common_device(kOp, {&x, &kernel});
  TANDEM_CHECK(x.rank() == 2 && kernel.rank() == 2 && x.dim(1) == kernel.dim(0), kOp,
               ": needs x [M, K] and kernel [K, N], got shapes ", x.shape(), " and ",
               kernel.shape());
  check_floating(kOp, x);
  check_same_dtype(kOp, x, kernel);
  if (has_bias) {
    TANDEM_CHECK(bias.rank() == 1 && bias.dim(0) == kernel.dim(1), kOp, ": bias of shape ",
                 bias.shape(), " does not match kernel of shape ", kernel.shape(), " (needs [",
                 kernel.dim(1), "])");
    check_same_dtype(kOp, x, bias);
  }
  const bool relu = activation == FusedActivation::kRelu;
  Tensor y = Tensor::empty(Shape{x.dim(0), kernel.dim(1)}, x.dtype(), x.device());
  run_dense(x, kernel, bias, relu, y);

  std::vector<Tensor> inputs{x, kernel};
  if (has_bias) inputs.push_back(bias);
  if (!needs_recording(inputs)) return y;
  // Decided now, as whether to record at all is: a tape that tracks x tracks it from here on.
  const bool x_needs_grad = needs_recording({&x});
  record_op(
      kOp, std::move(inputs), y, [x, kernel, y, has_bias, relu, x_needs_grad](const Tensor& g) {
        const int64_t m = x.dim(0), depth = x.dim(1), n = kernel.dim(1);
        Tensor dz = g;
        Tensor bias_grad = has_bias ? Tensor::empty(Shape{n}, g.dtype(), g.device()) : Tensor();
        if (relu) {
          dz = Tensor::empty_like(g);
          run_relu_backward(kOp, g, y, dz, bias_grad);
        } else if (has_bias) {
          bias_grad = run_sum(kOp, g, 1, m, n, Shape{n});
        }
        // dkernel = x^T dz and dx = dz kernel^T, each one GEMM (as matmul's backward).
        Tensor kernel_grad = Tensor::empty(kernel.shape(), g.dtype(), g.device());
        run_gemm(kOp, true, false, depth, n, m, x, dz, kernel_grad);
        Tensor x_grad;
        if (x_needs_grad) {
          x_grad = Tensor::empty(x.shape(), g.dtype(), g.device());
          run_gemm(kOp, false, true, m, depth, n, dz, kernel, x_grad);
        }
        std::vector<Tensor> grads{x_grad, kernel_grad};
        if (has_bias) grads.push_back(bias_grad);
        return grads;
      });
  return y;
}

}  // namespace tandem::ops
