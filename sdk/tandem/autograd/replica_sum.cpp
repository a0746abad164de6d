// replica_sum (replica_sum.h): the thread's installed all-reduce, recorded so that the backward
// pass sums the gradients over the replicas too.
#include "tandem/autograd/replica_sum.h"

#include <utility>

#include "tandem/ops/recording.h"

namespace tandem::autograd {

namespace {
thread_local ReplicaSumFn t_replica_sum;
}  // namespace

ReplicaSumFn set_replica_sum(ReplicaSumFn sum) {
  ReplicaSumFn previous = std::move(t_replica_sum);
  t_replica_sum = std::move(sum);
  return previous;
}

std::vector<Tensor> replica_sum(const std::vector<Tensor>& xs) {
  if (!t_replica_sum) return xs;
  std::vector<Tensor> sums;
  {
    const ops::NoRecordGuard no_record;
    sums = t_replica_sum(xs);
  }
  // One replica: the all-reduce hands the tensors back, and the sum is the identity.
  bool identity = true;
  for (size_t i = 0; i < xs.size(); ++i) identity = identity && sums[i].id() == xs[i].id();
  if (identity) return sums;
  if (ops::needs_recording(xs)) {
    ops::record("replica_sum", xs, sums, [xs](const std::vector<Tensor>& grads) {
      // Every replica sums the same list: a gradient nothing here depends on is zeros.
      std::vector<Tensor> filled(grads.size());
      for (size_t i = 0; i < grads.size(); ++i)
        filled[i] = grads[i].defined() ? grads[i] : Tensor::zeros_like(xs[i]);
      const ReplicaSumFn& sum = t_replica_sum;
      return sum ? sum(filled) : filled;
    });
  }
  return sums;
}

}  // namespace tandem::autograd
