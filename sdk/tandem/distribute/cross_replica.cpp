// Strategy's cross-replica calls: reduce and gather of per-replica values (this worker's
// replicas in a fixed order, then across workers), the cross-worker reduction and broadcast
// that metrics and checkpoints use, and the end-of-data agreement of distributed datasets.
#include <cstring>

#include "tandem/distribute/internal/host_reduce.h"
#include "tandem/distribute/internal/strategy_impl.h"
#include "tandem/ops/ops.h"

namespace tandem {

namespace detail {
void check_cross_replica(const char* what) {
  TANDEM_CHECK(current_replica_context() == nullptr, "strategy.", what,
               " is a cross-replica call: use it outside strategy.run (inside a replica function, "
               "use ctx.all_reduce or ctx.all_gather)");
}
}  // namespace detail

Tensor Strategy::reduce(ReduceOp op, const PerReplica<Tensor>& value,
                        std::optional<int64_t> axis) const {
  detail::check_cross_replica("reduce");
  impl_->replicas->check_usable("reduce");
  TANDEM_CHECK(value.size() == static_cast<size_t>(impl_->num_replicas()), name(),
               ".reduce: the PerReplica holds ", value.size(), " values but the strategy has ",
               impl_->num_replicas(), " replicas");
  if (!value.values().empty() && value.values()[0].defined() &&
      is_half(value.values()[0].dtype())) {
    // 16-bit values (a loss under a mixed policy) add up in float32 and are rounded once.
    const DType half = value.values()[0].dtype();
    std::vector<Tensor> widened;
    for (const Tensor& v : value.values())
      widened.push_back(v.defined() && v.dtype() == half ? ops::cast(v, DType::kFloat32) : v);
    return ops::cast(reduce(op, PerReplica<Tensor>(std::move(widened)), axis), half);
  }
  const bool workers = impl_->num_workers() > 1;
  if (!axis && !workers) return detail::combine_elementwise(value.values(), op, "strategy.reduce");
  if (!axis) {
    // Several workers: this worker's SUM (or MAX), then across workers; kMean divides by every
    // replica of the job.
    const ReduceOp partial = op == ReduceOp::kMax ? ReduceOp::kMax : ReduceOp::kSum;
    Tensor total = detail::combine_elementwise(value.values(), partial, "strategy.reduce")
                       .to(Device::cpu())
                       .clone();
    across_workers(total, partial);
    if (op != ReduceOp::kMean) return total;
    return detail::divide_by(total, static_cast<double>(num_replicas_in_sync()));
  }

  // With an axis: reduce each replica's value over it, combine, and for kMean divide by the
  // total length of that axis over all replicas (not by the replica count).
  const ReduceOp partial_op = op == ReduceOp::kMax ? ReduceOp::kMax : ReduceOp::kSum;
  std::vector<Tensor> partials;
  double count = 0;
  for (const Tensor& v : value.values()) {
    TANDEM_CHECK(v.defined() && v.rank() > 0, "strategy.reduce: axis ", *axis,
                 " given, but a replica's value is ", v.defined() ? "a scalar" : "undefined");
    const int64_t length = v.dim(*axis);
    count += static_cast<double>(length);
    if (op == ReduceOp::kMax && length == 0) continue;  // an empty replica adds nothing
    partials.push_back(detail::reduce_over_axis(v, *axis, partial_op, "strategy.reduce"));
  }
  TANDEM_CHECK(!partials.empty(), "strategy.reduce(max, axis ", *axis,
               "): every replica's value is empty along that axis");
  Tensor total = detail::combine_elementwise(partials, partial_op, "strategy.reduce");
  if (workers) {
    total = total.to(Device::cpu()).clone();
    across_workers(total, partial_op);
    Tensor counted = Tensor::scalar(count, DType::kFloat64);
    across_workers(counted, ReduceOp::kSum);
    count = counted.item<double>();
  }
  if (op != ReduceOp::kMean) return total;
  TANDEM_CHECK(count > 0 || is_floating(total.dtype()), "strategy.reduce(mean, axis ", *axis,
               "): no element along the axis on any replica, and ", total.dtype(), " has no NaN");
  return detail::divide_by(total, count);
}

Tensor Strategy::reduce(ReduceOp op, const Tensor& value, std::optional<int64_t> axis) const {
  detail::check_cross_replica("reduce");
  impl_->replicas->check_usable("reduce");
  const int n = impl_->num_replicas();
  TANDEM_CHECK(op != ReduceOp::kSum || n == 1, name(),
               ".reduce(sum, value): the value is a plain Tensor, not a PerReplica, and the "
               "strategy has ",
               n,
               " replicas. A non-distributed value is the same on every "
               "replica, so it has no per-replica parts to add (summing would count it ",
               n,
               " times). Pass the PerReplica<Tensor> that strategy.run returned, or reduce with "
               "ReduceOp::kMean");
  TANDEM_CHECK(value.defined(), name(), ".reduce: the value is undefined");
  if (!axis) return value;
  if (is_half(value.dtype()))  // added up in float32, rounded once
    return ops::cast(reduce(op, ops::cast(value, DType::kFloat32), axis), value.dtype());
  Tensor total = detail::reduce_over_axis(
      value, *axis, op == ReduceOp::kMax ? ReduceOp::kMax : ReduceOp::kSum, "strategy.reduce");
  if (op != ReduceOp::kMean) return total;
  return detail::divide_by(total, static_cast<double>(value.dim(*axis)));
}

Tensor Strategy::reduce(ReduceOp op, const Variable& variable, std::optional<int64_t> axis) const {
  TANDEM_CHECK(variable.defined(), name(), ".reduce: the variable is undefined");
  if (variable.num_copies() == 1 && impl_->num_replicas() > 1)
    return reduce(op, variable.value_untracked(), axis);
  TANDEM_CHECK(variable.num_copies() == impl_->num_replicas(), name(), ".reduce: variable \"",
               variable.name(), "\" has ", variable.num_copies(), " copies but the strategy has ",
               impl_->num_replicas(), " replicas (was it made in another strategy's scope?)");
  std::vector<Tensor> copies;
  for (int r = 0; r < variable.num_copies(); ++r) copies.push_back(variable.copy(r));
  return reduce(op, PerReplica<Tensor>(std::move(copies)), axis);
}

void Strategy::across_workers(Tensor& value, ReduceOp op) const {
  if (impl_->num_workers() == 1) return;
  std::vector<Tensor> values = {value};
  impl_->collectives->workers()->all_reduce(values, op, "strategy.reduce");
}

void Strategy::install_end_of_data_agreement(data::DistributedDataset& dataset) const {
  if (impl_->num_workers() == 1) return;
  // One small all-reduce per step (MAX of "I have a batch"), on the thread iterating.
  const Strategy* self = this;
  dataset.set_end_of_data_agreement([self](bool mine) {
    Tensor flag = Tensor::scalar(mine ? 1.0 : 0.0, DType::kInt32);
    self->across_workers(flag, ReduceOp::kMax);
    return flag.item<int32_t>() > 0;
  });
}

Tensor Strategy::reduce_across_workers(ReduceOp op, const Tensor& value) const {
  detail::check_cross_replica("reduce_across_workers");
  impl_->replicas->check_usable("reduce_across_workers");
  TANDEM_CHECK(value.defined(), name(), ".reduce_across_workers: the value is undefined");
  if (impl_->num_workers() == 1) return value;
  Tensor total = value.to(Device::cpu()).clone();
  across_workers(total, op);
  return total;
}

Tensor Strategy::gather(const PerReplica<Tensor>& value, int64_t axis) const {
  detail::check_cross_replica("gather");
  impl_->replicas->check_usable("gather");

  TANDEM_CHECK(value.size() == static_cast<size_t>(impl_->num_replicas()), name(),
               ".gather: the PerReplica holds ", value.size(), " values but the strategy has ",
               impl_->num_replicas(), " replicas");
  Tensor mine = detail::concat_along(value.values(), axis, "strategy.gather");
  if (impl_->num_workers() == 1) return mine;
  // Every worker's part, in worker order (so in global replica order).
  std::vector<Tensor> parts;
  for (std::vector<Tensor>& worker : impl_->collectives->workers()->all_gather_tensors(
           {mine.to(Device::cpu())}, "strategy.gather"))
    parts.push_back(std::move(worker.at(0)));
  return detail::concat_along(parts, axis, "strategy.gather");
}

}  // namespace tandem
