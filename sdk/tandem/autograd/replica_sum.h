// replica_sum: a sum over every replica in sync that gradients flow through, for layers whose
// forward pass combines the replicas (synchronized batch norm). Strategies install the calling
// replica's all-reduce on its thread; layers below the strategies call replica_sum.
#pragma once

#include <functional>
#include <vector>

#include "tandem/tensor/tensor.h"

namespace tandem::autograd {

/// Sums each tensor over every replica in sync (one batched all-reduce), as the calling
/// replica's strategy does it.
using ReplicaSumFn = std::function<std::vector<Tensor>(const std::vector<Tensor>&)>;
/// Installs `sum` for the calling thread (strategies do, on replica threads) and returns the
/// previous one; an empty function: no replicas to sum over.
ReplicaSumFn set_replica_sum(ReplicaSumFn sum);

/// The sum over every replica of each of `xs` (every replica must call it with tensors of the
/// same shapes, in the same order, as with any collective); `xs` themselves where no strategy
/// runs the calling thread. Recorded on active tapes: the gradient of each input is the sum
/// over the replicas of the gradients of its output (the backward pass makes the same
/// collective call on every replica).
std::vector<Tensor> replica_sum(const std::vector<Tensor>& xs);

}  // namespace tandem::autograd
