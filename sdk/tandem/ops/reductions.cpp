// Reductions: sum_to (the reverse of broadcasting), sum, mean, max and argmax, each with its
// backward.
#include <tuple>
#include <utility>

#include "tandem/ops/cpu/reduce.h"
#include "tandem/ops/internal/op_helpers.h"
#include "tandem/ops/kernels/functors.h"
#include "tandem/ops/ops.h"

namespace tandem::ops {

namespace k = kernels;

using internal::axis_view;
using internal::AxisView;
using internal::binary;
using internal::broadcast_shape;
using internal::broadcast_to;
using internal::check_floating;
using internal::common_device;
using internal::dispatch;
using internal::div_scalar;
using internal::DTypes;
using internal::ptr;
using internal::record_op;
using internal::reduced_shape;
using internal::run_sum;
using internal::scalar_like;
using internal::tracked;

namespace {

/// Max over n of x viewed as [outer, n, inner], with the first index reaching it (int64
/// [outer * inner]); not recorded.
std::pair<Tensor, Tensor> run_max(std::string_view op, const Tensor& x, int64_t outer, int64_t n,
                                  int64_t inner, const Shape& shape, bool values) {
  TANDEM_CHECK(n > 0, op, ": cannot reduce an empty axis (shape ", x.shape(), ")");
  Tensor y = values ? Tensor::empty(shape, x.dtype(), x.device()) : Tensor();
  Tensor index = Tensor::empty(values ? Shape{outer * inner} : shape, DType::kInt64, x.device());
  dispatch_any_numeric(x.dtype(), op, [&]<typename T>() {
    dispatch(
        op, x.device(),
        [&] {
          if (index.numel() > 0)
            cpu::max(x.data<T>(), outer, n, inner, values ? y.data<T>() : nullptr,
                     index.data<int64_t>());
        },
        TANDEM_ON_CUDA(if (index.numel() > 0)
                           cuda::max(ptr<T>(x), outer, n, inner, values ? ptr<T>(y) : nullptr,
                                     ptr<int64_t>(index), stream)));
  });
  return {y, index};
}

/// The gradient of a max: g (outer * inner elements) routed to the argmax positions of x.
Tensor max_backward(const Tensor& g, const Tensor& index, const Shape& x_shape, int64_t outer,
                    int64_t n, int64_t inner) {
  Tensor dx = Tensor::empty(x_shape, g.dtype(), g.device());
  dispatch_any_floating(g.dtype(), "max", [&]<typename T>() {
    dispatch(
        "max", g.device(),
        [&] {
          if (dx.numel() > 0)
            cpu::scatter_argmax(g.data<T>(), index.data<int64_t>(), outer, n, inner, dx.data<T>());
        },
        TANDEM_ON_CUDA(if (dx.numel() > 0) cuda::scatter_argmax(
            ptr<T>(g), ptr<int64_t>(index), outer, n, inner, ptr<T>(dx), stream)));
  });
  return dx;
}

}  // namespace

Tensor sum_to(const Tensor& x, const Shape& shape) {
  common_device("sum_to", {&x});
  TANDEM_CHECK(shape.rank() <= x.rank() && broadcast_shape("sum_to", shape, x.shape()) == x.shape(),
               "sum_to: shape ", shape, " does not broadcast to ", x.shape());
  if (x.shape() == shape) return x;
  // Collapse x's axes into runs that are all kept or all summed (size-1 axes are neither),
  // then sum the runs away from the innermost outwards.
  struct Run {
    int64_t size;
    bool summed;
  };
  std::vector<Run> runs;
  const int64_t lead = x.rank() - shape.rank();
  for (int64_t i = 0; i < x.rank(); ++i) {
    const int64_t d = x.dim(i);
    if (d == 1) continue;
    const bool summed = i < lead || shape[i - lead] == 1;
    if (!runs.empty() && runs.back().summed == summed)
      runs.back().size *= d;
    else
      runs.push_back({d, summed});
  }
  Tensor y = x;
  for (size_t r = runs.size(); r-- > 0;) {
    if (!runs[r].summed) continue;
    int64_t outer = 1, inner = 1;
    for (size_t i = 0; i < r; ++i) outer *= runs[i].size;
    for (size_t i = r + 1; i < runs.size(); ++i) inner *= runs[i].size;
    y = run_sum("sum_to", y, outer, runs[r].size, inner, Shape{outer * inner});
    runs[r].size = 1;
  }
  y = y.view_as(shape);
  if (tracked(y, {&x}))
    record_op("sum_to", {x}, y, [xs = x.shape()](const Tensor& g) {
      return std::vector<Tensor>{broadcast_to(g, xs)};
    });
  return y;
}

// ---- reductions -----------------------------------------------------------------------------

Tensor sum(const Tensor& x) {
  common_device("sum", {&x});
  Tensor y = run_sum("sum", x, 1, x.numel(), 1, Shape{});
  if (tracked(y, {&x}))
    record_op("sum", {x}, y, [xs = x.shape()](const Tensor& g) {
      return std::vector<Tensor>{broadcast_to(g, xs)};
    });
  return y;
}

Tensor sum(const Tensor& x, int64_t axis, bool keepdims) {
  common_device("sum", {&x});
  const AxisView v = axis_view("sum", x.shape(), axis);
  Tensor y = run_sum("sum", x, v.outer, v.n, v.inner, reduced_shape(x.shape(), v.axis, keepdims));
  if (tracked(y, {&x}))
    record_op("sum", {x}, y,
              [xs = x.shape(), kept = reduced_shape(x.shape(), v.axis, true)](const Tensor& g) {
                return std::vector<Tensor>{broadcast_to(g.view_as(kept), xs)};
              });
  return y;
}

Tensor mean(const Tensor& x) {
  common_device("mean", {&x});
  check_floating("mean", x);
  // TensorFlow's mean divides the sum by the count (not multiplies by its inverse); so do we.
  Tensor y = run_sum("mean", x, 1, x.numel(), 1, Shape{});
  y = binary<DTypes::kFloating>("mean", k::Div{}, y,
                                scalar_like(y, static_cast<double>(x.numel())));
  if (tracked(y, {&x}))
    record_op("mean", {x}, y, [xs = x.shape()](const Tensor& g) {
      return std::vector<Tensor>{div_scalar(broadcast_to(g, xs), static_cast<double>(xs.numel()))};
    });
  return y;
}

Tensor mean(const Tensor& x, int64_t axis, bool keepdims) {
  common_device("mean", {&x});
  check_floating("mean", x);
  const AxisView v = axis_view("mean", x.shape(), axis);
  const Shape kept = reduced_shape(x.shape(), v.axis, true);
  Tensor y = run_sum("mean", x, v.outer, v.n, v.inner, reduced_shape(x.shape(), v.axis, keepdims));
  y = binary<DTypes::kFloating>("mean", k::Div{}, y, scalar_like(y, static_cast<double>(v.n)));
  if (tracked(y, {&x}))
    record_op("mean", {x}, y, [xs = x.shape(), kept, n = v.n](const Tensor& g) {
      return std::vector<Tensor>{
          div_scalar(broadcast_to(g.view_as(kept), xs), static_cast<double>(n))};
    });
  return y;
}

Tensor max(const Tensor& x) {
  common_device("max", {&x});
  Tensor y, index;
  std::tie(y, index) = run_max("max", x, 1, x.numel(), 1, Shape{}, /*values=*/true);
  if (tracked(y, {&x}))
    record_op("max", {x}, y, [xs = x.shape(), index](const Tensor& g) {
      return std::vector<Tensor>{max_backward(g, index, xs, 1, xs.numel(), 1)};
    });
  return y;
}

Tensor max(const Tensor& x, int64_t axis, bool keepdims) {
  common_device("max", {&x});
  const AxisView v = axis_view("max", x.shape(), axis);
  Tensor y, index;
  std::tie(y, index) = run_max("max", x, v.outer, v.n, v.inner,
                               reduced_shape(x.shape(), v.axis, keepdims), /*values=*/true);
  if (tracked(y, {&x}))
    record_op("max", {x}, y, [xs = x.shape(), index, v](const Tensor& g) {
      return std::vector<Tensor>{max_backward(g, index, xs, v.outer, v.n, v.inner)};
    });
  return y;
}

Tensor argmax(const Tensor& x, int64_t axis) {
  common_device("argmax", {&x});
  const AxisView v = axis_view("argmax", x.shape(), axis);
  return run_max("argmax", x, v.outer, v.n, v.inner, reduced_shape(x.shape(), v.axis, false),
                 /*values=*/false)
      .second;
}

}  // namespace tandem::ops
