// Building blocks shared by the op families (elementwise.cpp, reductions.cpp, shape_ops.cpp,
// nn_ops.cpp, ...): argument checks, recording of single-output ops, and the unrecorded
// elementwise and reduction runners the ops and their backward passes are made of.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "tandem/ops/cpu/elementwise.h"
#include "tandem/ops/internal/dispatch.h"
#include "tandem/ops/kernels/functors.h"
#include "tandem/ops/recording.h"

namespace tandem::ops::internal {

// ---- tape recording -------------------------------------------------------------------------

/// True when `out` can carry a gradient and a tape on this thread tracks one of `inputs`.
inline bool tracked(const Tensor& out, std::initializer_list<const Tensor*> inputs) {
  return is_floating(out.dtype()) && needs_recording(inputs);
}

/// Records a single-output op. `backward` maps the output's gradient to one gradient per input
/// (undefined for inputs that get none); it runs with recording paused and uses ops itself.
template <typename Backward>
void record_op(std::string_view op, std::vector<Tensor> inputs, const Tensor& out,
               Backward backward) {
  const size_t count = inputs.size();
  record(op, std::move(inputs), {out},
         [count,
          backward = std::move(backward)](const std::vector<Tensor>& grads) -> std::vector<Tensor> {
           // An undefined output gradient means zero: every input gets none.
           if (!grads[0].defined()) return std::vector<Tensor>(count);
           return backward(grads[0]);
         });
}

// ---- argument checks ------------------------------------------------------------------------

/// The shape `a` and `b` broadcast to; raises naming `op` when they cannot.
Shape broadcast_shape(std::string_view op, const Shape& a, const Shape& b);
void check_floating(std::string_view op, const Tensor& x);
void check_same_dtype(std::string_view op, const Tensor& a, const Tensor& b);

// ---- elementwise building blocks (not recorded) ---------------------------------------------

/// out [shape] = f(a, b) broadcast to `shape`, elements of type R (void: the inputs' type).
template <DTypes kTypes, typename R = void, typename F>
Tensor run_binary(std::string_view op, const F& f, const Tensor& a, const Tensor& b,
                  const Shape& shape) {
  Tensor out;
  for_dtype<kTypes>(a.dtype(), op, [&]<typename T>() {
    using Out = std::conditional_t<std::is_void_v<R>, T, R>;
    out = Tensor::empty(shape, dtype_of<Out>, a.device());
    if (out.numel() == 0) return;
    const kernels::BroadcastPlan plan = kernels::make_broadcast_plan(a.shape(), b.shape(), shape);
    dispatch(
        op, a.device(), [&] { cpu::binary(f, plan, a.data<T>(), b.data<T>(), out.data<Out>()); },
        TANDEM_ON_CUDA(cuda::binary(f, plan, ptr<T>(a), ptr<T>(b), ptr<Out>(out), stream)));
  });
  return out;
}

/// Checked binary op with numpy broadcasting (not recorded).
template <DTypes kTypes, typename R = void, typename F>
Tensor binary(std::string_view op, const F& f, const Tensor& a, const Tensor& b) {
  common_device(op, {&a, &b});
  check_same_dtype(op, a, b);
  return run_binary<kTypes, R>(op, f, a, b, broadcast_shape(op, a.shape(), b.shape()));
}

/// Checked floating-point unary op (not recorded).
template <typename F>
Tensor unary(std::string_view op, const F& f, const Tensor& x) {
  const Device device = common_device(op, {&x});
  Tensor y = Tensor::empty(x.shape(), x.dtype(), device);
  dispatch_any_floating(x.dtype(), op, [&]<typename T>() {
    dispatch(
        op, device, [&] { cpu::unary(f, x.numel(), x.data<T>(), y.data<T>()); },
        TANDEM_ON_CUDA(cuda::unary(f, x.numel(), ptr<T>(x), ptr<T>(y), stream)));
  });
  return y;
}

/// A backward functor applied to (x or y, g) of the same shape.
template <typename F>
Tensor grad_map(std::string_view op, const F& f, const Tensor& x, const Tensor& g) {
  return run_binary<DTypes::kFloating>(op, f, x, g, x.shape());
}

/// x broadcast to `shape` (which x broadcasts to): the backward of reductions and sum_to.
Tensor broadcast_to(const Tensor& x, const Shape& shape);
/// The scalar `value` as a rank-0 tensor of x's dtype on x's device.
Tensor scalar_like(const Tensor& x, double value);
/// a / value, recorded with a as the only input (the scalar gets no gradient).
Tensor div_scalar(const Tensor& a, double value);

// ---- GEMM ------------------------------------------------------------------------------------

/// C [m, n] = op(A) op(B) through cpu::gemm or cuda::gemm (not recorded; shapes already
/// checked; every matrix contiguous). The 16-bit types sum in float32 and round C once
/// (cpu::matmul; cuBLASLt on a GPU). kk == 0 writes zeros.
void run_gemm(std::string_view op, bool transpose_a, bool transpose_b, int64_t m, int64_t n,
              int64_t kk, const Tensor& a, const Tensor& b, Tensor& c);

// ---- fused layers ---------------------------------------------------------------------------

/// The output-gradient pass of a fused layer with a ReLU, over matrices g, y and dz [m, n]
/// (contiguous views of any shape): dz = g where y > 0, else 0, and, when `bias_grad` is
/// defined, bias_grad [n] = sum(dz, axis 0) in the same pass (not recorded).
void run_relu_backward(std::string_view op, const Tensor& g, const Tensor& y, Tensor& dz,
                       Tensor& bias_grad);

// ---- reductions -----------------------------------------------------------------------------

/// A tensor viewed as [outer, n, inner] around one axis.
struct AxisView {
  size_t axis;
  int64_t outer, n, inner;
};
AxisView axis_view(std::string_view op, const Shape& shape, int64_t axis);
/// `shape` without `axis` (or with it set to 1 when `keepdims`).
Shape reduced_shape(const Shape& shape, size_t axis, bool keepdims);
/// The sum of x viewed as [outer, n, inner] over n, shaped `shape` (not recorded).
Tensor run_sum(std::string_view op, const Tensor& x, int64_t outer, int64_t n, int64_t inner,
               const Shape& shape);

// ---- labels ---------------------------------------------------------------------------------

/// Calls fn.template operator()<L>() with L the C++ type of int32 or int64 labels.
template <typename Fn>
void dispatch_labels(DType dtype, const Fn& fn) {
  if (dtype == DType::kInt32)
    fn.template operator()<int32_t>();
  else
    fn.template operator()<int64_t>();
}

/// Raises naming the first label outside [0, depth) and its index (int32/int64 labels; `what`
/// names them in the message). On a GPU the host must wait for the answer: one stream
/// synchronisation per call.
void check_labels(std::string_view op, const Tensor& labels, int64_t depth,
                  std::string_view what = "label");

}  // namespace tandem::ops::internal
