// clip_by_global_norm and global_norm on ops (no host synchronisation).
#include "tandem/optim/clip.h"

#include <algorithm>
#include <cmath>

#include "tandem/core/error.h"
#include "tandem/ops/ops.h"

namespace tandem::optim {

namespace {

/// sum(square(x)) of elements [begin, end) of the flattened `t`, as a [1] tensor of `dtype`.
Tensor squared_term(const Tensor& t, int64_t begin, int64_t end, DType dtype) {
  const Tensor part =
      begin == 0 && end == t.numel()
          ? t
          : t.view_as(Shape{end - begin}, static_cast<size_t>(begin) * dtype_size(t.dtype()));
  Tensor s = ops::sum(ops::square(part));
  if (s.dtype() != dtype) s = ops::cast(s, dtype);
  return ops::reshape(s, Shape{1});
}

/// The terms of elements [begin, end) of the flattened `t`: one per block.
void add_terms(const Tensor& t, int64_t begin, int64_t end, DType dtype,
               std::vector<Tensor>& terms) {
  if (end - begin <= kNormBlock) {
    terms.push_back(squared_term(t, begin, end, dtype));
    return;
  }
  for (int64_t b = begin; b < end; b += kNormBlock)
    terms.push_back(squared_term(t, b, std::min(b + kNormBlock, end), dtype));
}

}  // namespace

Tensor global_norm(const std::vector<Tensor>& tensors) {
  std::vector<Tensor> squared;
  DType dtype = DType::kFloat32;
  Device device = Device::cpu();
  bool any = false;
  for (const Tensor& t : tensors) {
    if (!t.defined()) continue;
    if (!any) {
      dtype = t.dtype();
      device = t.device();
      any = true;
    }
    add_terms(t, 0, t.numel(), dtype, squared);
  }
  if (squared.empty()) return Tensor::scalar(0.0, dtype, device);
  // Keras: sum(stack([sum(square(t)) ...])) then sqrt (its terms are whole gradients).
  return ops::sqrt(ops::sum(squared.size() == 1 ? squared[0] : ops::concat(squared, 0)));
}

namespace {

/// Every defined gradient times clip_norm / max(norm, clip_norm), as Keras computes it.
ClippedGradients scale_to(const std::vector<Tensor>& gradients, Tensor global, double clip_norm) {
  ClippedGradients out;
  out.global_norm = std::move(global);
  const Tensor& norm = out.global_norm;
  const Tensor one = Tensor::scalar(1.0, norm.dtype(), norm.device());
  const Tensor inverse_clip = Tensor::scalar(1.0 / clip_norm, norm.dtype(), norm.device());
  Tensor scale = ops::mul(ops::minimum(ops::div(one, norm), inverse_clip), clip_norm);
  scale = ops::add(scale, ops::sub(norm, norm));  // NaN/Inf norm -> NaN scale
  out.gradients.reserve(gradients.size());
  for (const Tensor& g : gradients) {
    if (!g.defined()) {
      out.gradients.emplace_back();
      continue;
    }
    out.gradients.push_back(
        ops::mul(g, g.dtype() == scale.dtype() ? scale : ops::cast(scale, g.dtype())));
  }
  return out;
}

void check_clip_norm(double clip_norm) {
  TANDEM_CHECK(std::isfinite(clip_norm) && clip_norm > 0.0,
               "clip_by_global_norm: clip_norm must be positive and finite, got ", clip_norm);
}

}  // namespace

ClippedGradients clip_by_global_norm(const std::vector<Tensor>& gradients, double clip_norm) {
  check_clip_norm(clip_norm);
  return scale_to(gradients, global_norm(gradients), clip_norm);
}

ClippedGradients clip_by_global_norm(
    const std::vector<Tensor>& shards, const std::vector<ShardExtent>& extents, double clip_norm,
    const std::function<Tensor(const Tensor&)>& sum_across_replicas, DType dtype, Device device) {
  check_clip_norm(clip_norm);
  TANDEM_CHECK(shards.size() == extents.size(), "clip_by_global_norm: ", shards.size(),
               " shards but ", extents.size(), " extents");
  // global_norm's terms in order: this replica's own, zero for the others'; summed across the
  // replicas, every replica holds global_norm's vector exactly.
  std::vector<Tensor> squared;
  for (size_t k = 0; k < shards.size(); ++k) {
    const ShardExtent& e = extents[k];
    TANDEM_CHECK(e.begin % kNormBlock == 0 && e.begin <= e.end, "clip_by_global_norm: shard ", k,
                 " covers [", e.begin, ", ", e.end, "), not from a block boundary");
    if (e.counted && shards[k].defined()) {
      add_terms(shards[k], 0, e.end - e.begin, dtype, squared);
      continue;
    }
    const int64_t blocks = std::max<int64_t>(1, (e.end - e.begin + kNormBlock - 1) / kNormBlock);
    squared.push_back(Tensor::zeros(Shape{blocks}, dtype, device));
  }
  if (squared.empty()) return scale_to(shards, Tensor::scalar(0.0, dtype, device), clip_norm);
  const Tensor terms =
      sum_across_replicas(squared.size() == 1 ? squared[0] : ops::concat(squared, 0));
  return scale_to(shards, ops::sqrt(ops::sum(terms)), clip_norm);
}

}  // namespace tandem::optim
