// optim::Optimizer::apply_gradients(ctx, ...), the replica-context form: the optimizer's own
// header declares it; it lives here because it is where optimizers meet the collectives.
#include "tandem/core/check_numerics.h"
#include "tandem/distribute/replica_context.h"
#include "tandem/optim/optimizer.h"

namespace tandem::optim {

void Optimizer::apply_gradients(ReplicaContext& ctx, const std::vector<Tensor>& gradients,
                                const std::vector<Variable>& variables) {
  check_pairs(gradients, variables);
  // Before the all-reduce, so the replica that produced a NaN or Inf is the one named. Off (the
  // default), this is one flag read: not even the replica's name is built.
  if (check_numerics_enabled())
    check_numerics(gradients, variables,
                   tandem::detail::str_cat("replica ", ctx.replica_id_in_sync_group()));
  if (accumulation_steps_ == 1) {
    // One batched all-reduce (SUM) of every defined gradient: each replica divided its loss by
    // the global batch, so the sum is the global gradient. Every replica then holds the same
    // gradients, clips them identically (clipping happens inside the update, after this
    // reduction) and applies the same update to its own copies of the variables and slots.
    apply_update(ctx.all_reduce(ReduceOp::kSum, gradients), variables);
    return;
  }
  // Micro-steps 1..N-1 only add into this replica's accumulators: no collective. Micro-step N
  // all-reduces the accumulators in one batched call; every replica then divides by N and
  // applies the same update.
  std::vector<Tensor> accumulated;
  if (!accumulate(gradients, variables, accumulated)) return;
  finish_accumulation(ctx.all_reduce(ReduceOp::kSum, accumulated), variables);
}

}  // namespace tandem::optim
