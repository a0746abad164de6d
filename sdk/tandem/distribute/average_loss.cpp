// compute_average_loss and scale_regularization_loss, built from ops so gradients flow.
#include "tandem/distribute/average_loss.h"

#include <mutex>
#include <set>
#include <utility>

#include "tandem/autograd/variable.h"
#include "tandem/core/check_numerics.h"
#include "tandem/core/logging.h"
#include "tandem/distribute/internal/state.h"
#include "tandem/distribute/strategy.h"
#include "tandem/ops/ops.h"

namespace tandem {
namespace {

/// num_replicas_in_sync of the job for a loss computed on the calling thread: inside
/// strategy.run, every worker's replicas; outside any strategy, 1 (the default strategy). In
/// cross-replica context of a strategy (its scope open, outside run) the count is ambiguous, and
/// TensorFlow raises there too.
int replicas_in_sync(const char* function, const char* remedy) {
  if (current_replica_context() != nullptr) return current_replica_binding().num_replicas_in_sync;
  const Strategy* strategy = detail::current_scope_strategy();
  TANDEM_CHECK(strategy == nullptr, function, " was called in cross-replica context (the scope of ",
               strategy->name(), " with ", strategy->num_replicas_in_sync(),
               " replicas is open, outside strategy.run); call it inside strategy.run, where it "
               "divides by the job's num_replicas_in_sync, or ",
               remedy);
  return 1;
}

/// A global batch smaller than the examples the step's distributed dataset delivered scales
/// the loss and the gradients up by delivered / given, silently: warned once per pair of
/// numbers. (Larger is legitimate: a short last batch, gradient accumulation.)
void report_batch_contradiction(int64_t given, int64_t delivered) {
  if (delivered <= 0 || given >= delivered) return;
  static std::mutex mutex;
  static std::set<std::pair<int64_t, int64_t>> reported;
  {
    const std::lock_guard<std::mutex> lock(mutex);
    if (!reported.insert({given, delivered}).second) return;
  }
  TANDEM_LOG_WARNING("compute_average_loss: global_batch_size ", given,
                     " but the distributed "
                     "dataset delivered ",
                     delivered,
                     " examples this step over every replica: "
                     "the loss and the gradients are ",
                     static_cast<double>(delivered) / static_cast<double>(given),
                     "x their mean over the batch. Pass the global "
                     "batch the dataset was batched with (",
                     delivered,
                     "), or leave "
                     "global_batch_size out to divide by this replica's batch x "
                     "num_replicas_in_sync");
}

}  // namespace

Tensor compute_average_loss(const Tensor& per_example_loss,
                            std::optional<int64_t> global_batch_size, const Tensor& sample_weight) {
  TANDEM_CHECK(per_example_loss.defined(), "compute_average_loss: per_example_loss is undefined");
  TANDEM_CHECK(per_example_loss.rank() >= 1,
               "compute_average_loss: per_example_loss must have a batch axis (rank >= 1), got a "
               "scalar; pass the per-example losses (a loss with Reduction::kNone), not their "
               "mean");
  TANDEM_CHECK(!global_batch_size || *global_batch_size >= 0,
               "compute_average_loss: global_batch_size must be >= 0, got ", *global_batch_size);
  // What every worker must pass alike (the optimizer's first update compares it across workers).
  if (global_batch_size && current_replica_context() != nullptr) {
    detail::set_last_global_batch_size(*global_batch_size);
    report_batch_contradiction(*global_batch_size, detail::step_global_batch_size());
  }
  // 16-bit losses (a loss written by hand under a mixed policy) are averaged in float32, as
  // Keras's losses compute in float32: a bfloat16 sum of a batch would lose the small terms.
  const auto widened = [](const Tensor& t) {
    return t.defined() && is_half(t.dtype()) ? ops::cast(t, DType::kFloat32) : t;
  };
  const Tensor weighted = sample_weight.defined()
                              ? ops::mul(widened(per_example_loss), widened(sample_weight))
                              : widened(per_example_loss);
  const int64_t divisor =
      global_batch_size ? *global_batch_size
                        : per_example_loss.dim(0) *
                              replicas_in_sync("compute_average_loss without a global_batch_size",
                                               "pass global_batch_size");
  const Tensor total = ops::sum(weighted);
  // Divisor 0 (an empty global batch): 0, still connected to the tape so gradients are zeros.
  const Tensor loss = divisor == 0 ? ops::mul(total, 0.0) : total / static_cast<double>(divisor);
  if (check_numerics_enabled()) {
    const ops::NonFinite found = ops::count_non_finite(weighted);
    const ops::NonFinite in_loss = ops::count_non_finite(loss);
    TANDEM_CHECK(
        found.total() == 0 && in_loss.total() == 0,
        "TANDEM_CHECK_NUMERICS: non-finite loss in compute_average_loss",
        current_replica_context()
            ? detail::str_cat(" on replica ", current_replica_context()->replica_id_in_sync_group(),
                              " in strategy.run #", detail::current_run_index())
            : std::string(),
        " (the per-example losses", sample_weight.defined() ? " x sample_weight" : "", " hold ",
        found.nan, " NaN and ", found.inf, " Inf of ", weighted.numel(), ")");
  }
  return loss;
}

Tensor scale_regularization_loss(const Tensor& regularization_loss) {
  TANDEM_CHECK(regularization_loss.defined(),
               "scale_regularization_loss: the regularization loss is undefined");
  const int replicas =
      replicas_in_sync("scale_regularization_loss",
                       "divide the regularization loss by num_replicas_in_sync yourself");
  return ops::sum(regularization_loss) / static_cast<double>(replicas);
}

}  // namespace tandem
