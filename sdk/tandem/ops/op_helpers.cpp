// The building blocks of ops/internal/op_helpers.h that are not templates: argument checks,
// broadcasting back from reductions, scalars, GEMM, the fused layers' ReLU pass, axis views, sums
// and label checks.
#include "tandem/ops/internal/op_helpers.h"

#include <algorithm>
#include <utility>

#include "tandem/ops/cpu/dense.h"
#include "tandem/ops/cpu/nn_kernels.h"
#include "tandem/ops/cpu/reduce.h"
#include "tandem/ops/cpu/shape_ops.h"

namespace tandem::ops::internal {

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
               " is not supported (needs a floating type; shape ", x.shape(), ")");
}

void check_same_dtype(std::string_view op, const Tensor& a, const Tensor& b) {
  TANDEM_CHECK(a.dtype() == b.dtype(), op, ": dtypes ", a.dtype(), " and ", b.dtype(),
               " differ (shapes ", a.shape(), " and ", b.shape(), "); cast one first");
}

Tensor broadcast_to(const Tensor& x, const Shape& shape) {
  if (x.shape() == shape) return x;
  return run_binary<DTypes::kFloating>("broadcast_to", kernels::First{}, x, x, shape);
}

Tensor scalar_like(const Tensor& x, double value) {
  Tensor s = Tensor::empty(Shape{}, x.dtype(), x.device());
  // On a GPU a kernel writes it: Tensor::fill_'s host copy would wait for the device.
  dispatch(
      "scalar", x.device(), [&] { s.fill_(value); },
      TANDEM_ON_CUDA(cuda::fill(s.dtype(), 1, value, s.raw_data(), stream)));
  return s;
}

void run_gemm(std::string_view op, bool transpose_a, bool transpose_b, int64_t m, int64_t n,
              int64_t kk, const Tensor& a, const Tensor& b, Tensor& c) {
  dispatch_any_floating(c.dtype(), op, [&]<typename T>() {
    dispatch(
        op, c.device(),
        [&] {
          if (m == 0 || n == 0) return;
          if constexpr (is_half_v<T>) {
            cpu::matmul(transpose_a, transpose_b, m, n, kk, a.data<T>(), b.data<T>(), c.data<T>());
          } else {
            if (kk == 0) {  // op(A) has no columns: C is zeros (and gemm would reject lda = 0)
              c.fill_(0.0);
              return;
            }
            cpu::gemm(transpose_a, transpose_b, m, n, kk, T(1), a.data<T>(),
                      a.shape().dims().back(), b.data<T>(), b.shape().dims().back(), T(0),
                      c.data<T>(), n);
          }
        },
        TANDEM_ON_CUDA(
            if (m == 0 || n == 0) return;
            if (kk == 0) return cuda::fill(c.dtype(), c.numel(), 0.0, c.raw_data(), stream);
            const int64_t lda = a.shape().dims().back(), ldb = b.shape().dims().back();
            if constexpr (is_half_v<T>) {
              // Summed in float32 (cuBLASLt), rounded once: as cpu::matmul.
              cuda::gemm(transpose_a, transpose_b, m, n, kk, ptr<T>(a), lda, ptr<T>(b), ldb,
                         ptr<T>(c), n, stream);
            } else {
              cuda::gemm(transpose_a, transpose_b, m, n, kk, T(1), ptr<T>(a), lda, ptr<T>(b), ldb,
                         T(0), ptr<T>(c), n, stream);
            }));
  });
}

void run_relu_backward(std::string_view op, const Tensor& g, const Tensor& y, Tensor& dz,
                       Tensor& bias_grad) {
  const int64_t m = y.dim(0), n = y.dim(1);
  const bool has_bias = bias_grad.defined();
  dispatch_any_floating(y.dtype(), op, [&]<typename T>() {
    dispatch(
        op, y.device(),
        [&] {
          cpu::dense_relu_backward(m, n, g.data<T>(), y.data<T>(), dz.data<T>(),
                                   has_bias ? bias_grad.data<T>() : nullptr);
        },
        TANDEM_ON_CUDA(if (n == 0) return; if (m > 0) cuda::binary(
                           kernels::ReluGrad{},
                           kernels::make_broadcast_plan(y.shape(), g.shape(), y.shape()), ptr<T>(y),
                           ptr<T>(g), ptr<T>(dz), stream);
                       // An empty batch (m == 0) sums to zeros.
                       if (has_bias) cuda::sum(ptr<T>(dz), 1, m, n, ptr<T>(bias_grad), stream)));
  });
}

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

Tensor run_sum(std::string_view op, const Tensor& x, int64_t outer, int64_t n, int64_t inner,
               const Shape& shape) {
  Tensor y = Tensor::empty(shape, x.dtype(), x.device());
  dispatch_any_numeric(x.dtype(), op, [&]<typename T>() {
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

void check_labels(std::string_view op, const Tensor& labels, int64_t depth, std::string_view what) {
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
    TANDEM_CHECK(bad < 0, op, ": ", what, " ", value, " at index ", bad, " is outside [0, ", depth,
                 ")");
  });
}

}  // namespace tandem::ops::internal
