// scaled_dot_product_attention: the checks, the mask's broadcast, the fused CPU kernels
// (ops/cpu/attention.h) with their backward, and the composed ops where no fused kernel runs.
#include "tandem/ops/cpu/attention.h"

#include <cmath>
#include <type_traits>
#include <vector>

#include "tandem/ops/internal/op_helpers.h"
#include "tandem/ops/ops.h"

namespace tandem::ops {

using internal::check_floating;
using internal::check_same_dtype;
using internal::common_device;
using internal::record_op;
using internal::tracked;

namespace {

constexpr std::string_view kOp = "scaled_dot_product_attention";

/// Where each problem's mask starts, and the row and column strides (0 where it broadcasts),
/// for a mask of shape `mask` broadcast to batch + [tq, tk].
struct MaskLayout {
  std::vector<int64_t> offsets;
  int64_t row_stride = 0, col_stride = 0;
};

MaskLayout mask_layout(const Shape& mask, const Shape& batch) {
  const int64_t rank = batch.rank() + 2, lead = rank - mask.rank();
  std::vector<int64_t> full(static_cast<size_t>(rank), 1), strides(static_cast<size_t>(rank), 0);
  for (int64_t i = 0; i < mask.rank(); ++i) full[static_cast<size_t>(lead + i)] = mask[i];
  int64_t stride = 1;
  for (int64_t i = rank - 1; i >= 0; --i) {
    const auto u = static_cast<size_t>(i);
    strides[u] = full[u] == 1 ? 0 : stride;
    stride *= full[u];
  }
  MaskLayout layout;
  layout.row_stride = strides[static_cast<size_t>(rank - 2)];
  layout.col_stride = strides[static_cast<size_t>(rank - 1)];
  layout.offsets.resize(static_cast<size_t>(batch.numel()));
  for (int64_t b = 0; b < batch.numel(); ++b) {
    int64_t rest = b, offset = 0;
    for (int64_t i = batch.rank() - 1; i >= 0; --i) {
      offset += (rest % batch[i]) * strides[static_cast<size_t>(i)];
      rest /= batch[i];
    }
    layout.offsets[static_cast<size_t>(b)] = offset;
  }
  return layout;
}

/// The composed ops: matmul, the masks as -inf, softmax, dropout, matmul; rows with no visible
/// key give zeros, as the fused kernel.
Tensor composed_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask,
                          bool causal, double rate, Generator* generator, double scale) {
  const int64_t tq = q.dim(-2), tk = k.dim(-2);
  Tensor scores = mul(matmul(q, k, false, true), scale);
  Tensor visible = mask;
  if (causal) {
    std::vector<uint8_t> lower(static_cast<size_t>(tq * tk));
    for (int64_t i = 0; i < tq; ++i)
      for (int64_t j = 0; j < tk; ++j) lower[static_cast<size_t>(i * tk + j)] = j <= i;
    Tensor triangle =
        cast(Tensor::from_vector<uint8_t>(lower, Shape{tq, tk}), DType::kBool).to(q.device());
    visible = visible.defined() ? logical_and(visible, triangle) : triangle;
  }
  if (visible.defined()) {
    const Tensor hidden = Tensor::full(Shape{}, -INFINITY, scores.dtype(), scores.device());
    scores = where(visible, scores, hidden);
  }
  Tensor probabilities = softmax(scores, -1);
  if (visible.defined()) {
    // A row with nothing visible is all NaN after the softmax: zeros instead.
    const Tensor any = greater(sum(cast(visible, scores.dtype()), -1, /*keepdims=*/true), 0.0);
    probabilities = where(logical_and(any, visible), probabilities,
                          Tensor::zeros(Shape{}, scores.dtype(), scores.device()));
  }
  if (rate > 0) probabilities = dropout(probabilities, rate, *generator);
  return matmul(probabilities, v);
}

/// A bool tensor's elements, one byte each.
const uint8_t* mask_bytes(const Tensor& mask) {
  return reinterpret_cast<const uint8_t*>(mask.data<bool>());
}

/// The fused kernels' geometry for these tensors (the mask's pointers into `mask` and `layout`).
cpu::AttentionGeometry geometry(int64_t batch, const Tensor& q, const Tensor& k, const Tensor& v,
                                const Tensor& mask, const MaskLayout& layout, bool causal,
                                double scale) {
  cpu::AttentionGeometry g;
  g.batch = batch;
  g.tq = q.dim(-2);
  g.tk = k.dim(-2);
  g.d = q.dim(-1);
  g.dv = v.dim(-1);
  g.scale = scale;
  g.causal = causal;
  if (mask.defined()) {
    g.mask = mask_bytes(mask);
    g.mask_offsets = layout.offsets.data();
    g.mask_row_stride = layout.row_stride;
    g.mask_col_stride = layout.col_stride;
  }
  return g;
}

}  // namespace

Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                    const AttentionOptions& options) {
  const Device device = common_device(kOp, {&q, &k, &v});
  TANDEM_CHECK(q.rank() >= 2 && k.rank() == q.rank() && v.rank() == q.rank(), kOp,
               ": needs q [..., Tq, D], k [..., Tk, D] and v [..., Tk, Dv] of one rank (2 or "
               "more), got shapes ",
               q.shape(), ", ", k.shape(), " and ", v.shape());
  const std::vector<int64_t> lead(q.shape().dims().begin(), q.shape().dims().end() - 2);
  const Shape batch(lead);
  for (const Tensor* x : {&k, &v})
    TANDEM_CHECK(
        std::vector<int64_t>(x->shape().dims().begin(), x->shape().dims().end() - 2) == lead, kOp,
        ": the leading dimensions of q ", q.shape(), ", k ", k.shape(), " and v ", v.shape(),
        " differ");
  TANDEM_CHECK(k.dim(-1) == q.dim(-1), kOp, ": q ", q.shape(), " and k ", k.shape(),
               " have different depths (last dimension)");
  TANDEM_CHECK(v.dim(-2) == k.dim(-2), kOp, ": k ", k.shape(), " and v ", v.shape(),
               " have different numbers of keys (second-to-last dimension)");
  check_floating(kOp, q);
  check_same_dtype(kOp, q, k);
  check_same_dtype(kOp, q, v);
  const double rate = options.dropout_rate;
  TANDEM_CHECK(rate >= 0.0 && rate < 1.0, kOp, ": dropout_rate must be in [0, 1), got ", rate);
  TANDEM_CHECK(rate == 0.0 || options.generator != nullptr, kOp, ": dropout_rate ", rate,
               " needs a generator (options.generator)");
  const int64_t tq = q.dim(-2), tk = k.dim(-2), depth = q.dim(-1);
  const double scale = options.scale.value_or(1.0 / std::sqrt(static_cast<double>(depth)));
  TANDEM_CHECK(std::isfinite(scale), kOp, ": scale ", scale, " is not finite");
  Tensor mask;
  if (options.mask.defined()) {
    common_device(kOp, {&q, &options.mask});
    std::vector<int64_t> full = lead;
    full.push_back(tq);
    full.push_back(tk);
    const Shape target(full);
    bool broadcasts = options.mask.rank() <= target.rank();
    for (int64_t i = 1; broadcasts && i <= options.mask.rank(); ++i)
      broadcasts = options.mask.dim(-i) == 1 || options.mask.dim(-i) == target[-i];
    TANDEM_CHECK(broadcasts, kOp, ": mask of shape ", options.mask.shape(),
                 " does not broadcast to ", target);
    mask = options.mask.dtype() == DType::kBool ? options.mask : cast(options.mask, DType::kBool);
  }

  if (device.is_cuda())
    return composed_attention(q, k, v, mask, options.causal, rate, options.generator, scale);

  std::vector<int64_t> out_dims = lead;
  out_dims.push_back(tq);
  out_dims.push_back(v.dim(-1));
  Tensor out = Tensor::empty(Shape(out_dims), q.dtype(), device);
  const DType lse_dtype = q.dtype() == DType::kFloat64 ? DType::kFloat64 : DType::kFloat32;
  Tensor lse = Tensor::empty(Shape{batch.numel(), tq}, lse_dtype, device);
  const MaskLayout layout = mask.defined() ? mask_layout(mask.shape(), batch) : MaskLayout{};
  cpu::AttentionGeometry g = geometry(batch.numel(), q, k, v, mask, layout, options.causal, scale);
  if (rate > 0) {
    // The blocks ops::dropout reserves for the [..., Tq, Tk] probabilities.
    const int64_t n = g.batch * tq * tk;
    g.dropout_rate = rate;
    g.seed = options.generator->seed();
    g.stream = options.generator->stream();
    g.first_block = options.generator->reserve(static_cast<uint64_t>((n + 3) / 4));
  }
  if (out.numel() > 0 || lse.numel() > 0) {
    dispatch_any_floating(q.dtype(), kOp, [&]<typename T>() {
      using L = std::conditional_t<std::is_same_v<T, double>, double, float>;
      cpu::attention_forward(g, q.data<T>(), k.data<T>(), v.data<T>(), out.data<T>(),
                             lse.data<L>());
    });
  }
  if (tracked(out, {&q, &k, &v}))
    record_op(kOp, {q, k, v}, out, [q, k, v, out, lse, mask, layout, g](const Tensor& grad) {
      cpu::AttentionGeometry gg = g;
      if (mask.defined()) {
        gg.mask = mask_bytes(mask);
        gg.mask_offsets = layout.offsets.data();
      }
      Tensor dq = Tensor::empty(q.shape(), q.dtype(), q.device());
      Tensor dk = Tensor::empty(k.shape(), k.dtype(), k.device());
      Tensor dv = Tensor::empty(v.shape(), v.dtype(), v.device());
      const Tensor g_in = grad.dtype() == q.dtype() ? grad : cast(grad, q.dtype());
      dispatch_any_floating(q.dtype(), kOp, [&]<typename T>() {
        using L = std::conditional_t<std::is_same_v<T, double>, double, float>;
        if (gg.batch > 0)
          cpu::attention_backward(gg, q.data<T>(), k.data<T>(), v.data<T>(), out.data<T>(),
                                  lse.data<L>(), g_in.data<T>(), dq.data<T>(), dk.data<T>(),
                                  dv.data<T>());
      });
      return std::vector<Tensor>{dq, dk, dv};
    });
  return out;
}

}  // namespace tandem::ops
