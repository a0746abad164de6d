// clip_by_global_norm and global_norm on ops (no host synchronisation).
#include "tandem/optim/clip.h"

#include <cmath>

#include "tandem/core/error.h"
#include "tandem/ops/ops.h"

namespace tandem::optim {

Tensor global_norm(const std::vector<Tensor>& tensors) {
  std::vector<Tensor> squared;
  DType dtype = DType::kFloat32;
  Device device = Device::cpu();
  for (const Tensor& t : tensors) {
    if (!t.defined()) continue;
    if (squared.empty()) {
      dtype = t.dtype();
      device = t.device();
    }
    Tensor s = ops::sum(ops::square(t));
    if (s.dtype() != dtype) s = ops::cast(s, dtype);
    squared.push_back(ops::reshape(s, Shape{1}));
  }
  if (squared.empty()) return Tensor::scalar(0.0, dtype, device);
  // Keras: sum(stack([sum(square(t)) ...])) then sqrt.
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
    const std::vector<Tensor>& gradients, const std::vector<bool>& present, double clip_norm,
    const std::function<Tensor(const Tensor&)>& sum_across_replicas, DType dtype, Device device) {
  check_clip_norm(clip_norm);
  TANDEM_CHECK(gradients.size() == present.size(), "clip_by_global_norm: ", gradients.size(),
               " gradients but ", present.size(), " presence flags");
  // global_norm's terms, one per present gradient in order: this replica's own, zero for the
  // others'; summed across the replicas, every replica holds global_norm's vector exactly.
  std::vector<Tensor> squared;
  for (size_t i = 0; i < gradients.size(); ++i) {
    if (!present[i]) continue;
    if (!gradients[i].defined()) {
      squared.push_back(Tensor::zeros(Shape{1}, dtype, device));
      continue;
    }
    Tensor s = ops::sum(ops::square(gradients[i]));
    if (s.dtype() != dtype) s = ops::cast(s, dtype);
    squared.push_back(ops::reshape(s, Shape{1}));
  }
  if (squared.empty()) return scale_to(gradients, Tensor::scalar(0.0, dtype, device), clip_norm);
  const Tensor terms =
      sum_across_replicas(squared.size() == 1 ? squared[0] : ops::concat(squared, 0));
  return scale_to(gradients, ops::sqrt(ops::sum(terms)), clip_norm);
}

}  // namespace tandem::optim
