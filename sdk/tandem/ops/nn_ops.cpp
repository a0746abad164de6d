// Neural-network ops: softmax and log_softmax, matmul, the fused sparse softmax cross-entropy,
// conv2d, max_pool2d and dropout, each with its backward.
#include <algorithm>

#include "tandem/ops/cpu/nn_kernels.h"
#include "tandem/ops/cpu/softmax.h"
#include "tandem/ops/internal/op_helpers.h"
#include "tandem/ops/kernels/functors.h"
#include "tandem/ops/ops.h"

namespace tandem::ops {

namespace k = kernels;

using internal::axis_view;
using internal::AxisView;
using internal::check_floating;
using internal::check_labels;
using internal::check_same_dtype;
using internal::common_device;
using internal::dispatch;
using internal::dispatch_labels;
using internal::DTypes;
using internal::ptr;
using internal::record_op;
using internal::run_binary;
using internal::run_gemm;
using internal::tracked;

namespace {

// ---- convolution geometry ----------------------------------------------------------------------

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

// ---- softmax --------------------------------------------------------------------------------

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
    record_op("softmax", {x}, y, [y, axis](const Tensor& g) {
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
    record_op("log_softmax", {x}, y, [y, axis](const Tensor& g) {
      // dx = g - softmax(x) * sum(g, axis), with softmax(x) = exp(y).
      return std::vector<Tensor>{sub(g, mul(exp(y), sum(g, axis, /*keepdims=*/true)))};
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
    record_op("matmul", {a, b}, c, [a, b, transpose_a, transpose_b](const Tensor& g) {
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
    record_op(kOp, {logits, labels}, loss, [logits, labels](const Tensor& g) {
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
    record_op("conv2d", {x, kernel}, y, [x, kernel, geo, rows, depth, filters](const Tensor& g) {
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
    record_op("max_pool2d", {x}, y, [xs = x.shape(), geo, index](const Tensor& g) {
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
    record_op("dropout", {x}, y,
              [mask](const Tensor& g) { return std::vector<Tensor>{mul(g, mask)}; });
  return y;
}

}  // namespace tandem::ops
