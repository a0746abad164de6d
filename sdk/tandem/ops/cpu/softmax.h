// CPU softmax, log-softmax and the fused sparse softmax cross-entropy, all stabilised by
// subtracting the maximum before exponentiating.
#pragma once

#include <cstdint>

namespace tandem::ops::cpu {

/// Softmax (or log-softmax when `log`) over n for x viewed as [outer, n, inner]; n >= 1.
template <typename T>
void softmax(const T* x, int64_t outer, int64_t n, int64_t inner, bool log, T* y);

/// loss[r] = logsumexp(logits[r, :]) - logits[r, labels[r]] for r < batch; labels must lie in
/// [0, classes) (checked by the caller).
template <typename T, typename L>
void sparse_softmax_cross_entropy(const T* logits, const L* labels, int64_t batch, int64_t classes,
                                  T* loss);

/// Its backward, fused: dlogits[r, k] = grad_loss[r] * (softmax(logits[r, :])[k] - (k == label)).
template <typename T, typename L>
void sparse_softmax_cross_entropy_backward(const T* logits, const L* labels, const T* grad_loss,
                                           int64_t batch, int64_t classes, T* dlogits);

}  // namespace tandem::ops::cpu
