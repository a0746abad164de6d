// Neural-network ops: softmax and log_softmax, matmul, the fused sparse softmax cross-entropy,
// dropout and embedding, each with its backward (conv2d and pooling: conv.cpp; dense: dense.cpp).
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

// ---- softmax --------------------------------------------------------------------------------

Tensor softmax(const Tensor& x, int64_t axis) {
  common_device("softmax", {&x});
  // 16-bit: exponentials and their sum in float32, the result rounded once.
  if (is_half(x.dtype())) return cast(softmax(cast(x, DType::kFloat32), axis), x.dtype());
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
  if (is_half(x.dtype())) return cast(log_softmax(cast(x, DType::kFloat32), axis), x.dtype());
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

namespace {

/// The leading (batch) dimensions of an operand of rank >= 2.
Shape batch_dims(const Tensor& x) {
  return Shape(std::vector<int64_t>(x.shape().dims().begin(), x.shape().dims().end() - 2));
}

/// For each matrix of a batch of shape `batch` (row-major order), the index of the matrix of an
/// operand whose batch shape `operand` broadcasts to it (numpy's rules: missing leading
/// dimensions and dimensions of size 1 repeat).
std::vector<int64_t> broadcast_matrix_indices(const Shape& batch, const Shape& operand) {
  const int64_t rank = batch.rank(), lead = rank - operand.rank();
  std::vector<int64_t> strides(static_cast<size_t>(rank), 0);
  int64_t stride = 1;
  for (int64_t i = rank - 1; i >= lead; --i) {
    const int64_t d = operand[i - lead];
    strides[static_cast<size_t>(i)] = d == 1 ? 0 : stride;
    stride *= d;
  }
  std::vector<int64_t> indices(static_cast<size_t>(batch.numel()));
  std::vector<int64_t> position(static_cast<size_t>(rank), 0);
  int64_t index = 0;
  for (int64_t& out : indices) {
    out = index;
    // Next position, innermost first; index follows by the strides.
    for (int64_t i = rank - 1; i >= 0; --i) {
      const auto u = static_cast<size_t>(i);
      index += strides[u];
      if (++position[u] < batch[i]) break;
      index -= strides[u] * position[u];
      position[u] = 0;
    }
  }
  return indices;
}

}  // namespace

Tensor matmul(const Tensor& a, const Tensor& b, bool transpose_a, bool transpose_b) {
  common_device("matmul", {&a, &b});
  TANDEM_CHECK(
      a.rank() >= 2 && b.rank() >= 2,
      "matmul: needs operands of rank 2 or more ([..., M, K] and [..., K, N]), got shapes ",
      a.shape(), " and ", b.shape());
  check_same_dtype("matmul", a, b);
  const int64_t m = transpose_a ? a.dim(-1) : a.dim(-2), ka = transpose_a ? a.dim(-2) : a.dim(-1);
  const int64_t kb = transpose_b ? b.dim(-1) : b.dim(-2), n = transpose_b ? b.dim(-2) : b.dim(-1);
  TANDEM_CHECK(ka == kb, "matmul: shapes ", a.shape(), " and ", b.shape(),
               " are incompatible (transpose_a=", transpose_a, ", transpose_b=", transpose_b,
               ": inner dimensions ", ka, " and ", kb, ")");
  if (a.rank() > 2 || b.rank() > 2) {
    const Shape batch_a = batch_dims(a), batch_b = batch_dims(b);
    Shape batch;
    try {
      batch = broadcast_shapes(batch_a, batch_b);
    } catch (const Error&) {
      TANDEM_THROW("matmul: the batch dimensions ", batch_a, " of ", a.shape(), " and ", batch_b,
                   " of ", b.shape(), " do not broadcast");
    }
    std::vector<int64_t> out_dims = batch.dims();
    out_dims.push_back(m);
    out_dims.push_back(n);
    const Shape out_shape(std::move(out_dims));
    // A single right-hand matrix and rows on the left: one GEMM over all of a's rows (the
    // reshapes record, so the backward is one GEMM each way too).
    if (batch_b.numel() == 1 && !transpose_a) {
      const Tensor rows = reshape(a, Shape{batch_a.numel() * a.dim(-2), ka});
      const Tensor matrix = reshape(b, Shape{b.dim(-2), b.dim(-1)});
      return reshape(matmul(rows, matrix, false, transpose_b), out_shape);
    }
    Tensor c = Tensor::empty(out_shape, a.dtype(), a.device());
    const std::vector<int64_t> ia = broadcast_matrix_indices(batch, batch_a);
    const std::vector<int64_t> ib = broadcast_matrix_indices(batch, batch_b);
    const Shape a_matrix{a.dim(-2), a.dim(-1)}, b_matrix{b.dim(-2), b.dim(-1)}, c_matrix{m, n};
    const size_t element = dtype_size(a.dtype());
    const auto a_bytes = static_cast<size_t>(a_matrix.numel()) * element;
    const auto b_bytes = static_cast<size_t>(b_matrix.numel()) * element;
    const auto c_bytes = static_cast<size_t>(m * n) * element;
    for (size_t i = 0; i < ia.size(); ++i) {
      const Tensor av = a.view_as(a_matrix, static_cast<size_t>(ia[i]) * a_bytes);
      const Tensor bv = b.view_as(b_matrix, static_cast<size_t>(ib[i]) * b_bytes);
      Tensor cv = c.view_as(c_matrix, i * c_bytes);
      run_gemm("matmul", transpose_a, transpose_b, m, n, ka, av, bv, cv);
    }
    if (tracked(c, {&a, &b}))
      record_op("matmul", {a, b}, c, [a, b, transpose_a, transpose_b](const Tensor& g) {
        // The matrix formulas below, batched; an operand that was broadcast gets the sum of
        // its gradients over the batch dimensions it repeated along.
        Tensor ga, gb;
        if (!transpose_a && !transpose_b) {
          ga = matmul(g, b, false, true);
          gb = matmul(a, g, true, false);
        } else if (!transpose_a) {
          ga = matmul(g, b, false, false);
          gb = matmul(g, a, true, false);
        } else if (!transpose_b) {
          ga = matmul(b, g, false, true);
          gb = matmul(a, g, false, false);
        } else {
          ga = matmul(b, g, true, true);
          gb = matmul(g, a, true, true);
        }
        return std::vector<Tensor>{sum_to(ga, a.shape()), sum_to(gb, b.shape())};
      });
    return c;
  }
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
  bool match = logits.rank() >= 2 && labels.rank() == logits.rank() - 1;
  for (int64_t i = 0; match && i < labels.rank(); ++i) match = labels.dim(i) == logits.dim(i);
  TANDEM_CHECK(match, kOp,
               ": needs logits [..., C] and labels [...] (logits [N, C] and labels "
               "[N], or [B, T, C] and [B, T]), got shapes ",
               logits.shape(), " and ", labels.shape());
  // Any leading dimensions: the rows of [N, C] and [N], the loss reshaped back (the reshapes
  // record, so the gradient flows back to the logits' shape).
  if (logits.rank() > 2)
    return reshape(
        sparse_softmax_cross_entropy(reshape(logits, Shape{labels.numel(), logits.dim(-1)}),
                                     reshape(labels, Shape{labels.numel()})),
        labels.shape());
  TANDEM_CHECK(labels.dtype() == DType::kInt32 || labels.dtype() == DType::kInt64, kOp,
               ": labels must be int32 or int64, got ", labels.dtype());
  const int64_t batch = logits.dim(0), classes = logits.dim(1);
  TANDEM_CHECK(classes >= 1, kOp, ": needs at least one class, got logits of shape ",
               logits.shape());
  // 16-bit logits: the loss computes in float32 and stays float32 (as Keras's losses do under
  // a mixed precision policy); the gradient comes back to the logits in their dtype.
  if (is_half(logits.dtype()))
    return sparse_softmax_cross_entropy(cast(logits, DType::kFloat32), labels);
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

// ---- random ---------------------------------------------------------------------------------

Tensor dropout(const Tensor& x, double rate, Generator& generator, bool training) {
  common_device("dropout", {&x});
  TANDEM_CHECK(rate >= 0.0 && rate < 1.0, "dropout: rate must be in [0, 1), got ", rate);
  check_floating("dropout", x);
  if (!training || rate == 0.0) return x;
  // 16-bit: the same mask (the same stream positions), applied in float32 and rounded once.
  if (is_half(x.dtype()))
    return cast(dropout(cast(x, DType::kFloat32), rate, generator, training), x.dtype());
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

// ---- embedding ------------------------------------------------------------------------------

Tensor embedding(const Tensor& table, const Tensor& indices) {
  constexpr std::string_view op = "embedding";
  common_device(op, {&table, &indices});
  TANDEM_CHECK(table.rank() == 2, op, ": needs a table [rows, width], got shape ", table.shape());
  TANDEM_CHECK(indices.dtype() == DType::kInt32 || indices.dtype() == DType::kInt64, op,
               ": indices must be int32 or int64, got ", indices.dtype(), " (shape ",
               indices.shape(), ")");
  check_floating(op, table);
  if (is_half(table.dtype()))
    return cast(embedding(cast(table, DType::kFloat32), indices), table.dtype());
  const int64_t rows = table.dim(0), width = table.dim(1), n = indices.numel();
  check_labels(op, indices, rows, "row index");
  std::vector<int64_t> dims = indices.shape().dims();
  dims.push_back(width);
  Tensor y = Tensor::empty(Shape(std::move(dims)), table.dtype(), table.device());
  dispatch_floating(table.dtype(), op, [&]<typename T>() {
    dispatch_labels(indices.dtype(), [&]<typename L>() {
      dispatch(
          op, table.device(),
          [&] {
            if (y.numel() > 0)
              cpu::embedding_forward(table.data<T>(), width, indices.data<L>(), n, y.data<T>());
          },
          TANDEM_ON_CUDA(cuda::embedding_forward(ptr<T>(table), width, ptr<L>(indices), n,
                                                 ptr<T>(y), stream)));
    });
  });
  if (tracked(y, {&table}))
    record_op(op, {table}, y, [indices, rows, width, n](const Tensor& g) {
      Tensor dtable = Tensor::empty(Shape{rows, width}, g.dtype(), g.device());
      dispatch_floating(g.dtype(), "embedding", [&]<typename T>() {
        dispatch_labels(indices.dtype(), [&]<typename L>() {
          dispatch(
              "embedding", g.device(),
              [&] {
                if (dtable.numel() > 0)
                  cpu::embedding_backward(g.data<T>(), indices.data<L>(), n, rows, width,
                                          dtable.data<T>());
              },
              TANDEM_ON_CUDA(cuda::embedding_backward(ptr<T>(g), ptr<L>(indices), n, rows, width,
                                                      ptr<T>(dtable), stream)));
        });
      });
      return std::vector<Tensor>{dtable};
    });
  return y;
}

}  // namespace tandem::ops
