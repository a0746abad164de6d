// Shape ops: reshape, flatten, transpose, concat and slice (views and copies; transpose is the
// only kernel), each with its backward.
#include "tandem/ops/cpu/shape_ops.h"

#include <utility>

#include "tandem/ops/internal/op_helpers.h"
#include "tandem/ops/ops.h"

namespace tandem::ops {

namespace k = kernels;

using internal::common_device;
using internal::dispatch;
using internal::record_op;
using internal::tracked;

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
    record_op("reshape", {x}, y,
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
    record_op("transpose", {x}, y, [axes](const Tensor& g) {
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
  if (is_floating(y.dtype()) && needs_recording(xs))
    record_op("concat", xs, y, [xs, offsets](const Tensor& g) {
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
    record_op("slice", {x}, y, [x, offset](const Tensor& g) {
      // The rows outside the slice get zero gradient.
      Tensor dx = Tensor::zeros(x.shape(), x.dtype(), x.device());
      if (g.numel() > 0) dx.view_as(g.shape(), offset).copy_from(g);
      return std::vector<Tensor>{dx};
    });
  return y;
}

namespace {

/// Copies `count` blocks of `block` bytes from src (blocks `src_stride` bytes apart) to dst
/// (blocks `dst_stride` bytes apart), starting `src_offset` and `dst_offset` bytes in; one block
/// copy per block on any device.
void copy_blocks(const Tensor& src, size_t src_offset, size_t src_stride, Tensor& dst,
                 size_t dst_offset, size_t dst_stride, int64_t count, size_t block) {
  if (block == 0) return;
  const size_t element = dtype_size(src.dtype());
  const Shape chunk{static_cast<int64_t>(block / element)};
  for (int64_t o = 0; o < count; ++o) {
    const auto u = static_cast<size_t>(o);
    dst.view_as(chunk, dst_offset + u * dst_stride)
        .copy_from(src.view_as(chunk, src_offset + u * src_stride));
  }
}

}  // namespace

Tensor slice(const Tensor& x, int64_t axis, int64_t begin, int64_t end) {
  common_device("slice", {&x});
  TANDEM_CHECK(x.rank() >= 1, "slice: needs a tensor of rank >= 1, got shape ", x.shape());
  TANDEM_CHECK(-x.rank() <= axis && axis < x.rank(), "slice: axis ", axis,
               " is out of range for shape ", x.shape());
  const int64_t a = axis < 0 ? axis + x.rank() : axis;
  const int64_t n = x.dim(a);
  TANDEM_CHECK(0 <= begin && begin <= end && end <= n, "slice: [", begin, ", ", end,
               ") is not within the ", n, " entries of axis ", a, " of shape ", x.shape());
  int64_t outer = 1, inner = 1;
  for (int64_t i = 0; i < a; ++i) outer *= x.dim(i);
  for (int64_t i = a + 1; i < x.rank(); ++i) inner *= x.dim(i);
  // Everything before the axis is 1: the slice is contiguous, a view (as slice along axis 0).
  if (outer == 1) {
    const Tensor rows = reshape(x, Shape{n, inner});
    std::vector<int64_t> dims = x.shape().dims();
    dims[static_cast<size_t>(a)] = end - begin;
    return reshape(slice(rows, begin, end), Shape(std::move(dims)));
  }
  std::vector<int64_t> dims = x.shape().dims();
  dims[static_cast<size_t>(a)] = end - begin;
  Tensor y = Tensor::empty(Shape(std::move(dims)), x.dtype(), x.device());
  const size_t element = dtype_size(x.dtype());
  const size_t x_stride = static_cast<size_t>(n * inner) * element;
  const size_t y_stride = static_cast<size_t>((end - begin) * inner) * element;
  const size_t offset = static_cast<size_t>(begin * inner) * element;
  if (y.numel() > 0) copy_blocks(x, offset, x_stride, y, 0, y_stride, outer, y_stride);
  if (tracked(y, {&x}))
    record_op("slice", {x}, y, [x, offset, x_stride, y_stride, outer](const Tensor& g) {
      // Zero gradient outside the slice.
      Tensor dx = Tensor::zeros(x.shape(), x.dtype(), x.device());
      if (g.numel() > 0) copy_blocks(g, 0, y_stride, dx, offset, x_stride, outer, y_stride);
      return std::vector<Tensor>{dx};
    });
  return y;
}

std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t axis) {
  TANDEM_CHECK(x.rank() >= 1 && -x.rank() <= axis && axis < x.rank(), "split: axis ", axis,
               " is out of range for shape ", x.shape());
  const int64_t n = x.dim(axis < 0 ? axis + x.rank() : axis);
  int64_t total = 0;
  for (int64_t size : sizes) {
    TANDEM_CHECK(size >= 0, "split: size ", size, " is negative (sizes for shape ", x.shape(), ")");
    total += size;
  }
  TANDEM_CHECK(total == n, "split: sizes adding up to ", total, " do not cover the ", n,
               " entries of axis ", axis, " of shape ", x.shape());
  std::vector<Tensor> parts;
  int64_t begin = 0;
  for (int64_t size : sizes) {
    parts.push_back(slice(x, axis, begin, begin + size));
    begin += size;
  }
  return parts;
}

std::vector<Tensor> split(const Tensor& x, int64_t parts, int64_t axis) {
  TANDEM_CHECK(parts >= 1, "split: needs at least one part, got ", parts);
  TANDEM_CHECK(x.rank() >= 1 && -x.rank() <= axis && axis < x.rank(), "split: axis ", axis,
               " is out of range for shape ", x.shape());
  const int64_t n = x.dim(axis < 0 ? axis + x.rank() : axis);
  TANDEM_CHECK(n % parts == 0, "split: the ", n, " entries of axis ", axis, " of shape ", x.shape(),
               " do not split into ", parts, " equal parts");
  return split(x, std::vector<int64_t>(static_cast<size_t>(parts), n / parts), axis);
}

Tensor tril(const Tensor& x, int64_t diagonal) {
  common_device("tril", {&x});
  TANDEM_CHECK(x.rank() >= 2,
               "tril: needs a tensor of rank >= 2 ([..., rows, columns]), got shape ", x.shape());
  const int64_t rows = x.dim(-2), cols = x.dim(-1);
  std::vector<uint8_t> lower(static_cast<size_t>(rows * cols));
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) lower[static_cast<size_t>(i * cols + j)] = j - i <= diagonal;
  const Tensor keep =
      cast(Tensor::from_vector<uint8_t>(lower, Shape{rows, cols}), DType::kBool).to(x.device());
  return where(keep, x, Tensor::zeros(Shape{}, x.dtype(), x.device()));
}

}  // namespace tandem::ops
