// HierarchicalCommunicator: the replicas of every worker of a job, in-process among a worker's
// replicas and through WorkerCollectives (MPI or Gloo) between the workers.
#pragma once

#include <memory>
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
class HierarchicalCommunicator final : public Communicator {
 public:
  /// `local` is this replica's endpoint of the worker's in-process group (rank l of L).
  HierarchicalCommunicator(std::shared_ptr<WorkerCollectives> world, InProcessCommunicator* local,
                           std::shared_ptr<std::vector<Tensor>> shared);
  int rank() const override;
  int size() const override;
  std::string name() const override { return world_->name() + "+in_process"; }
  /// The workers' transport's, when this worker has one replica (the in-process step spins).
  bool waits_without_polling() const override {
    return local_->size() == 1 && world_->waits_without_polling();
  }

 protected:
  std::shared_ptr<Work> all_reduce_impl(const std::vector<Tensor>& inputs,
                                        const std::vector<Tensor>& outputs, ReduceOp op) override;
  std::shared_ptr<Work> all_gather_impl(std::vector<Tensor>& outputs, const Tensor& input) override;
  std::shared_ptr<Work> broadcast_impl(std::vector<Tensor>& tensors, int root) override;
  std::shared_ptr<Work> barrier_impl() override;

 private:
  std::shared_ptr<WorkerCollectives> world_;
  InProcessCommunicator* local_;
  // The worker's gathered pieces, filled by local replica 0 for the others to copy.
  std::shared_ptr<std::vector<Tensor>> shared_;
};

}  // namespace tandem::collectives
