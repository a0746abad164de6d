// Elementwise ops: broadcasting arithmetic, unary math, activations (softmax is in nn_ops.cpp),
// comparison, logic, selection (where) and dtype conversion, each with its backward.
#include "tandem/ops/cpu/elementwise.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string_view>
#include <type_traits>
#include <vector>

#include "tandem/ops/cpu/shape_ops.h"
#include "tandem/ops/internal/op_helpers.h"
#include "tandem/ops/kernels/functors.h"
#include "tandem/ops/ops.h"

namespace tandem::ops {

namespace k = kernels;

using internal::binary;
using internal::broadcast_shape;
using internal::check_labels;
using internal::common_device;
using internal::dispatch;
using internal::dispatch_labels;
using internal::div_scalar;
using internal::DTypes;
using internal::for_dtype;
using internal::grad_map;
using internal::ptr;
using internal::record_op;
using internal::scalar_like;
using internal::tracked;
using internal::unary;

// ---- elementwise with broadcasting ----------------------------------------------------------

Shape broadcast_shapes(const Shape& a, const Shape& b) {
  return broadcast_shape("broadcast_shapes", a, b);
}

Tensor add(const Tensor& a, const Tensor& b) {
  Tensor out = binary<DTypes::kNumeric>("add", k::Add{}, a, b);
  if (tracked(out, {&a, &b}))
    record_op("add", {a, b}, out, [sa = a.shape(), sb = b.shape()](const Tensor& g) {
      return std::vector<Tensor>{sum_to(g, sa), sum_to(g, sb)};
    });
  return out;
}

Tensor add(const Tensor& a, const Tensor& b, FusedActivation activation) {
  if (activation == FusedActivation::kLinear) return add(a, b);
  Tensor out = binary<DTypes::kFloating>("add with a ReLU", k::AddRelu{}, a, b);
  if (tracked(out, {&a, &b}))
    record_op("add_relu", {a, b}, out, [out, sa = a.shape(), sb = b.shape()](const Tensor& g) {
      // relu's gradient passes g where a + b > 0, that is where the output is > 0.
      const Tensor masked = grad_map("add with a ReLU", k::ReluGrad{}, out, g);
      return std::vector<Tensor>{sum_to(masked, sa), sum_to(masked, sb)};
    });
  return out;
}

Tensor sub(const Tensor& a, const Tensor& b) {
  Tensor out = binary<DTypes::kNumeric>("sub", k::Sub{}, a, b);
  if (tracked(out, {&a, &b}))
    record_op("sub", {a, b}, out, [sa = a.shape(), sb = b.shape()](const Tensor& g) {
      return std::vector<Tensor>{sum_to(g, sa), sum_to(neg(g), sb)};
    });
  return out;
}

Tensor mul(const Tensor& a, const Tensor& b) {
  Tensor out = binary<DTypes::kNumeric>("mul", k::Mul{}, a, b);
  if (tracked(out, {&a, &b}))
    record_op("mul", {a, b}, out, [a, b](const Tensor& g) {
      return std::vector<Tensor>{sum_to(mul(g, b), a.shape()), sum_to(mul(g, a), b.shape())};
    });
  return out;
}

Tensor div(const Tensor& a, const Tensor& b) {
  Tensor out = binary<DTypes::kFloating>("div", k::Div{}, a, b);
  if (tracked(out, {&a, &b}))
    record_op("div", {a, b}, out, [a, b, out](const Tensor& g) {
      // d(a/b)/da = 1/b and d(a/b)/db = -a/b^2 = -(1/b) * out.
      const Tensor ga = div(g, b);
      return std::vector<Tensor>{sum_to(ga, a.shape()), sum_to(neg(mul(ga, out)), b.shape())};
    });
  return out;
}

Tensor maximum(const Tensor& a, const Tensor& b) {
  Tensor out = binary<DTypes::kNumeric>("maximum", k::Maximum{}, a, b);
  if (tracked(out, {&a, &b}))
    record_op("maximum", {a, b}, out, [a, b](const Tensor& g) {
      const Tensor ga = mul(g, binary<DTypes::kFloating>("maximum", k::MaximumMask{}, a, b));
      return std::vector<Tensor>{sum_to(ga, a.shape()), sum_to(sub(g, ga), b.shape())};
    });
  return out;
}

Tensor minimum(const Tensor& a, const Tensor& b) {
  Tensor out = binary<DTypes::kNumeric>("minimum", k::Minimum{}, a, b);
  if (tracked(out, {&a, &b}))
    record_op("minimum", {a, b}, out, [a, b](const Tensor& g) {
      const Tensor ga = mul(g, binary<DTypes::kFloating>("minimum", k::MinimumMask{}, a, b));
      return std::vector<Tensor>{sum_to(ga, a.shape()), sum_to(sub(g, ga), b.shape())};
    });
  return out;
}

Tensor add(const Tensor& a, double b) {
  common_device("add", {&a});
  Tensor out = binary<DTypes::kNumeric>("add", k::Add{}, a, scalar_like(a, b));
  if (tracked(out, {&a}))
    record_op("add", {a}, out, [](const Tensor& g) { return std::vector<Tensor>{g}; });
  return out;
}

Tensor mul(const Tensor& a, double b) {
  common_device("mul", {&a});
  Tensor out = binary<DTypes::kNumeric>("mul", k::Mul{}, a, scalar_like(a, b));
  if (tracked(out, {&a}))
    record_op("mul", {a}, out, [b](const Tensor& g) { return std::vector<Tensor>{mul(g, b)}; });
  return out;
}

// ---- division by a scalar (recorded; Tensor::operator/) -----------------------------------

namespace internal {

/// a / value, recorded with a as the only input (the scalar gets no gradient).
Tensor div_scalar(const Tensor& a, double value) {
  Tensor out = binary<DTypes::kFloating>("div", k::Div{}, a, scalar_like(a, value));
  if (tracked(out, {&a}))
    record_op("div", {a}, out,
              [value](const Tensor& g) { return std::vector<Tensor>{div_scalar(g, value)}; });
  return out;
}

}  // namespace internal

// ---- unary math ------------------------------------------------------------------------------

Tensor neg(const Tensor& x) {
  Tensor y = unary("neg", k::Neg{}, x);
  if (tracked(y, {&x}))
    record_op("neg", {x}, y, [](const Tensor& g) { return std::vector<Tensor>{neg(g)}; });
  return y;
}

Tensor abs(const Tensor& x) {
  Tensor y = unary("abs", k::Abs{}, x);
  if (tracked(y, {&x}))
    record_op("abs", {x}, y, [x](const Tensor& g) {
      return std::vector<Tensor>{grad_map("abs", k::AbsGrad{}, x, g)};
    });
  return y;
}

Tensor exp(const Tensor& x) {
  Tensor y = unary("exp", k::Exp{}, x);
  if (tracked(y, {&x}))
    record_op("exp", {x}, y, [y](const Tensor& g) { return std::vector<Tensor>{mul(g, y)}; });
  return y;
}

Tensor log(const Tensor& x) {
  Tensor y = unary("log", k::Log{}, x);
  if (tracked(y, {&x}))
    record_op("log", {x}, y, [x](const Tensor& g) { return std::vector<Tensor>{div(g, x)}; });
  return y;
}

Tensor log1p(const Tensor& x) {
  Tensor y = unary("log1p", k::Log1p{}, x);
  if (tracked(y, {&x}))
    record_op("log1p", {x}, y, [x](const Tensor& g) {
      return std::vector<Tensor>{grad_map("log1p", k::Log1pGrad{}, x, g)};
    });
  return y;
}

Tensor sqrt(const Tensor& x) {
  Tensor y = unary("sqrt", k::Sqrt{}, x);
  if (tracked(y, {&x}))
    record_op("sqrt", {x}, y, [y](const Tensor& g) {
      return std::vector<Tensor>{grad_map("sqrt", k::SqrtGrad{}, y, g)};
    });
  return y;
}

Tensor square(const Tensor& x) {
  Tensor y = unary("square", k::Square{}, x);
  if (tracked(y, {&x}))
    record_op("square", {x}, y, [x](const Tensor& g) {
      return std::vector<Tensor>{grad_map("square", k::SquareGrad{}, x, g)};
    });
  return y;
}

Tensor pow(const Tensor& x, double exponent) {
  Tensor y = unary("pow", k::Pow{exponent}, x);
  if (tracked(y, {&x}))
    record_op("pow", {x}, y, [x, exponent](const Tensor& g) {
      return std::vector<Tensor>{grad_map("pow", k::PowGrad{exponent}, x, g)};
    });
  return y;
}

Tensor clip(const Tensor& x, double low, double high) {
  TANDEM_CHECK(low <= high, "clip: low ", low, " exceeds high ", high);
  Tensor y = unary("clip", k::Clip{low, high}, x);
  if (tracked(y, {&x}))
    record_op("clip", {x}, y, [x, low, high](const Tensor& g) {
      return std::vector<Tensor>{grad_map("clip", k::ClipGrad{low, high}, x, g)};
    });
  return y;
}

// ---- activations ----------------------------------------------------------------------------

Tensor relu(const Tensor& x) {
  Tensor y = unary("relu", k::Relu{}, x);
  if (tracked(y, {&x}))
    record_op("relu", {x}, y, [x](const Tensor& g) {
      return std::vector<Tensor>{grad_map("relu", k::ReluGrad{}, x, g)};
    });
  return y;
}

Tensor sigmoid(const Tensor& x) {
  Tensor y = unary("sigmoid", k::Sigmoid{}, x);
  if (tracked(y, {&x}))
    record_op("sigmoid", {x}, y, [y](const Tensor& g) {
      return std::vector<Tensor>{grad_map("sigmoid", k::SigmoidGrad{}, y, g)};
    });
  return y;
}

Tensor tanh(const Tensor& x) {
  Tensor y = unary("tanh", k::Tanh{}, x);
  if (tracked(y, {&x}))
    record_op("tanh", {x}, y, [y](const Tensor& g) {
      return std::vector<Tensor>{grad_map("tanh", k::TanhGrad{}, y, g)};
    });
  return y;
}

Tensor gelu(const Tensor& x, bool approximate) {
  Tensor y = approximate ? unary("gelu", k::GeluTanh{}, x) : unary("gelu", k::Gelu{}, x);
  if (tracked(y, {&x}))
    record_op("gelu", {x}, y, [x, approximate](const Tensor& g) {
      return std::vector<Tensor>{approximate ? grad_map("gelu", k::GeluTanhGrad{}, x, g)
                                             : grad_map("gelu", k::GeluGrad{}, x, g)};
    });
  return y;
}

// ---- comparison and conversion --------------------------------------------------------------

namespace {

/// `value` as the rank-0 operand of a comparison with `a`: of a's dtype, on a's device. An
/// integer or bool dtype must hold it exactly (a comparison against a rounded scalar would
/// answer another question: less(x, 0.5) is not less(x, 0)); raises naming `op` when not.
Tensor comparison_scalar(std::string_view op, const Tensor& a, double value) {
  common_device(op, {&a});
  dispatch_dtype(a.dtype(), [&]<typename T>() {
    if constexpr (std::is_integral_v<T>) {  // bool included
      // [lowest, 2^digits): both ends exact in a double; NaN fails every comparison.
      const bool exact = value >= static_cast<double>(std::numeric_limits<T>::lowest()) &&
                         value < std::ldexp(1.0, std::numeric_limits<T>::digits) &&
                         std::trunc(value) == value;
      TANDEM_CHECK(exact, op, ": the scalar ", value, " is not a value of the tensor's dtype ",
                   a.dtype(), " (shape ", a.shape(), "); cast the tensor to a floating type first");
    }
  });
  return scalar_like(a, value);
}

template <typename F>
Tensor compare(std::string_view op, const F& f, const Tensor& a, const Tensor& b) {
  return binary<DTypes::kAll, bool>(op, f, a, b);
}

template <typename F>
Tensor compare(std::string_view op, const F& f, const Tensor& a, double b) {
  return binary<DTypes::kAll, bool>(op, f, a, comparison_scalar(op, a, b));
}

/// The shape condition, x and y broadcast to; raises naming the three when they cannot.
Shape where_shape(const Shape& c, const Shape& x, const Shape& y) {
  const int64_t rank = std::max({c.rank(), x.rank(), y.rank()});
  std::vector<int64_t> dims(static_cast<size_t>(rank), 1);
  for (const Shape* s : {&c, &x, &y}) {
    for (int64_t k = 0; k < s->rank(); ++k) {
      int64_t& d = dims[static_cast<size_t>(k + rank - s->rank())];
      const int64_t ds = (*s)[k];
      TANDEM_CHECK(ds == d || ds == 1 || d == 1, "where: shapes ", c, " (condition), ", x,
                   " (x) and ", y, " (y) cannot be broadcast together (dimension ", d, " vs ", ds,
                   ")");
      if (d == 1) d = ds;
    }
  }
  return Shape(std::move(dims));
}

/// out [shape] = condition ? x : y, broadcast (not recorded; arguments checked, condition bool).
Tensor run_select(const Tensor& condition, const Tensor& x, const Tensor& y, const Shape& shape) {
  Tensor out;
  for_dtype<DTypes::kAll>(x.dtype(), "where", [&]<typename T>() {
    out = Tensor::empty(shape, dtype_of<T>, x.device());
    if (out.numel() == 0) return;
    const kernels::SelectPlan plan =
        kernels::make_select_plan(condition.shape(), x.shape(), y.shape(), shape);
    dispatch(
        "where", x.device(),
        [&] {
          cpu::select(k::Select{}, plan, condition.data<bool>(), x.data<T>(), y.data<T>(),
                      out.data<T>());
        },
        TANDEM_ON_CUDA(cuda::select(k::Select{}, plan, ptr<bool>(condition), ptr<T>(x), ptr<T>(y),
                                    ptr<T>(out), stream)));
  });
  return out;
}

}  // namespace

Tensor equal(const Tensor& a, const Tensor& b) { return compare("equal", k::Equal{}, a, b); }
Tensor not_equal(const Tensor& a, const Tensor& b) {
  return compare("not_equal", k::NotEqual{}, a, b);
}
Tensor greater(const Tensor& a, const Tensor& b) { return compare("greater", k::Greater{}, a, b); }
Tensor greater_equal(const Tensor& a, const Tensor& b) {
  return compare("greater_equal", k::GreaterEqual{}, a, b);
}
Tensor less(const Tensor& a, const Tensor& b) { return compare("less", k::Less{}, a, b); }
Tensor less_equal(const Tensor& a, const Tensor& b) {
  return compare("less_equal", k::LessEqual{}, a, b);
}

Tensor equal(const Tensor& a, double b) { return compare("equal", k::Equal{}, a, b); }
Tensor not_equal(const Tensor& a, double b) { return compare("not_equal", k::NotEqual{}, a, b); }
Tensor greater(const Tensor& a, double b) { return compare("greater", k::Greater{}, a, b); }
Tensor greater_equal(const Tensor& a, double b) {
  return compare("greater_equal", k::GreaterEqual{}, a, b);
}
Tensor less(const Tensor& a, double b) { return compare("less", k::Less{}, a, b); }
Tensor less_equal(const Tensor& a, double b) { return compare("less_equal", k::LessEqual{}, a, b); }

Tensor logical_and(const Tensor& a, const Tensor& b) {
  return compare("logical_and", k::LogicalAnd{}, a, b);
}
Tensor logical_or(const Tensor& a, const Tensor& b) {
  return compare("logical_or", k::LogicalOr{}, a, b);
}

Tensor logical_not(const Tensor& x) {
  const Device device = common_device("logical_not", {&x});
  Tensor y = Tensor::empty(x.shape(), DType::kBool, device);
  for_dtype<DTypes::kAll>(x.dtype(), "logical_not", [&]<typename T>() {
    dispatch(
        "logical_not", device,
        [&] { cpu::unary(k::LogicalNot{}, x.numel(), x.data<T>(), y.data<bool>()); },
        TANDEM_ON_CUDA(cuda::unary(k::LogicalNot{}, x.numel(), ptr<T>(x), ptr<bool>(y), stream)));
  });
  return y;
}

Tensor where(const Tensor& condition, const Tensor& x, const Tensor& y) {
  common_device("where", {&condition, &x, &y});
  TANDEM_CHECK(x.dtype() == y.dtype(), "where: x and y have dtypes ", x.dtype(), " and ", y.dtype(),
               " (shapes ", x.shape(), " and ", y.shape(), "); cast one first");
  const Shape shape = where_shape(condition.shape(), x.shape(), y.shape());
  // Any dtype reads as a truth value (nonzero: true), as cast to bool converts it.
  const Tensor c = condition.dtype() == DType::kBool ? condition : cast(condition, DType::kBool);
  Tensor out = run_select(c, x, y, shape);
  if (tracked(out, {&x, &y}))
    record_op("where", {x, y}, out, [c, sx = x.shape(), sy = y.shape()](const Tensor& g) {
      // g goes to x where the condition holds, to y elsewhere; each summed back to its shape.
      const Tensor zero = scalar_like(g, 0.0);
      return std::vector<Tensor>{sum_to(run_select(c, g, zero, g.shape()), sx),
                                 sum_to(run_select(c, zero, g, g.shape()), sy)};
    });
  return out;
}

Tensor cast(const Tensor& x, DType dtype) {
  common_device("cast", {&x});
  if (x.dtype() == dtype) return x;
  Tensor y = Tensor::empty(x.shape(), dtype, x.device());
  dispatch(
      "cast", x.device(),
      [&] { cpu::cast(x.dtype(), dtype, x.numel(), x.raw_data(), y.raw_data()); },
      TANDEM_ON_CUDA(cuda::cast(x.dtype(), dtype, x.numel(), x.raw_data(), y.raw_data(), stream)));
  if (is_floating(x.dtype()) && tracked(y, {&x}))
    record_op("cast", {x}, y,
              [from = x.dtype()](const Tensor& g) { return std::vector<Tensor>{cast(g, from)}; });
  return y;
}

Tensor one_hot(const Tensor& labels, int64_t depth, DType dtype) {
  common_device("one_hot", {&labels});
  TANDEM_CHECK(depth >= 1, "one_hot: depth must be positive, got ", depth);
  TANDEM_CHECK(labels.dtype() == DType::kInt32 || labels.dtype() == DType::kInt64,
               "one_hot: labels must be int32 or int64, got ", labels.dtype(), " (shape ",
               labels.shape(), ")");
  std::vector<int64_t> dims = labels.shape().dims();
  dims.push_back(depth);
  Tensor y = Tensor::empty(Shape(std::move(dims)), dtype, labels.device());
  check_labels("one_hot", labels, depth);
  dispatch_numeric(dtype, "one_hot", [&]<typename T>() {
    dispatch_labels(labels.dtype(), [&]<typename L>() {
      dispatch(
          "one_hot", labels.device(),
          [&] { cpu::one_hot(labels.data<L>(), labels.numel(), depth, y.data<T>()); },
          TANDEM_ON_CUDA(cuda::one_hot(ptr<L>(labels), labels.numel(), depth, ptr<T>(y), stream)));
    });
  });
  return y;
}

}  // namespace tandem::ops
