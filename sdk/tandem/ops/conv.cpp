// Convolution and pooling ops over NHWC inputs: conv2d, fused with its bias and ReLU, with a
// backward that skips the input gradient of an untracked input; max_pool2d and avg_pool2d; and
// the window geometry (TensorFlow's VALID and SAME) they share.
#include "tandem/ops/cpu/conv.h"

#include <algorithm>

#include "tandem/ops/cpu/nn_kernels.h"
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
using internal::run_relu_backward;
using internal::tracked;

namespace {

constexpr std::string_view kConv = "conv2d";
constexpr std::string_view kPool = "max_pool2d";
constexpr std::string_view kAvgPool = "avg_pool2d";

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

/// y = act(conv(x, kernel) + bias): the CPU kernel (oneDNN for float32); on CUDA im2col and
/// cuBLAS' GEMM followed by the bias and the ReLU in place on its output; in 16 bits im2col
/// (exact copies) and the dense layer's cuBLASLt matmul, whose epilogue adds the bias and
/// applies the ReLU to the float32 sums before y is rounded once, as the CPU's 16-bit kernel.
void run_conv2d(const Tensor& x, const Tensor& kernel, const Tensor& bias,
                const cpu::ConvGeometry& geo, bool relu, Tensor& y) {
  const int64_t filters = kernel.dim(3);
  const bool has_bias = bias.defined();
  dispatch_any_floating(x.dtype(), kConv, [&]<typename T>() {
    dispatch(
        kConv, x.device(),
        [&] {
          cpu::conv2d(geo, filters, x.data<T>(), kernel.data<T>(),
                      has_bias ? bias.data<T>() : nullptr, relu, y.data<T>());
        },
        TANDEM_ON_CUDA(
            if (y.numel() == 0) return;
            const int64_t rows = cpu::im2col_rows(geo), depth = cpu::im2col_depth(geo);
            if constexpr (is_half_v<T>) {
              // depth == 0 (no channels): dense_forward writes act(bias) without reading cols.
              const Tensor cols =
                  Tensor::empty(Shape{rows, std::max<int64_t>(depth, 1)}, x.dtype(), x.device());
              if (depth > 0) cuda::im2col(geo, ptr<T>(x), ptr<T>(cols), stream);
              cuda::dense_forward(rows, filters, depth, ptr<T>(cols), ptr<T>(kernel),
                                  has_bias ? ptr<T>(bias) : nullptr, relu, ptr<T>(y), stream);
            } else {
              if (depth == 0) {
                cuda::fill(y.dtype(), y.numel(), 0.0, y.raw_data(), stream);
              } else {
                const Tensor cols = Tensor::empty(Shape{rows, depth}, x.dtype(), x.device());
                cuda::im2col(geo, ptr<T>(x), ptr<T>(cols), stream);
                cuda::gemm(false, false, rows, filters, depth, T(1), ptr<T>(cols), depth,
                           ptr<T>(kernel), filters, T(0), ptr<T>(y), filters, stream);
              }
              if (has_bias)
                cuda::binary(kernels::Add{},
                             kernels::make_broadcast_plan(y.shape(), bias.shape(), y.shape()),
                             ptr<T>(y), ptr<T>(bias), ptr<T>(y), stream);
              if (relu) cuda::unary(kernels::Relu{}, y.numel(), ptr<T>(y), ptr<T>(y), stream);
            }));
  });
}

/// kernel_grad and, when defined, bias_grad from the output gradient dz (ReLU's mask applied).
void run_conv2d_backward_weights(const Tensor& x, const Tensor& dz, const cpu::ConvGeometry& geo,
                                 Tensor& kernel_grad, Tensor& bias_grad) {
  const int64_t filters = kernel_grad.dim(3);
  const bool has_bias = bias_grad.defined();
  dispatch_any_floating(x.dtype(), kConv, [&]<typename T>() {
    dispatch(
        kConv, x.device(),
        [&] {
          cpu::conv2d_backward_weights(geo, filters, x.data<T>(), dz.data<T>(),
                                       kernel_grad.data<T>(),
                                       has_bias ? bias_grad.data<T>() : nullptr);
        },
        TANDEM_ON_CUDA({
          const int64_t rows = cpu::im2col_rows(geo), depth = cpu::im2col_depth(geo);
          // An empty batch sums to zeros (16 bits: summed in double, rounded once).
          if (has_bias && filters > 0)
            cuda::sum(ptr<T>(dz), 1, rows, filters, ptr<T>(bias_grad), stream);
          if (kernel_grad.numel() == 0) return;
          if (rows == 0)
            return cuda::fill(kernel_grad.dtype(), kernel_grad.numel(), 0.0, kernel_grad.raw_data(),
                              stream);
          // dkernel [depth, filters] = im2col(x)^T dz.
          const Tensor cols = Tensor::empty(Shape{rows, depth}, x.dtype(), x.device());
          cuda::im2col(geo, ptr<T>(x), ptr<T>(cols), stream);
          if constexpr (is_half_v<T>) {
            // Summed in float32 (cuBLASLt), rounded once.
            cuda::gemm(true, false, depth, filters, rows, ptr<T>(cols), depth, ptr<T>(dz), filters,
                       ptr<T>(kernel_grad), filters, stream);
          } else {
            cuda::gemm(true, false, depth, filters, rows, T(1), ptr<T>(cols), depth, ptr<T>(dz),
                       filters, T(0), ptr<T>(kernel_grad), filters, stream);
          }
        }));
  });
}

/// x_grad from the output gradient dz (ReLU's mask applied).
void run_conv2d_backward_data(const Tensor& dz, const Tensor& kernel, const cpu::ConvGeometry& geo,
                              Tensor& x_grad) {
  const int64_t filters = kernel.dim(3);
  dispatch_any_floating(dz.dtype(), kConv, [&]<typename T>() {
    dispatch(
        kConv, dz.device(),
        [&] {
          cpu::conv2d_backward_data(geo, filters, dz.data<T>(), kernel.data<T>(), x_grad.data<T>());
        },
        TANDEM_ON_CUDA(
            if (x_grad.numel() == 0) return;
            const int64_t rows = cpu::im2col_rows(geo), depth = cpu::im2col_depth(geo);
            if constexpr (is_half_v<T>) {
              // dx = col2im(dz kernel^T) with the products and their overlaps summed in float32
              // and dx rounded once, as the CPU's 16-bit kernel: float32 dcols in between.
              const Tensor dcols = Tensor::empty(Shape{rows, depth}, DType::kFloat32, dz.device());
              if (filters == 0)
                cuda::fill(dcols.dtype(), dcols.numel(), 0.0, dcols.raw_data(), stream);
              else
                cuda::gemm(false, true, rows, depth, filters, ptr<T>(dz), filters, ptr<T>(kernel),
                           filters, ptr<float>(dcols), depth, stream);
              cuda::col2im(geo, ptr<float>(dcols), ptr<T>(x_grad), stream);
            } else {
              // dx = col2im(dz kernel^T).
              const Tensor dcols = Tensor::empty(Shape{rows, depth}, dz.dtype(), dz.device());
              if (filters == 0)
                cuda::fill(dcols.dtype(), dcols.numel(), 0.0, dcols.raw_data(), stream);
              else
                cuda::gemm(false, true, rows, depth, filters, T(1), ptr<T>(dz), filters,
                           ptr<T>(kernel), filters, T(0), ptr<T>(dcols), depth, stream);
              cuda::col2im(geo, ptr<T>(dcols), ptr<T>(x_grad), stream);
            }));
  });
}

}  // namespace

// ---- convolution ----------------------------------------------------------------------------

void set_winograd_convolutions(bool enabled) { cpu::set_winograd_convolutions(enabled); }

bool winograd_convolutions() { return cpu::winograd_convolutions(); }

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
  return conv2d(x, kernel, Tensor(), strides, padding, FusedActivation::kLinear);
}

Tensor conv2d(const Tensor& x, const Tensor& kernel, const Tensor& bias,
              std::array<int64_t, 2> strides, Padding padding, FusedActivation activation) {
  const bool has_bias = bias.defined();
  if (has_bias)
    common_device(kConv, {&x, &kernel, &bias});
  else
    common_device(kConv, {&x, &kernel});
  TANDEM_CHECK(x.rank() == 4 && kernel.rank() == 4 && x.dim(3) == kernel.dim(2), kConv,
               ": needs x [N, H, W, C] and kernel [KH, KW, C, Cout] with the same C, got shapes ",
               x.shape(), " and ", kernel.shape());
  check_floating(kConv, x);
  check_same_dtype(kConv, x, kernel);
  if (has_bias) {
    TANDEM_CHECK(bias.rank() == 1 && bias.dim(0) == kernel.dim(3), kConv, ": bias of shape ",
                 bias.shape(), " does not match kernel of shape ", kernel.shape(), " (needs [",
                 kernel.dim(3), "])");
    check_same_dtype(kConv, x, bias);
  }
  const cpu::ConvGeometry geo =
      window_geometry(kConv, x.shape(), kernel.dim(0), kernel.dim(1), strides, padding);
  const bool relu = activation == FusedActivation::kRelu;
  const int64_t filters = kernel.dim(3);
  Tensor y = Tensor::empty(Shape{geo.batch, geo.out_h, geo.out_w, filters}, x.dtype(), x.device());
  run_conv2d(x, kernel, bias, geo, relu, y);

  std::vector<Tensor> inputs{x, kernel};
  if (has_bias) inputs.push_back(bias);
  if (!needs_recording(inputs)) return y;
  // Decided now, as whether to record at all is: a tape that tracks x tracks it from here on.
  const bool x_needs_grad = needs_recording({&x});
  record_op(kConv, std::move(inputs), y,
            [x, kernel, y, geo, has_bias, relu, x_needs_grad](const Tensor& g) {
              const int64_t filters = kernel.dim(3);
              Tensor dz = g;
              if (relu) {
                // Masked as ops::dense masks, viewed as [output pixels, filters].
                const Shape matrix{cpu::im2col_rows(geo), filters};
                dz = Tensor::empty_like(g);
                Tensor dz_matrix = dz.view_as(matrix), no_bias;
                run_relu_backward(kConv, g.view_as(matrix), y.view_as(matrix), dz_matrix, no_bias);
              }
              Tensor kernel_grad = Tensor::empty(kernel.shape(), g.dtype(), g.device());
              Tensor bias_grad =
                  has_bias ? Tensor::empty(Shape{filters}, g.dtype(), g.device()) : Tensor();
              run_conv2d_backward_weights(x, dz, geo, kernel_grad, bias_grad);
              Tensor x_grad;
              if (x_needs_grad) {
                x_grad = Tensor::empty(x.shape(), g.dtype(), g.device());
                run_conv2d_backward_data(dz, kernel, geo, x_grad);
              }
              std::vector<Tensor> grads{x_grad, kernel_grad};
              if (has_bias) grads.push_back(bias_grad);
              return grads;
            });
  return y;
}

// ---- pooling --------------------------------------------------------------------------------

Tensor max_pool2d(const Tensor& x, std::array<int64_t, 2> pool_size, std::array<int64_t, 2> strides,
                  Padding padding) {
  common_device(kPool, {&x});
  TANDEM_CHECK(x.rank() == 4, kPool, ": needs x [N, H, W, C], got shape ", x.shape());
  // 16 bits on a GPU: through float32 (the maximum of the widened values is exact; so is
  // rounding it back). The CPU compares 16-bit values directly.
  if (is_half(x.dtype()) && !x.device().is_cpu())
    return cast(max_pool2d(cast(x, DType::kFloat32), pool_size, strides, padding), x.dtype());
  const cpu::ConvGeometry geo =
      window_geometry(kPool, x.shape(), pool_size[0], pool_size[1], strides, padding);
  const Shape out_shape{geo.batch, geo.out_h, geo.out_w, geo.channels};
  Tensor y = Tensor::empty(out_shape, x.dtype(), x.device());
  // The CPU's backward finds each maximum again from x and y; CUDA's records where it was.
  Tensor index;
  dispatch_any_floating(x.dtype(), kPool, [&]<typename T>() {
    dispatch(
        kPool, x.device(),
        [&] {
          if (y.numel() > 0) cpu::max_pool2d_forward(geo, x.data<T>(), y.data<T>());
        },
        TANDEM_ON_CUDA(if constexpr (!is_half_v<T>) {
          index = Tensor::empty(out_shape, DType::kInt64, x.device());
          if (y.numel() > 0)
            cuda::max_pool2d_forward(geo, ptr<T>(x), ptr<T>(y), ptr<int64_t>(index), stream);
        }));
  });
  if (tracked(y, {&x}))
    record_op(kPool, {x}, y, [x, y, geo, index](const Tensor& g) {
      Tensor dx = Tensor::empty(x.shape(), g.dtype(), g.device());
      dispatch_any_floating(g.dtype(), kPool, [&]<typename T>() {
        dispatch(
            kPool, g.device(),
            [&] {
              if (dx.numel() > 0)
                cpu::max_pool2d_backward(geo, x.data<T>(), y.data<T>(), g.data<T>(), dx.data<T>());
            },
            TANDEM_ON_CUDA(if constexpr (!is_half_v<T>) {
              if (dx.numel() > 0)
                cuda::max_pool2d_backward(geo, ptr<T>(g), ptr<int64_t>(index), ptr<T>(dx), stream);
            }));
      });
      return std::vector<Tensor>{dx};
    });
  return y;
}

Tensor avg_pool2d(const Tensor& x, std::array<int64_t, 2> pool_size, std::array<int64_t, 2> strides,
                  Padding padding) {
  common_device(kAvgPool, {&x});
  TANDEM_CHECK(x.rank() == 4, kAvgPool, ": needs x [N, H, W, C], got shape ", x.shape());
  // 16 bits: summed in float32 and rounded once, forward and backward.
  if (is_half(x.dtype()))
    return cast(avg_pool2d(cast(x, DType::kFloat32), pool_size, strides, padding), x.dtype());
  const cpu::ConvGeometry geo =
      window_geometry(kAvgPool, x.shape(), pool_size[0], pool_size[1], strides, padding);
  const Shape out_shape{geo.batch, geo.out_h, geo.out_w, geo.channels};
  Tensor y = Tensor::empty(out_shape, x.dtype(), x.device());
  dispatch_floating(x.dtype(), kAvgPool, [&]<typename T>() {
    dispatch(
        kAvgPool, x.device(),
        [&] {
          if (y.numel() > 0) cpu::avg_pool2d_forward(geo, x.data<T>(), y.data<T>());
        },
        TANDEM_ON_CUDA(cuda::avg_pool2d_forward(geo, ptr<T>(x), ptr<T>(y), stream)));
  });
  if (tracked(y, {&x}))
    record_op(kAvgPool, {x}, y, [shape = x.shape(), geo](const Tensor& g) {
      Tensor dx = Tensor::empty(shape, g.dtype(), g.device());
      dispatch_floating(g.dtype(), kAvgPool, [&]<typename T>() {
        dispatch(
            kAvgPool, g.device(),
            [&] {
              if (dx.numel() > 0) cpu::avg_pool2d_backward(geo, g.data<T>(), dx.data<T>());
            },
            TANDEM_ON_CUDA(cuda::avg_pool2d_backward(geo, ptr<T>(g), ptr<T>(dx), stream)));
      });
      return std::vector<Tensor>{dx};
    });
  return y;
}

}  // namespace tandem::ops
