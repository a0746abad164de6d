// Loss scaling for data-parallel training (tf.nn.compute_average_loss and
// tf.nn.scale_regularization_loss): each replica divides by the GLOBAL batch, so that the SUM
// of the replicas' gradients is the gradient of the mean loss over the global batch.
#pragma once

#include <cstdint>
#include <optional>

#include "tandem/tensor/tensor.h"

namespace tandem {

/// sum(per_example_loss * sample_weight) / global_batch_size, a differentiable scalar.
/// `per_example_loss` has a batch axis first (a scalar raises: pass the losses of
/// Reduction::kNone). `sample_weight` (optional) broadcasts against it. Without
/// global_batch_size, the divisor is this replica's batch (dim 0) x num_replicas_in_sync of
/// the job (every worker's replicas); that form raises in cross-replica context (a strategy's
/// scope open, outside strategy.run), as TensorFlow does, and outside any strategy counts one
/// replica. A divisor of 0 gives 0 (an empty global batch contributes nothing). A bfloat16 or
/// float16 loss (and sample_weight) is summed in float32 and the result is float32, as Keras's
/// losses compute in float32. Inside strategy.run, a global_batch_size smaller than the
/// examples the step's distributed dataset delivered over every replica (the loss and the
/// gradients would be scaled up) is warned once, naming both numbers.
Tensor compute_average_loss(const Tensor& per_example_loss,
                            std::optional<int64_t> global_batch_size = std::nullopt,
                            const Tensor& sample_weight = Tensor());

/// sum(regularization_loss) / num_replicas_in_sync, a differentiable scalar: added on every
/// replica, the replicas' gradients then SUM to the gradient of the loss counted once.
/// num_replicas_in_sync is the job's; cross-replica context raises, as above.
Tensor scale_regularization_loss(const Tensor& regularization_loss);

}  // namespace tandem
