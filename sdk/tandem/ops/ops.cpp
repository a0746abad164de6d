// The ops layer: argument checks, output allocation, CPU/CUDA dispatch and gradient-tape
// recording for every op of ops.h, plus Tensor's arithmetic operators, reshape and slice.
// This is the only file that chooses a backend (see `dispatch`).
#include "tandem/ops/ops.h"

#include <algorithm>
#include <cmath>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>

#include "tandem/autograd/tape.h"
#include "tandem/ops/cpu/elementwise.h"
#include "tandem/ops/cpu/nn_kernels.h"
#include "tandem/ops/cpu/reduce.h"
#include "tandem/ops/cpu/shape_ops.h"
#include "tandem/ops/cpu/softmax.h"
#include "tandem/ops/kernels/functors.h"

#if TANDEM_WITH_CUDA
#include "tandem/ops/cuda/cuda_kernels.h"
#include "tandem/tensor/internal/cuda_context.h"
#endif

namespace tandem::ops {

namespace k = kernels;

namespace {

// ---- devices and backends -------------------------------------------------------------------

/// The device all `inputs` live on; raises naming `op` when one is undefined or they disagree.
Device common_device(std::string_view op, std::initializer_list<const Tensor*> inputs) {
  Device device;
  size_t i = 0;
  for (const Tensor* t : inputs) {
    TANDEM_CHECK(t->defined(), op, ": input ", i + 1, " of ", inputs.size(),
                 " is an undefined tensor");
    if (i == 0) device = t->device();
    TANDEM_CHECK(t->device() == device, op, ": inputs are on different devices (", device, " and ",
                 t->device(), "); move them with .to(device) first");
    ++i;
  }
  return device;
}

/// The CUDA half of a dispatch call: its code (which sees `stream`, the calling thread's
/// current stream on the tensors' GPU) becomes a lambda when CUDA is built; otherwise it is left
/// out, so a CPU-only build never names a CUDA kernel.
#if TANDEM_WITH_CUDA
#define TANDEM_ON_CUDA(...) [&](cudaStream_t stream) { __VA_ARGS__; }
#else
struct NoCudaPath {};
#define TANDEM_ON_CUDA(...) NoCudaPath()
#endif

/// Runs an op's CPU implementation or, for a GPU, its CUDA implementation. Every op calls this
/// once per kernel launch, with both halves:
///   dispatch(op, device, [&] { cpu::kernel(...); }, TANDEM_ON_CUDA(cuda::kernel(..., stream)));
template <typename CpuFn, typename CudaFn>
void dispatch(std::string_view op, Device device, const CpuFn& run_cpu, const CudaFn& run_cuda) {
  if (device.is_cpu()) {
    run_cpu();
    return;
  }
#if TANDEM_WITH_CUDA
  (void)op;  // the kernels' own errors say what failed
  // Kernels run on the current device: make it the tensors' GPU for the launch. They queue on
  // this thread's stream and return at once; nothing here waits for the GPU.
  tandem::cuda::DeviceGuard guard(device);
  run_cuda(tandem::cuda::current_stream());
#else
  (void)run_cuda;
  throw NotBuiltError(detail::str_cat("op ", op, " on ", device,
                                      ": Tandem was built without CUDA "
                                      "(configure with -DTANDEM_ENABLE_CUDA=ON)"));
#endif
}

/// Typed pointer to a tensor's first element on any device (Tensor::data<T> is CPU-only).
template <typename T>
T* ptr(const Tensor& t) {
  return static_cast<T*>(t.raw_data());
}

// Which element types an elementwise functor is instantiated for (ops/kernels/op_list.h).
enum class DTypes { kFloating, kNumeric, kAll };

template <DTypes kTypes, typename Fn>
void for_dtype(DType dtype, std::string_view op, const Fn& fn) {
  if constexpr (kTypes == DTypes::kFloating) {
    dispatch_floating(dtype, op, fn);
  } else if constexpr (kTypes == DTypes::kNumeric) {
    dispatch_numeric(dtype, op, fn);
  } else {
    dispatch_dtype(dtype, fn);
  }
}

// ---- tape recording -------------------------------------------------------------------------

/// True when `out` can carry a gradient and a tape on this thread tracks one of `inputs`.
bool tracked(const Tensor& out, std::initializer_list<const Tensor*> inputs) {
  return is_floating(out.dtype()) && autograd::needs_recording(inputs);
}

/// Records a single-output op. `backward` maps the output's gradient to one gradient per input
/// (undefined for inputs that get none); it runs with recording paused and uses ops itself.
template <typename Backward>
void record(std::string_view op, std::vector<Tensor> inputs, const Tensor& out, Backward backward) {
  const size_t count = inputs.size();
  autograd::record(op, std::move(inputs), {out},
                   [count, backward = std::move(backward)](
                       const std::vector<Tensor>& grads) -> std::vector<Tensor> {
                     // An undefined output gradient means zero: every input gets none.
                     if (!grads[0].defined()) return std::vector<Tensor>(count);
                     return backward(grads[0]);
                   });
}

// ---- elementwise building blocks (not recorded) ---------------------------------------------

Shape broadcast_shape(std::string_view op, const Shape& a, const Shape& b) {
  const int64_t rank = std::max(a.rank(), b.rank());
  std::vector<int64_t> dims(static_cast<size_t>(rank));
  for (int64_t k = 0; k < rank; ++k) {
    const int64_t ka = k - (rank - a.rank()), kb = k - (rank - b.rank());
    const int64_t da = ka >= 0 ? a[ka] : 1, db = kb >= 0 ? b[kb] : 1;
    TANDEM_CHECK(da == db || da == 1 || db == 1, op, ": shapes ", a, " and ", b,
                 " cannot be broadcast together (dimension ", da, " vs ", db, ")");
    dims[static_cast<size_t>(k)] = da == 1 ? db : da;
  }
  return Shape(std::move(dims));
}

void check_floating(std::string_view op, const Tensor& x) {
  TANDEM_CHECK(is_floating(x.dtype()), op, ": dtype ", x.dtype(),
               " is not supported (needs float32 or float64; shape ", x.shape(), ")");
}

void check_same_dtype(std::string_view op, const Tensor& a, const Tensor& b) {
  TANDEM_CHECK(a.dtype() == b.dtype(), op, ": dtypes ", a.dtype(), " and ", b.dtype(),
               " differ (shapes ", a.shape(), " and ", b.shape(), "); cast one first");
}

/// out [shape] = f(a, b) broadcast to `shape`, elements of type R (void: the inputs' type).
template <DTypes kTypes, typename R = void, typename F>
Tensor run_binary(std::string_view op, const F& f, const Tensor& a, const Tensor& b,
                  const Shape& shape) {
  Tensor out;
  for_dtype<kTypes>(a.dtype(), op, [&]<typename T>() {
    using Out = std::conditional_t<std::is_void_v<R>, T, R>;
    out = Tensor::empty(shape, dtype_of<Out>, a.device());
    if (out.numel() == 0) return;
    const k::BroadcastPlan plan = k::make_broadcast_plan(a.shape(), b.shape(), shape);
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
  dispatch_floating(x.dtype(), op, [&]<typename T>() {
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
Tensor broadcast_to(const Tensor& x, const Shape& shape) {
  if (x.shape() == shape) return x;
  return run_binary<DTypes::kFloating>("broadcast_to", k::First{}, x, x, shape);
}

/// The scalar `value` as a rank-0 tensor of x's dtype on x's device.
Tensor scalar_like(const Tensor& x, double value) {
  Tensor s = Tensor::empty(Shape{}, x.dtype(), x.device());
  // On a GPU a kernel writes it: Tensor::fill_'s host copy would wait for the device.
  dispatch(
      "scalar", x.device(), [&] { s.fill_(value); },
      TANDEM_ON_CUDA(cuda::fill(s.dtype(), 1, value, s.raw_data(), stream)));
  return s;
}

/// a / value, recorded with a as the only input (the scalar gets no gradient).
Tensor div_scalar(const Tensor& a, double value) {
  Tensor out = binary<DTypes::kFloating>("div", k::Div{}, a, scalar_like(a, value));
  if (tracked(out, {&a}))
    record("div", {a}, out,
           [value](const Tensor& g) { return std::vector<Tensor>{div_scalar(g, value)}; });
  return out;
}

// ---- reductions -----------------------------------------------------------------------------

/// A tensor viewed as [outer, n, inner] around one axis.
struct AxisView {
  size_t axis;
  int64_t outer, n, inner;
};

AxisView axis_view(std::string_view op, const Shape& shape, int64_t axis) {
  const int64_t rank = shape.rank();
  TANDEM_CHECK(axis >= -rank && axis < rank, op, ": axis ", axis, " is out of range for shape ",
               shape);
  AxisView v{static_cast<size_t>(axis < 0 ? axis + rank : axis), 1, 0, 1};
  v.n = shape.dims()[v.axis];
  for (size_t i = 0; i < v.axis; ++i) v.outer *= shape.dims()[i];
  for (size_t i = v.axis + 1; i < shape.dims().size(); ++i) v.inner *= shape.dims()[i];
  return v;
}

Shape reduced_shape(const Shape& shape, size_t axis, bool keepdims) {
  std::vector<int64_t> dims = shape.dims();
  if (keepdims)
    dims[axis] = 1;
  else
    dims.erase(dims.begin() + static_cast<std::ptrdiff_t>(axis));
  return Shape(std::move(dims));
}

/// The sum of x viewed as [outer, n, inner] over n, shaped `shape` (not recorded).
Tensor run_sum(std::string_view op, const Tensor& x, int64_t outer, int64_t n, int64_t inner,
               const Shape& shape) {
  Tensor y = Tensor::empty(shape, x.dtype(), x.device());
  dispatch_numeric(x.dtype(), op, [&]<typename T>() {
    dispatch(
        op, x.device(),
        [&] {
          if (n == 0)
            y.fill_(0.0);
          else if (y.numel() > 0)
            cpu::sum(x.data<T>(), outer, n, inner, y.data<T>());
        },
        // An empty axis sums to zeros on the GPU too.
        TANDEM_ON_CUDA(if (y.numel() > 0)
                           cuda::sum(ptr<T>(x), outer, n, inner, ptr<T>(y), stream)));
  });
  return y;
}

/// Max over n of x viewed as [outer, n, inner], with the first index reaching it (int64
/// [outer * inner]); not recorded.
std::pair<Tensor, Tensor> run_max(std::string_view op, const Tensor& x, int64_t outer, int64_t n,
                                  int64_t inner, const Shape& shape, bool values) {
  TANDEM_CHECK(n > 0, op, ": cannot reduce an empty axis (shape ", x.shape(), ")");
  Tensor y = values ? Tensor::empty(shape, x.dtype(), x.device()) : Tensor();
  Tensor index = Tensor::empty(values ? Shape{outer * inner} : shape, DType::kInt64, x.device());
  dispatch_numeric(x.dtype(), op, [&]<typename T>() {
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
  dispatch_floating(g.dtype(), "max", [&]<typename T>() {
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

// ---- labels, convolution geometry -----------------------------------------------------------

/// Calls fn.template operator()<L>() with L the C++ type of int32 or int64 labels.
template <typename Fn>
void dispatch_labels(DType dtype, const Fn& fn) {
  if (dtype == DType::kInt32)
    fn.template operator()<int32_t>();
  else
    fn.template operator()<int64_t>();
}

/// Raises naming the first label outside [0, depth) and its index (int32/int64 labels). On a
/// GPU the host must wait for the answer: one stream synchronisation per call.
void check_labels(std::string_view op, const Tensor& labels, int64_t depth) {
  dispatch_labels(labels.dtype(), [&]<typename L>() {
    int64_t bad = -1;
    dispatch(
        op, labels.device(),
        [&] { bad = cpu::first_invalid_label(labels.data<L>(), labels.numel(), depth); },
        TANDEM_ON_CUDA(
            bad = cuda::first_invalid_label(ptr<L>(labels), labels.numel(), depth, stream)));
    const int64_t value =
        bad < 0 ? 0
                : labels.view_as(Shape{1}, static_cast<size_t>(bad) * sizeof(L)).item<int64_t>();
    TANDEM_CHECK(bad < 0, op, ": label ", value, " at index ", bad, " is outside [0, ", depth, ")");
  });
}

int64_t same_padding_before(int64_t input, int64_t window, int64_t stride, int64_t out) {
  // TensorFlow's SAME: the total padding is split with the extra row/column after.
  return std::max<int64_t>((out - 1) * stride + window - input, 0) / 2;
}

/// Geometry of a window op over x [N, H, W, C]; raises naming `op` on bad sizes.
cpu::ConvGeometry window_geometry(std::string_view op, const Shape& x, int64_t window_h,
                                  int64_t window_w, std::array<int64_t, 2> strides,
                                  Padding padding) {
  TANDEM_CHECK(strides[0] >= 1 && strides[1] >= 1, op, ": strides must be positive, got [",
               strides[0], ", ", strides[1], "]");
  TANDEM_CHECK(window_h >= 1 && window_w >= 1, op, ": window must be at least 1x1, got ", window_h,
               "x", window_w);
  if (padding == Padding::kValid)
    TANDEM_CHECK(x[1] >= window_h && x[2] >= window_w, op, ": window ", window_h, "x", window_w,
                 " is larger than the input ", x[1], "x", x[2], " (shape ", x,
                 ") with VALID padding");
  cpu::ConvGeometry g{};
  g.batch = x[0];
  g.in_h = x[1];
  g.in_w = x[2];
  g.channels = x[3];
  g.window_h = window_h;
  g.window_w = window_w;
  g.stride_h = strides[0];
  g.stride_w = strides[1];
  g.out_h = conv_output_size(g.in_h, window_h, strides[0], padding);
  g.out_w = conv_output_size(g.in_w, window_w, strides[1], padding);
  g.pad_top =
      padding == Padding::kSame ? same_padding_before(g.in_h, window_h, strides[0], g.out_h) : 0;
  g.pad_left =
      padding == Padding::kSame ? same_padding_before(g.in_w, window_w, strides[1], g.out_w) : 0;
  return g;
}

/// C [m, n] = op(A) op(B) through cpu::gemm (not recorded; shapes already checked).
void run_gemm(std::string_view op, bool transpose_a, bool transpose_b, int64_t m, int64_t n,
              int64_t kk, const Tensor& a, const Tensor& b, Tensor& c) {
  dispatch_floating(c.dtype(), op, [&]<typename T>() {
    dispatch(
        op, c.device(),
        [&] {
          if (m == 0 || n == 0) return;
          if (kk == 0) {  // op(A) has no columns: C is zeros (and gemm would reject lda = 0)
            c.fill_(0.0);
            return;
          }
          cpu::gemm(transpose_a, transpose_b, m, n, kk, T(1), a.data<T>(), a.shape().dims().back(),
                    b.data<T>(), b.shape().dims().back(), T(0), c.data<T>(), n);
        },
        TANDEM_ON_CUDA(
            if (m == 0 || n == 0) return;
            if (kk == 0) return cuda::fill(c.dtype(), c.numel(), 0.0, c.raw_data(), stream);
            cuda::gemm(transpose_a, transpose_b, m, n, kk, T(1), ptr<T>(a), a.shape().dims().back(),
                       ptr<T>(b), b.shape().dims().back(), T(0), ptr<T>(c), n, stream)));
  });
}

/// cols [N * OH * OW, KH * KW * C] of x for geometry g.
Tensor im2col(const Tensor& x, const cpu::ConvGeometry& g) {
  Tensor cols =
      Tensor::empty(Shape{g.batch * g.out_h * g.out_w, g.window_h * g.window_w * g.channels},
                    x.dtype(), x.device());
  dispatch_floating(x.dtype(), "conv2d", [&]<typename T>() {
    dispatch(
        "conv2d", x.device(),
        [&] {
          if (cols.numel() > 0) cpu::im2col(g, x.data<T>(), cols.data<T>());
        },
        TANDEM_ON_CUDA(if (cols.numel() > 0) cuda::im2col(g, ptr<T>(x), ptr<T>(cols), stream)));
  });
  return cols;
}

}  // namespace

// ---- elementwise with broadcasting ----------------------------------------------------------

Shape broadcast_shapes(const Shape& a, const Shape& b) {
  return broadcast_shape("broadcast_shapes", a, b);
}

Tensor add(const Tensor& a, const Tensor& b) {
  Tensor out = binary<DTypes::kNumeric>("add", k::Add{}, a, b);
  if (tracked(out, {&a, &b}))
    record("add", {a, b}, out, [sa = a.shape(), sb = b.shape()](const Tensor& g) {
      return std::vector<Tensor>{sum_to(g, sa), sum_to(g, sb)};
    });
  return out;
}

Tensor sub(const Tensor& a, const Tensor& b) {
  Tensor out = binary<DTypes::kNumeric>("sub", k::Sub{}, a, b);
  if (tracked(out, {&a, &b}))
    record("sub", {a, b}, out, [sa = a.shape(), sb = b.shape()](const Tensor& g) {
      return std::vector<Tensor>{sum_to(g, sa), sum_to(neg(g), sb)};
    });
  return out;
}

Tensor mul(const Tensor& a, const Tensor& b) {
  Tensor out = binary<DTypes::kNumeric>("mul", k::Mul{}, a, b);
  if (tracked(out, {&a, &b}))
    record("mul", {a, b}, out, [a, b](const Tensor& g) {
      return std::vector<Tensor>{sum_to(mul(g, b), a.shape()), sum_to(mul(g, a), b.shape())};
    });
  return out;
}

Tensor div(const Tensor& a, const Tensor& b) {
  Tensor out = binary<DTypes::kFloating>("div", k::Div{}, a, b);
  if (tracked(out, {&a, &b}))
    record("div", {a, b}, out, [a, b, out](const Tensor& g) {
      // d(a/b)/da = 1/b and d(a/b)/db = -a/b^2 = -(1/b) * out.
      const Tensor ga = div(g, b);
      return std::vector<Tensor>{sum_to(ga, a.shape()), sum_to(neg(mul(ga, out)), b.shape())};
    });
  return out;
}

Tensor maximum(const Tensor& a, const Tensor& b) {
  Tensor out = binary<DTypes::kNumeric>("maximum", k::Maximum{}, a, b);
  if (tracked(out, {&a, &b}))
    record("maximum", {a, b}, out, [a, b](const Tensor& g) {
      const Tensor ga = mul(g, binary<DTypes::kFloating>("maximum", k::MaximumMask{}, a, b));
      return std::vector<Tensor>{sum_to(ga, a.shape()), sum_to(sub(g, ga), b.shape())};
    });
  return out;
}

Tensor minimum(const Tensor& a, const Tensor& b) {
  Tensor out = binary<DTypes::kNumeric>("minimum", k::Minimum{}, a, b);
  if (tracked(out, {&a, &b}))
    record("minimum", {a, b}, out, [a, b](const Tensor& g) {
      const Tensor ga = mul(g, binary<DTypes::kFloating>("minimum", k::MinimumMask{}, a, b));
      return std::vector<Tensor>{sum_to(ga, a.shape()), sum_to(sub(g, ga), b.shape())};
    });
  return out;
}

Tensor add(const Tensor& a, double b) {
  common_device("add", {&a});
  Tensor out = binary<DTypes::kNumeric>("add", k::Add{}, a, scalar_like(a, b));
  if (tracked(out, {&a}))
    record("add", {a}, out, [](const Tensor& g) { return std::vector<Tensor>{g}; });
  return out;
}

Tensor mul(const Tensor& a, double b) {
  common_device("mul", {&a});
  Tensor out = binary<DTypes::kNumeric>("mul", k::Mul{}, a, scalar_like(a, b));
  if (tracked(out, {&a}))
    record("mul", {a}, out, [b](const Tensor& g) { return std::vector<Tensor>{mul(g, b)}; });
  return out;
}

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
    record("sum_to", {x}, y,
           [xs = x.shape()](const Tensor& g) { return std::vector<Tensor>{broadcast_to(g, xs)}; });
  return y;
}

// ---- unary math ------------------------------------------------------------------------------

Tensor neg(const Tensor& x) {
  Tensor y = unary("neg", k::Neg{}, x);
  if (tracked(y, {&x}))
    record("neg", {x}, y, [](const Tensor& g) { return std::vector<Tensor>{neg(g)}; });
  return y;
}

Tensor abs(const Tensor& x) {
  Tensor y = unary("abs", k::Abs{}, x);
  if (tracked(y, {&x}))
    record("abs", {x}, y, [x](const Tensor& g) {
      return std::vector<Tensor>{grad_map("abs", k::AbsGrad{}, x, g)};
    });
  return y;
}

Tensor exp(const Tensor& x) {
  Tensor y = unary("exp", k::Exp{}, x);
  if (tracked(y, {&x}))
    record("exp", {x}, y, [y](const Tensor& g) { return std::vector<Tensor>{mul(g, y)}; });
  return y;
}

Tensor log(const Tensor& x) {
  Tensor y = unary("log", k::Log{}, x);
  if (tracked(y, {&x}))
    record("log", {x}, y, [x](const Tensor& g) { return std::vector<Tensor>{div(g, x)}; });
  return y;
}

Tensor log1p(const Tensor& x) {
  Tensor y = unary("log1p", k::Log1p{}, x);
  if (tracked(y, {&x}))
    record("log1p", {x}, y, [x](const Tensor& g) {
      return std::vector<Tensor>{grad_map("log1p", k::Log1pGrad{}, x, g)};
    });
  return y;
}

Tensor sqrt(const Tensor& x) {
  Tensor y = unary("sqrt", k::Sqrt{}, x);
  if (tracked(y, {&x}))
    record("sqrt", {x}, y, [y](const Tensor& g) {
      return std::vector<Tensor>{grad_map("sqrt", k::SqrtGrad{}, y, g)};
    });
  return y;
}

Tensor square(const Tensor& x) {
  Tensor y = unary("square", k::Square{}, x);
  if (tracked(y, {&x}))
    record("square", {x}, y, [x](const Tensor& g) {
      return std::vector<Tensor>{grad_map("square", k::SquareGrad{}, x, g)};
    });
  return y;
}

Tensor pow(const Tensor& x, double exponent) {
  Tensor y = unary("pow", k::Pow{exponent}, x);
  if (tracked(y, {&x}))
    record("pow", {x}, y, [x, exponent](const Tensor& g) {
      return std::vector<Tensor>{grad_map("pow", k::PowGrad{exponent}, x, g)};
    });
  return y;
}

Tensor clip(const Tensor& x, double low, double high) {
  TANDEM_CHECK(low <= high, "clip: low ", low, " exceeds high ", high);
  Tensor y = unary("clip", k::Clip{low, high}, x);
  if (tracked(y, {&x}))
    record("clip", {x}, y, [x, low, high](const Tensor& g) {
      return std::vector<Tensor>{grad_map("clip", k::ClipGrad{low, high}, x, g)};
    });
  return y;
}

// ---- activations ----------------------------------------------------------------------------

Tensor relu(const Tensor& x) {
  Tensor y = unary("relu", k::Relu{}, x);
  if (tracked(y, {&x}))
    record("relu", {x}, y, [x](const Tensor& g) {
      return std::vector<Tensor>{grad_map("relu", k::ReluGrad{}, x, g)};
    });
  return y;
}

Tensor sigmoid(const Tensor& x) {
  Tensor y = unary("sigmoid", k::Sigmoid{}, x);
  if (tracked(y, {&x}))
    record("sigmoid", {x}, y, [y](const Tensor& g) {
      return std::vector<Tensor>{grad_map("sigmoid", k::SigmoidGrad{}, y, g)};
    });
  return y;
}

Tensor tanh(const Tensor& x) {
  Tensor y = unary("tanh", k::Tanh{}, x);
  if (tracked(y, {&x}))
    record("tanh", {x}, y, [y](const Tensor& g) {
      return std::vector<Tensor>{grad_map("tanh", k::TanhGrad{}, y, g)};
    });
  return y;
}

Tensor gelu(const Tensor& x, bool approximate) {
  Tensor y = approximate ? unary("gelu", k::GeluTanh{}, x) : unary("gelu", k::Gelu{}, x);
  if (tracked(y, {&x}))
    record("gelu", {x}, y, [x, approximate](const Tensor& g) {
      return std::vector<Tensor>{approximate ? grad_map("gelu", k::GeluTanhGrad{}, x, g)
                                             : grad_map("gelu", k::GeluGrad{}, x, g)};
    });
  return y;
}

Tensor softmax(const Tensor& x, int64_t axis) {
  common_device("softmax", {&x});
  const AxisView v = axis_view("softmax", x.shape(), axis);
  Tensor y = Tensor::empty_like(x);
  dispatch_floating(x.dtype(), "softmax", [&]<typename T>() {
    dispatch(
        "softmax", x.device(),
        [&] {
          if (x.numel() > 0) cpu::softmax(x.data<T>(), v.outer, v.n, v.inner, false, y.data<T>());
        },
        TANDEM_ON_CUDA(if (x.numel() > 0) cuda::softmax(ptr<T>(x), v.outer, v.n, v.inner, false,
                                                        ptr<T>(y), stream)));
  });
  if (tracked(y, {&x}))
    record("softmax", {x}, y, [y, axis](const Tensor& g) {
      // dx = y * (g - sum(g * y, axis)).
      return std::vector<Tensor>{mul(y, sub(g, sum(mul(g, y), axis, /*keepdims=*/true)))};
    });
  return y;
}

Tensor log_softmax(const Tensor& x, int64_t axis) {
  common_device("log_softmax", {&x});
  const AxisView v = axis_view("log_softmax", x.shape(), axis);
  Tensor y = Tensor::empty_like(x);
  dispatch_floating(x.dtype(), "log_softmax", [&]<typename T>() {
    dispatch(
        "log_softmax", x.device(),
        [&] {
          if (x.numel() > 0) cpu::softmax(x.data<T>(), v.outer, v.n, v.inner, true, y.data<T>());
        },
        TANDEM_ON_CUDA(if (x.numel() > 0) cuda::softmax(ptr<T>(x), v.outer, v.n, v.inner, true,
                                                        ptr<T>(y), stream)));
  });
  if (tracked(y, {&x}))
    record("log_softmax", {x}, y, [y, axis](const Tensor& g) {
      // dx = g - softmax(x) * sum(g, axis), with softmax(x) = exp(y).
      return std::vector<Tensor>{sub(g, mul(exp(y), sum(g, axis, /*keepdims=*/true)))};
    });
  return y;
}

// ---- reductions -----------------------------------------------------------------------------

Tensor sum(const Tensor& x) {
  common_device("sum", {&x});
  Tensor y = run_sum("sum", x, 1, x.numel(), 1, Shape{});
  if (tracked(y, {&x}))
    record("sum", {x}, y,
           [xs = x.shape()](const Tensor& g) { return std::vector<Tensor>{broadcast_to(g, xs)}; });
  return y;
}

Tensor sum(const Tensor& x, int64_t axis, bool keepdims) {
  common_device("sum", {&x});
  const AxisView v = axis_view("sum", x.shape(), axis);
  Tensor y = run_sum("sum", x, v.outer, v.n, v.inner, reduced_shape(x.shape(), v.axis, keepdims));
  if (tracked(y, {&x}))
    record("sum", {x}, y,
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
    record("mean", {x}, y, [xs = x.shape()](const Tensor& g) {
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
    record("mean", {x}, y, [xs = x.shape(), kept, n = v.n](const Tensor& g) {
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
    record("max", {x}, y, [xs = x.shape(), index](const Tensor& g) {
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
    record("max", {x}, y, [xs = x.shape(), index, v](const Tensor& g) {
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

// ---- shape ops (views and copies; no kernels except transpose) ------------------------------

Tensor reshape(const Tensor& x, const Shape& shape) {
  common_device("reshape", {&x});
  // One dimension may be -1: it takes whatever the others leave.
  std::vector<int64_t> dims = shape.dims();
  int64_t known = 1, inferred = -1;
  for (size_t i = 0; i < dims.size(); ++i) {
    if (dims[i] == -1 && inferred < 0) {
      inferred = static_cast<int64_t>(i);
      continue;
    }
    TANDEM_CHECK(dims[i] >= 0, "reshape: invalid target shape ", shape, " for a tensor of shape ",
                 x.shape());
    known *= dims[i];
  }
  if (inferred >= 0) {
    TANDEM_CHECK(known > 0 && x.numel() % known == 0, "reshape: cannot reshape ", x.shape(), " (",
                 x.numel(), " elements) into ", shape);
    dims[static_cast<size_t>(inferred)] = x.numel() / known;
  }
  const Shape target(std::move(dims));
  TANDEM_CHECK(target.numel() == x.numel(), "reshape: cannot reshape ", x.shape(), " (", x.numel(),
               " elements) into ", shape, " (", target.numel(), " elements)");
  Tensor y = x.view_as(target);
  if (tracked(y, {&x}))
    record("reshape", {x}, y,
           [xs = x.shape()](const Tensor& g) { return std::vector<Tensor>{g.view_as(xs)}; });
  return y;
}

Tensor flatten(const Tensor& x) {
  common_device("flatten", {&x});
  TANDEM_CHECK(x.rank() >= 1, "flatten: needs a tensor of rank >= 1, got shape ", x.shape());
  int64_t features = 1;
  for (int64_t i = 1; i < x.rank(); ++i) features *= x.dim(i);
  return reshape(x, Shape{x.dim(0), features});
}

Tensor transpose(const Tensor& x) {
  common_device("transpose", {&x});
  TANDEM_CHECK(x.rank() == 2, "transpose: needs a matrix, got shape ", x.shape(),
               "; pass a permutation for other ranks");
  return transpose(x, {1, 0});
}

Tensor transpose(const Tensor& x, const std::vector<int64_t>& perm) {
  common_device("transpose", {&x});
  const int64_t rank = x.rank();
  std::vector<int64_t> axes(perm.size()), dims(perm.size());
  std::vector<bool> seen(static_cast<size_t>(rank), false);
  bool valid = static_cast<int64_t>(perm.size()) == rank;
  for (size_t i = 0; valid && i < perm.size(); ++i) {
    const int64_t a = perm[i] < 0 ? perm[i] + rank : perm[i];
    valid = a >= 0 && a < rank && !seen[static_cast<size_t>(a)];
    if (!valid) break;
    seen[static_cast<size_t>(a)] = true;
    axes[i] = a;
    dims[i] = x.dim(a);
  }
  TANDEM_CHECK(valid, "transpose: ", Shape(perm), " is not a permutation of the axes of shape ",
               x.shape());
  Tensor y = Tensor::empty(Shape(dims), x.dtype(), x.device());
  dispatch(
      "transpose", x.device(),
      [&] {
        cpu::transpose(dtype_size(x.dtype()), x.shape().dims(), axes, x.raw_data(), y.raw_data());
      },
      TANDEM_ON_CUDA(cuda::transpose(dtype_size(x.dtype()), x.shape().dims(), axes, x.raw_data(),
                                     y.raw_data(), stream)));
  if (tracked(y, {&x}))
    record("transpose", {x}, y, [axes](const Tensor& g) {
      std::vector<int64_t> inverse(axes.size());
      for (size_t i = 0; i < axes.size(); ++i)
        inverse[static_cast<size_t>(axes[i])] = static_cast<int64_t>(i);
      return std::vector<Tensor>{transpose(g, inverse)};
    });
  return y;
}

Tensor concat(const std::vector<Tensor>& xs, int64_t axis) {
  TANDEM_CHECK(!xs.empty(), "concat: needs at least one tensor");
  for (size_t i = 0; i < xs.size(); ++i)
    TANDEM_CHECK(xs[i].defined(), "concat: input ", i, " of ", xs.size(), " is undefined");
  const Tensor& first = xs[0];
  TANDEM_CHECK(first.rank() >= 1, "concat: needs tensors of rank >= 1, got shape ", first.shape());
  TANDEM_CHECK(axis == 0 || axis == -first.rank(), "concat: only axis 0 is supported, got axis ",
               axis, " for shape ", first.shape());
  int64_t rows = 0;
  for (size_t i = 0; i < xs.size(); ++i) {
    const Tensor& x = xs[i];
    bool agree = x.rank() == first.rank();
    for (int64_t d = 1; agree && d < x.rank(); ++d) agree = x.dim(d) == first.dim(d);
    TANDEM_CHECK(agree, "concat: shapes ", first.shape(), " and ", x.shape(), " (input ", i,
                 ") differ outside axis 0");
    TANDEM_CHECK(x.dtype() == first.dtype(), "concat: dtypes ", first.dtype(), " and ", x.dtype(),
                 " (input ", i, ") differ");
    TANDEM_CHECK(x.device() == first.device(), "concat: inputs are on different devices (",
                 first.device(), " and ", x.device(), ", input ", i, ")");
    rows += x.dim(0);
  }
  std::vector<int64_t> dims = first.shape().dims();
  dims[0] = rows;
  Tensor y = Tensor::empty(Shape(std::move(dims)), first.dtype(), first.device());
  // Rows are contiguous, so each input is one block copy (copy_from works on every device).
  size_t offset = 0;
  std::vector<size_t> offsets;
  for (const Tensor& x : xs) {
    offsets.push_back(offset);
    if (x.numel() > 0) y.view_as(x.shape(), offset).copy_from(x);
    offset += x.nbytes();
  }
  if (is_floating(y.dtype()) && autograd::needs_recording(xs))
    record("concat", xs, y, [xs, offsets](const Tensor& g) {
      std::vector<Tensor> grads;
      for (size_t i = 0; i < xs.size(); ++i) grads.push_back(g.view_as(xs[i].shape(), offsets[i]));
      return grads;
    });
  return y;
}

Tensor slice(const Tensor& x, int64_t begin, int64_t end) {
  common_device("slice", {&x});
  TANDEM_CHECK(x.rank() >= 1, "slice: needs a tensor of rank >= 1, got shape ", x.shape());
  TANDEM_CHECK(0 <= begin && begin <= end && end <= x.dim(0), "slice: rows [", begin, ", ", end,
               ") are not within the ", x.dim(0), " rows of shape ", x.shape());
  std::vector<int64_t> dims = x.shape().dims();
  dims[0] = end - begin;
  const size_t row_bytes = x.dim(0) == 0 ? 0 : x.nbytes() / static_cast<size_t>(x.dim(0));
  const size_t offset = static_cast<size_t>(begin) * row_bytes;
  Tensor y = x.view_as(Shape(std::move(dims)), offset);
  if (tracked(y, {&x}))
    record("slice", {x}, y, [x, offset](const Tensor& g) {
      // The rows outside the slice get zero gradient.
      Tensor dx = Tensor::zeros(x.shape(), x.dtype(), x.device());
      if (g.numel() > 0) dx.view_as(g.shape(), offset).copy_from(g);
      return std::vector<Tensor>{dx};
    });
  return y;
}

// ---- comparison and conversion --------------------------------------------------------------

Tensor equal(const Tensor& a, const Tensor& b) {
  return binary<DTypes::kAll, bool>("equal", k::Equal{}, a, b);
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
    record("cast", {x}, y,
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

// ---- linear algebra -------------------------------------------------------------------------

Tensor matmul(const Tensor& a, const Tensor& b, bool transpose_a, bool transpose_b) {
  common_device("matmul", {&a, &b});
  TANDEM_CHECK(a.rank() == 2 && b.rank() == 2, "matmul: needs two matrices, got shapes ", a.shape(),
               " and ", b.shape());
  check_same_dtype("matmul", a, b);
  const int64_t m = transpose_a ? a.dim(1) : a.dim(0), ka = transpose_a ? a.dim(0) : a.dim(1);
  const int64_t kb = transpose_b ? b.dim(1) : b.dim(0), n = transpose_b ? b.dim(0) : b.dim(1);
  TANDEM_CHECK(ka == kb, "matmul: shapes ", a.shape(), " and ", b.shape(),
               " are incompatible (transpose_a=", transpose_a, ", transpose_b=", transpose_b,
               ": inner dimensions ", ka, " and ", kb, ")");
  Tensor c = Tensor::empty(Shape{m, n}, a.dtype(), a.device());
  run_gemm("matmul", transpose_a, transpose_b, m, n, ka, a, b, c);
  if (tracked(c, {&a, &b}))
    record("matmul", {a, b}, c, [a, b, transpose_a, transpose_b](const Tensor& g) {
      // With C = op(A) op(B): dop(A) = G op(B)^T and dop(B) = op(A)^T G, each folded into one
      // GEMM's transpose flags (no transposed copies).
      if (!transpose_a && !transpose_b)
        return std::vector<Tensor>{matmul(g, b, false, true), matmul(a, g, true, false)};
      if (!transpose_a)
        return std::vector<Tensor>{matmul(g, b, false, false), matmul(g, a, true, false)};
      if (!transpose_b)
        return std::vector<Tensor>{matmul(b, g, false, true), matmul(a, g, false, false)};
      return std::vector<Tensor>{matmul(b, g, true, true), matmul(g, a, true, true)};
    });
  return c;
}

// ---- losses ---------------------------------------------------------------------------------

Tensor sparse_softmax_cross_entropy(const Tensor& logits, const Tensor& labels) {
  static constexpr std::string_view kOp = "sparse_softmax_cross_entropy";
  common_device(kOp, {&logits, &labels});
  TANDEM_CHECK(logits.rank() == 2 && labels.rank() == 1 && labels.dim(0) == logits.dim(0), kOp,
               ": needs logits [N, C] and labels [N], got shapes ", logits.shape(), " and ",
               labels.shape());
  TANDEM_CHECK(labels.dtype() == DType::kInt32 || labels.dtype() == DType::kInt64, kOp,
               ": labels must be int32 or int64, got ", labels.dtype());
  const int64_t batch = logits.dim(0), classes = logits.dim(1);
  TANDEM_CHECK(classes >= 1, kOp, ": needs at least one class, got logits of shape ",
               logits.shape());
  Tensor loss = Tensor::empty(Shape{batch}, logits.dtype(), logits.device());
  check_labels(kOp, labels, classes);
  dispatch_floating(logits.dtype(), kOp, [&]<typename T>() {
    dispatch_labels(labels.dtype(), [&]<typename L>() {
      dispatch(
          kOp, logits.device(),
          [&] {
            cpu::sparse_softmax_cross_entropy(logits.data<T>(), labels.data<L>(), batch, classes,
                                              loss.data<T>());
          },
          TANDEM_ON_CUDA(cuda::sparse_softmax_cross_entropy(ptr<T>(logits), ptr<L>(labels), batch,
                                                            classes, ptr<T>(loss), stream)));
    });
  });
  if (tracked(loss, {&logits, &labels}))
    record(kOp, {logits, labels}, loss, [logits, labels](const Tensor& g) {
      // d loss[r] / d logits[r, :] = g[r] * (softmax(logits[r, :]) - onehot(labels[r])), fused.
      Tensor dlogits = Tensor::empty_like(logits);
      dispatch_floating(logits.dtype(), kOp, [&]<typename T>() {
        dispatch_labels(labels.dtype(), [&]<typename L>() {
          dispatch(
              kOp, logits.device(),
              [&] {
                cpu::sparse_softmax_cross_entropy_backward(logits.data<T>(), labels.data<L>(),
                                                           g.data<T>(), logits.dim(0),
                                                           logits.dim(1), dlogits.data<T>());
              },
              TANDEM_ON_CUDA(cuda::sparse_softmax_cross_entropy_backward(
                  ptr<T>(logits), ptr<L>(labels), ptr<T>(g), logits.dim(0), logits.dim(1),
                  ptr<T>(dlogits), stream)));
        });
      });
      return std::vector<Tensor>{dlogits, Tensor()};
    });
  return loss;
}

// ---- convolution and pooling ----------------------------------------------------------------

int64_t conv_output_size(int64_t input, int64_t window, int64_t stride, Padding padding) {
  TANDEM_CHECK(input >= 0 && window >= 1 && stride >= 1, "conv_output_size: bad arguments (input ",
               input, ", window ", window, ", stride ", stride, ")");
  if (padding == Padding::kSame) return (input + stride - 1) / stride;
  TANDEM_CHECK(input >= window, "conv_output_size: window ", window, " is larger than the input ",
               input, " with VALID padding");
  return (input - window) / stride + 1;
}

Tensor conv2d(const Tensor& x, const Tensor& kernel, std::array<int64_t, 2> strides,
              Padding padding) {
  common_device("conv2d", {&x, &kernel});
  TANDEM_CHECK(x.rank() == 4 && kernel.rank() == 4 && x.dim(3) == kernel.dim(2),
               "conv2d: needs x [N, H, W, C] and kernel [KH, KW, C, Cout] with the same C, got "
               "shapes ",
               x.shape(), " and ", kernel.shape());
  check_same_dtype("conv2d", x, kernel);
  const cpu::ConvGeometry geo =
      window_geometry("conv2d", x.shape(), kernel.dim(0), kernel.dim(1), strides, padding);
  const int64_t rows = geo.batch * geo.out_h * geo.out_w;
  const int64_t depth = geo.window_h * geo.window_w * geo.channels, filters = kernel.dim(3);
  Tensor y = Tensor::empty(Shape{geo.batch, geo.out_h, geo.out_w, filters}, x.dtype(), x.device());
  // y [rows, filters] = im2col(x) [rows, depth] @ kernel [depth, filters].
  run_gemm("conv2d", false, false, rows, filters, depth, im2col(x, geo),
           kernel.view_as(Shape{depth, filters}), y);
  if (tracked(y, {&x, &kernel}))
    record("conv2d", {x, kernel}, y, [x, kernel, geo, rows, depth, filters](const Tensor& g) {
      const Tensor dy = g.view_as(Shape{rows, filters});
      const Tensor k2 = kernel.view_as(Shape{depth, filters});
      // dx = col2im(dy @ K^T).
      Tensor dcols = Tensor::empty(Shape{rows, depth}, x.dtype(), x.device());
      run_gemm("conv2d", false, true, rows, depth, filters, dy, k2, dcols);
      Tensor dx = Tensor::empty(x.shape(), x.dtype(), x.device());
      dispatch_floating(x.dtype(), "conv2d", [&]<typename T>() {
        dispatch(
            "conv2d", x.device(),
            [&] {
              if (dx.numel() > 0) cpu::col2im(geo, dcols.data<T>(), dx.data<T>());
            },
            TANDEM_ON_CUDA(if (dx.numel() > 0)
                               cuda::col2im(geo, ptr<T>(dcols), ptr<T>(dx), stream)));
      });
      // dK = im2col(x)^T @ dy. The columns are rebuilt rather than kept from the forward pass:
      // one more im2col is cheap next to the GEMMs and keeps the tape's memory to the inputs.
      Tensor dk = Tensor::empty(kernel.shape(), kernel.dtype(), kernel.device());
      run_gemm("conv2d", true, false, depth, filters, rows, im2col(x, geo), dy, dk);
      return std::vector<Tensor>{dx, dk};
    });
  return y;
}

Tensor max_pool2d(const Tensor& x, std::array<int64_t, 2> pool_size, std::array<int64_t, 2> strides,
                  Padding padding) {
  common_device("max_pool2d", {&x});
  TANDEM_CHECK(x.rank() == 4, "max_pool2d: needs x [N, H, W, C], got shape ", x.shape());
  const cpu::ConvGeometry geo =
      window_geometry("max_pool2d", x.shape(), pool_size[0], pool_size[1], strides, padding);
  const Shape out_shape{geo.batch, geo.out_h, geo.out_w, geo.channels};
  Tensor y = Tensor::empty(out_shape, x.dtype(), x.device());
  Tensor index = Tensor::empty(out_shape, DType::kInt64, x.device());
  dispatch_floating(x.dtype(), "max_pool2d", [&]<typename T>() {
    dispatch(
        "max_pool2d", x.device(),
        [&] {
          if (y.numel() > 0)
            cpu::max_pool2d_forward(geo, x.data<T>(), y.data<T>(), index.data<int64_t>());
        },
        TANDEM_ON_CUDA(if (y.numel() > 0) cuda::max_pool2d_forward(geo, ptr<T>(x), ptr<T>(y),
                                                                   ptr<int64_t>(index), stream)));
  });
  if (tracked(y, {&x}))
    record("max_pool2d", {x}, y, [xs = x.shape(), geo, index](const Tensor& g) {
      Tensor dx = Tensor::empty(xs, g.dtype(), g.device());
      dispatch_floating(g.dtype(), "max_pool2d", [&]<typename T>() {
        dispatch(
            "max_pool2d", g.device(),
            [&] {
              if (dx.numel() > 0)
                cpu::max_pool2d_backward(geo, g.data<T>(), index.data<int64_t>(), dx.data<T>());
            },
            TANDEM_ON_CUDA(if (dx.numel() > 0) cuda::max_pool2d_backward(
                geo, ptr<T>(g), ptr<int64_t>(index), ptr<T>(dx), stream)));
      });
      return std::vector<Tensor>{dx};
    });
  return y;
}

// ---- random ---------------------------------------------------------------------------------

Tensor dropout(const Tensor& x, double rate, Generator& generator, bool training) {
  common_device("dropout", {&x});
  TANDEM_CHECK(rate >= 0.0 && rate < 1.0, "dropout: rate must be in [0, 1), got ", rate);
  check_floating("dropout", x);
  if (!training || rate == 0.0) return x;
  const int64_t n = x.numel();
  // Four mask elements per Philox block; reserving them here keeps the stream position the
  // same whichever backend draws the mask.
  const uint64_t first = generator.reserve(static_cast<uint64_t>((n + 3) / 4));
  Tensor mask = Tensor::empty_like(x);
  dispatch_floating(x.dtype(), "dropout", [&]<typename T>() {
    dispatch(
        "dropout", x.device(),
        [&] {
          cpu::dropout_mask(n, rate, generator.seed(), generator.stream(), first, mask.data<T>());
        },
        TANDEM_ON_CUDA(cuda::dropout_mask(n, rate, generator.seed(), generator.stream(), first,
                                          ptr<T>(mask), stream)));
  });
  Tensor y = run_binary<DTypes::kFloating>("dropout", k::Mul{}, x, mask, x.shape());
  if (tracked(y, {&x}))
    record("dropout", {x}, y,
           [mask](const Tensor& g) { return std::vector<Tensor>{mul(g, mask)}; });
  return y;
}

// ---- in place -------------------------------------------------------------------------------

void add_(Tensor& dst, const Tensor& src, double alpha) {
  common_device("add_", {&dst, &src});
  TANDEM_CHECK(dst.shape() == src.shape() && dst.dtype() == src.dtype(), "add_: destination ",
               dst.shape(), " ", dst.dtype(), " and source ", src.shape(), " ", src.dtype(),
               " differ");
  TANDEM_CHECK(is_floating(dst.dtype()) || alpha == std::trunc(alpha), "add_: alpha ", alpha,
               " is not an integer, but the tensors hold ", dst.dtype());
  if (dst.numel() == 0) return;
  const k::BroadcastPlan plan = k::make_broadcast_plan(dst.shape(), src.shape(), dst.shape());
  dispatch_numeric(dst.dtype(), "add_", [&]<typename T>() {
    dispatch(
        "add_", dst.device(),
        [&] {
          cpu::binary(k::AddScaled{alpha}, plan, dst.data<T>(), src.data<T>(), dst.data<T>());
        },
        TANDEM_ON_CUDA(cuda::binary(k::AddScaled{alpha}, plan, ptr<T>(dst), ptr<T>(src),
                                    ptr<T>(dst), stream)));
  });
}

void scale_(Tensor& dst, double factor) {
  common_device("scale_", {&dst});
  dispatch_numeric(dst.dtype(), "scale_", [&]<typename T>() {
    dispatch(
        "scale_", dst.device(),
        [&] { cpu::unary(k::Scale{factor}, dst.numel(), dst.data<T>(), dst.data<T>()); },
        TANDEM_ON_CUDA(
            cuda::unary(k::Scale{factor}, dst.numel(), ptr<T>(dst), ptr<T>(dst), stream)));
  });
}

NonFinite count_non_finite(const Tensor& x) {
  NonFinite found;
  if (!x.defined() || x.numel() == 0 || !is_floating(x.dtype())) return found;
  autograd::NoRecordGuard no_record;
  if (std::isfinite(sum(mul(x, 0.0)).item<double>())) return found;
  const Tensor host = cast(x, DType::kFloat64).to(Device::cpu());
  for (double v : host.to_vector<double>()) {
    if (std::isnan(v)) ++found.nan;
    if (std::isinf(v)) ++found.inf;
  }
  return found;
}

}  // namespace tandem::ops

// ---- Tensor members and operators declared in tensor.h --------------------------------------

namespace tandem {

Tensor Tensor::reshape(const Shape& shape) const { return ops::reshape(*this, shape); }
Tensor Tensor::slice(int64_t begin, int64_t end) const { return ops::slice(*this, begin, end); }

Tensor operator+(const Tensor& a, const Tensor& b) { return ops::add(a, b); }
Tensor operator-(const Tensor& a, const Tensor& b) { return ops::sub(a, b); }
Tensor operator*(const Tensor& a, const Tensor& b) { return ops::mul(a, b); }
Tensor operator/(const Tensor& a, const Tensor& b) { return ops::div(a, b); }
Tensor operator-(const Tensor& a) { return ops::neg(a); }
Tensor operator+(const Tensor& a, double b) { return ops::add(a, b); }
Tensor operator-(const Tensor& a, double b) { return ops::add(a, -b); }
Tensor operator*(const Tensor& a, double b) { return ops::mul(a, b); }
Tensor operator/(const Tensor& a, double b) { return ops::div_scalar(a, b); }
Tensor operator*(double a, const Tensor& b) { return ops::mul(b, a); }

}  // namespace tandem
