// HierarchicalCommunicator: the replicas of every worker of a job, in-process among a worker's
// replicas and through WorkerCollectives (MPI or Gloo) between the workers.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <vector>

#include "tandem/collectives/communicator.h"
#include "tandem/collectives/in_process.h"
#include "tandem/collectives/internal/worker_collectives.h"
#include "tandem/tensor/tensor.h"

namespace tandem::collectives {

/// Global replica g = worker x L + local replica l. all_reduce: the worker's L replicas reduce
/// in-process, local replica 0 all-reduces the result across workers (MPI or Gloo), then broadcasts
/// it locally. broadcast and all_gather go the same way; barrier meets every replica.
/// The flat reduce_scatter takes all_reduce's steps (so it gives the same bits): the worker's
/// replicas reduce the whole buffer in-process into local replica 0's scratch buffer, which
/// reduce-scatters it across the workers (WorkerCollectives::reduce_scatter: the workers' own
/// choice of a true reduce-scatter or an all-reduce), and each replica copies its range from
/// there. The flat all_gather gathers the worker's ranges in-process, the workers' ranges
/// across workers, and broadcasts the other workers' ranges locally.
class HierarchicalCommunicator final : public Communicator {
 public:
  /// `local` is this replica's endpoint of the worker's in-process group (rank l of L).
  HierarchicalCommunicator(std::shared_ptr<WorkerCollectives> world, InProcessCommunicator* local,
                           std::shared_ptr<std::vector<Tensor>> shared);
  int rank() const override;
  int size() const override;
  std::string name() const override { return world_->name() + "+in_process"; }
  /// In process alone, or the workers' transport's.
  bool reduce_scatters_for_real() const override {
    return world_->size() == 1 || world_->reduce_scatters_for_real();
  }
  /// The workers' transport's, when this worker has one replica (the in-process step spins).
  bool waits_without_polling() const override {
    return local_->size() == 1 && world_->waits_without_polling();
  }

 protected:
  std::shared_ptr<Work> all_reduce_impl(const std::vector<Tensor>& inputs,
                                        const std::vector<Tensor>& outputs, ReduceOp op) override;
  std::shared_ptr<Work> all_gather_impl(std::vector<Tensor>& outputs, const Tensor& input) override;
  std::shared_ptr<Work> broadcast_impl(std::vector<Tensor>& tensors, int root) override;
  std::shared_ptr<Work> reduce_scatter_ranges_impl(const Tensor& input, Tensor& output,
                                                   std::span<const int64_t> offsets,
                                                   ReduceOp op) override;
  std::shared_ptr<Work> all_gather_ranges_impl(Tensor& buffer,
                                               std::span<const int64_t> offsets) override;
  std::shared_ptr<Work> barrier_impl() override;

 private:
  std::shared_ptr<WorkerCollectives> world_;
  InProcessCommunicator* local_;
  // The worker's gathered pieces (or reduced buffer), filled by local replica 0 for the others
  // to copy.
  std::shared_ptr<std::vector<Tensor>> shared_;
  // Local replica 0's: the worker's sum of a flat reduce_scatter's input, reused across calls.
  Tensor scratch_;
};

}  // namespace tandem::collectives
