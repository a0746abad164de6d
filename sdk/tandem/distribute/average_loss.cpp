// compute_average_loss and scale_regularization_loss, built from ops so gradients flow.
#include "tandem/distribute/average_loss.h"

#include "tandem/autograd/variable.h"
#include "tandem/ops/ops.h"

namespace tandem {

Tensor compute_average_loss(const Tensor& per_example_loss,
                            std::optional<int64_t> global_batch_size, const Tensor& sample_weight) {
  TANDEM_CHECK(per_example_loss.defined(), "compute_average_loss: per_example_loss is undefined");
  TANDEM_CHECK(per_example_loss.rank() >= 1,
               "compute_average_loss: per_example_loss must have a batch axis (rank >= 1), got a "
               "scalar; pass the per-example losses (a loss with Reduction::kNone), not their "
               "mean");
  TANDEM_CHECK(!global_batch_size || *global_batch_size >= 0,
               "compute_average_loss: global_batch_size must be >= 0, got ", *global_batch_size);
  const Tensor weighted =
      sample_weight.defined() ? ops::mul(per_example_loss, sample_weight) : per_example_loss;
  const int64_t divisor = global_batch_size
                              ? *global_batch_size
                              : per_example_loss.dim(0) * current_replica_binding().num_replicas;
  const Tensor total = ops::sum(weighted);
  // Divisor 0 (an empty global batch): 0, still connected to the tape so gradients are zeros.
  if (divisor == 0) return ops::mul(total, 0.0);
  return total / static_cast<double>(divisor);
}

Tensor scale_regularization_loss(const Tensor& regularization_loss) {
  TANDEM_CHECK(regularization_loss.defined(),
               "scale_regularization_loss: the regularization loss is undefined");
  const int replicas = current_replica_binding().num_replicas;
  return ops::sum(regularization_loss) / static_cast<double>(replicas);
}

}  // namespace tandem
