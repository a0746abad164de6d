// HierarchicalCommunicator: in-process among a worker's replicas, then across the workers
// (WorkerCollectives: MPI or Gloo), then back to the worker's replicas.
#include "tandem/collectives/internal/hierarchical.h"

#include <algorithm>

#include "tandem/collectives/internal/flat_ranges.h"
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

namespace {
/// Raises naming the call unless `buffer` is a CPU tensor that `offsets` cut into `ranks` ranges.
void check_flat(const char* label, const Tensor& buffer, std::span<const int64_t> offsets,
                int ranks, const char* what, bool reduce) {
  const std::string problem = flat_ranges_problem(buffer, offsets, ranks, what, reduce);
  TANDEM_CHECK(problem.empty(), label, ": ", problem);
  TANDEM_CHECK(buffer.device().is_cpu(), label, ": ", what,
               " must be a CPU tensor across workers, not on ", buffer.device());
}
}  // namespace

std::shared_ptr<Work> HierarchicalCommunicator::reduce_scatter_ranges_impl(
    const Tensor& input, Tensor& output, std::span<const int64_t> offsets, ReduceOp op) {
  check_flat("reduce_scatter", input, offsets, size(), "the input", /*reduce=*/true);
  const auto g = static_cast<size_t>(rank());
  if (!output.defined()) output = Tensor::empty({offsets[g + 1] - offsets[g]}, input.dtype());
  const std::string output_problem = flat_output_problem(input, output, offsets, rank());
  TANDEM_CHECK(output_problem.empty(), "reduce_scatter: ", output_problem);
  // all_reduce's steps: sums (kMean divides once at the end), in-process, then across workers.
  const ReduceOp partial = op == ReduceOp::kMean ? ReduceOp::kSum : op;
  if (world_->size() == 1) {
    local_->reduce_scatter(input, output, offsets, partial)->wait();
  } else if (local_->size() == 1) {
    // One replica per worker: its input is the worker's sum; its range comes straight out.
    try {
      world_->reduce_scatter(input, output, offsets, partial, "reduce_scatter");
    } catch (const std::exception& e) {
      local_->group().abort(e.what());
      throw;
    }
  } else {
    // 1. The worker's sum of the whole buffer into local replica 0's scratch (every local
    // replica reduces a share of it); the others' ranges are empty.
    const int locals = local_->size();
    const int64_t n = input.numel();
    std::vector<int64_t> to_first(static_cast<size_t>(locals) + 1, n);
    to_first[0] = 0;
    Tensor mine;
    if (local_->rank() == 0) {
      if (!scratch_.defined() || scratch_.numel() != n || scratch_.dtype() != input.dtype())
        scratch_ = Tensor::empty({n}, input.dtype());
      mine = scratch_;
    }
    local_->reduce_scatter(input, mine, to_first, partial)->wait();
    // 2. Across workers, by local replica 0: its worker's range of the scratch is reduced.
    if (local_->rank() == 0) {
      try {
        world_->reduce_scatter(scratch_, group_offsets(offsets, locals), partial, "reduce_scatter");
      } catch (const std::exception& e) {
        local_->group().abort(e.what());  // the local peers raise too, at once
        throw;
      }
      *shared_ = {scratch_,
                  Tensor::from_vector(std::vector<int64_t>(offsets.begin(), offsets.end()))};
    }
    local_->rendezvous("reduce_scatter (across workers)");  // replica 0 filled the shared list
    // 3. Each replica copies its range (when it passed replica 0's offsets: the workers
    // compared replica 0's; a local replica whose offsets differ raises below, after the
    // others are done with the shared list).
    const std::vector<int64_t> first = (*shared_)[1].to_vector<int64_t>();
    const bool same = std::ranges::equal(first, offsets);
    if (same) {
      const size_t element = dtype_size(input.dtype());
      output.copy_from(
          (*shared_)[0].view_as({output.numel()}, static_cast<size_t>(offsets[g]) * element));
    }
    local_->rendezvous("reduce_scatter (copied)");  // nobody refills it before everyone copied
    TANDEM_CHECK(same, "reduce_scatter: replica ", rank(), " passed offsets ",
                 describe_offsets(offsets), " but replica ", world_->rank() * locals,
                 " of its worker passed ", describe_offsets(first),
                 "; every replica must pass the same offsets");
  }
  if (op == ReduceOp::kMean) divide_elements(output, size());
  return completed_work();
}

std::shared_ptr<Work> HierarchicalCommunicator::all_gather_ranges_impl(
    Tensor& buffer, std::span<const int64_t> offsets) {
  check_flat("all_gather", buffer, offsets, size(), "the buffer", /*reduce=*/false);
  if (world_->size() == 1) return local_->all_gather(buffer, offsets);
  // 1. The ranges of this worker's replicas, in-process, on the view of the worker's range.
  const int locals = local_->size();
  const auto first = static_cast<size_t>(world_->rank() * locals);
  const int64_t lo = offsets[first];
  const int64_t hi = offsets[first + static_cast<size_t>(locals)];
  const size_t element = dtype_size(buffer.dtype());
  std::vector<int64_t> local_offsets(offsets.begin() + static_cast<ptrdiff_t>(first),
                                     offsets.begin() + static_cast<ptrdiff_t>(first) + locals + 1);
  for (int64_t& offset : local_offsets) offset -= lo;
  Tensor worker_range = buffer.view_as({hi - lo}, static_cast<size_t>(lo) * element);
  local_->all_gather(worker_range, local_offsets)->wait();
  // 2. Across workers, by local replica 0; 3. the other workers' ranges to the others.
  if (local_->rank() == 0) {
    try {
      world_->all_gather(buffer, group_offsets(offsets, locals), "all_gather");
    } catch (const std::exception& e) {
      local_->group().abort(e.what());
      throw;
    }
  }
  std::vector<Tensor> others = {
      buffer.view_as({lo}),
      buffer.view_as({buffer.numel() - hi}, static_cast<size_t>(hi) * element)};
  local_->broadcast(others, 0)->wait();
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
