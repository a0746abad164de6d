// HierarchicalCommunicator: in-process among a worker's replicas, then across the workers
// (WorkerCollectives: MPI or Gloo), then back to the worker's replicas.
#include "tandem/collectives/internal/hierarchical.h"

#include "tandem/collectives/internal/tensor_bytes.h"

namespace tandem::collectives {

HierarchicalCommunicator::HierarchicalCommunicator(std::shared_ptr<WorkerCollectives> world,
                                                   InProcessCommunicator* local,
                                                   std::shared_ptr<std::vector<Tensor>> shared)
    : world_(std::move(world)), local_(local), shared_(std::move(shared)) {}

int HierarchicalCommunicator::rank() const {
  return world_->rank() * local_->size() + local_->rank();
}

int HierarchicalCommunicator::size() const { return world_->size() * local_->size(); }

std::shared_ptr<Work> HierarchicalCommunicator::all_reduce_impl(const std::vector<Tensor>& inputs,
                                                                const std::vector<Tensor>& outputs,
                                                                ReduceOp op) {
  const ReduceOp partial = op == ReduceOp::kMean ? ReduceOp::kSum : op;
  std::vector<Tensor>& out = const_cast<std::vector<Tensor>&>(outputs);
  // 1. Among this worker's replicas (in place when inputs and outputs are the same list).
  if (&inputs == &outputs) {
    local_->all_reduce(out, partial)->wait();
  } else {
    local_->all_reduce(inputs, out, partial)->wait();
  }
  // 2. Across workers, by local replica 0; 3. its result to the others.
  if (world_->size() > 1) {
    if (local_->rank() == 0) {
      try {
        world_->all_reduce(out, partial, "all_reduce");
      } catch (const std::exception& e) {
        local_->group().abort(e.what());  // the local peers raise too, at once
        throw;
      }
    }
    local_->broadcast(out, 0)->wait();
  }
  if (op == ReduceOp::kMean)
    for (Tensor& t : out) divide_elements(t, size());
  return completed_work();
}

std::shared_ptr<Work> HierarchicalCommunicator::broadcast_impl(std::vector<Tensor>& tensors,
                                                               int root) {
  TANDEM_CHECK(root >= 0 && root < size(), "broadcast: root ", root, " is outside [0, ", size(),
               ")");
  const int root_worker = root / local_->size();
  const int root_local = root % local_->size();
  if (world_->rank() == root_worker) local_->broadcast(tensors, root_local)->wait();
  if (world_->size() > 1) {
    if (local_->rank() == 0) {
      try {
        world_->broadcast(tensors, root_worker, "broadcast");
      } catch (const std::exception& e) {
        local_->group().abort(e.what());
        throw;
      }
    }
    local_->broadcast(tensors, 0)->wait();
  }
  return completed_work();
}

std::shared_ptr<Work> HierarchicalCommunicator::all_gather_impl(std::vector<Tensor>& outputs,
                                                                const Tensor& input) {
  std::vector<Tensor> local_pieces;
  local_->all_gather(local_pieces, input.to(Device::cpu()))->wait();
  if (world_->size() == 1) {
    outputs = std::move(local_pieces);
    return completed_work();
  }
  if (local_->rank() == 0) {
    try {
      std::vector<Tensor> all;
      for (const std::vector<char>& piece :
           world_->all_gather(tensors_to_bytes(local_pieces), "all_gather")) {
        std::vector<Tensor> tensors = tensors_from_bytes(piece, "all_gather");
        all.insert(all.end(), tensors.begin(), tensors.end());
      }
      *shared_ = std::move(all);
    } catch (const std::exception& e) {
      local_->group().abort(e.what());
      throw;
    }
  }
  local_->rendezvous("all_gather (across workers)");  // replica 0 filled the shared list
  outputs.clear();
  for (const Tensor& t : *shared_) outputs.push_back(t.clone());
  local_->rendezvous("all_gather (copied)");  // nobody refills it before everyone copied
  return completed_work();
}

std::shared_ptr<Work> HierarchicalCommunicator::barrier_impl() {
  local_->barrier()->wait();
  if (world_->size() > 1) {
    if (local_->rank() == 0) world_->barrier("barrier");
    local_->barrier()->wait();
  }
  return completed_work();
}

}  // namespace tandem::collectives
