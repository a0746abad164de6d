// InProcess: the collectives backend for replicas that are threads of one process. The ranks of
// an InProcessRendezvous meet at a rendezvous, then each rank works directly on the others' buffers
// (no staging copies), reducing its own slice of every buffer in a fixed order.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "tandem/collectives/communicator.h"

namespace tandem::collectives {

class InProcessRendezvous;

namespace in_process {
struct State;  // what the ranks share (internal/in_process_state.h)
}  // namespace in_process

/// Rank r's endpoint of an InProcessRendezvous; only the thread playing rank r may call it.
///
/// Every collective completes before it returns (the Work is already complete). all_reduce is
/// reduce-scatter + all-gather in one pass: the flattened list is cut into one slice per rank;
/// rank r sums slice r over every rank's buffer in rank order 0, 1, ..., N-1 and writes the result
/// into every rank's output. The order is fixed, so results are bitwise reproducible and equal on
/// every rank, and large buffers are reduced by all ranks in parallel. Steady-state calls
/// allocate nothing (all_gather allocates its outputs). The flat reduce_scatter is the same
/// pass writing each element only into its owner's output (a true reduce-scatter, bitwise
/// equal to all_reduce); the flat all_gather has each rank copy its peers' ranges.
///
/// GPU tensors work when every rank's tensors are on the same GPU (logical replicas sharing
/// it): the data phase is a kernel (or device copies) on each rank's own stream, ordered with
/// the peers' streams by events, so the call returns before the GPU has done the work and no
/// host thread waits for it. Replicas on several GPUs use NCCL instead.
class InProcessCommunicator final : public Communicator {
 public:
  int rank() const override { return rank_; }
  int size() const override;
  std::string name() const override { return "in_process"; }
  bool reduce_scatters_for_real() const override { return true; }

  /// A barrier named `label` (static storage: a literal), used by strategies for merge_call and
  /// variable creation; mismatches and timeouts report the label. Not counted in stats().
  void rendezvous(const char* label);

  /// The group this endpoint belongs to.
  InProcessRendezvous& group() const { return *group_; }

 protected:
  std::shared_ptr<Work> all_reduce_impl(const std::vector<Tensor>& inputs,
                                        const std::vector<Tensor>& outputs, ReduceOp op) override;
  std::shared_ptr<Work> all_gather_impl(std::vector<Tensor>& outputs, const Tensor& input) override;
  std::shared_ptr<Work> broadcast_impl(std::vector<Tensor>& tensors, int root) override;
  std::shared_ptr<Work> reduce_scatter_impl(Tensor& output, const Tensor& input,
                                            ReduceOp op) override;
  std::shared_ptr<Work> reduce_scatter_ranges_impl(const Tensor& input, Tensor& output,
                                                   std::span<const int64_t> offsets,
                                                   ReduceOp op) override;
  std::shared_ptr<Work> all_gather_ranges_impl(Tensor& buffer,
                                               std::span<const int64_t> offsets) override;
  std::shared_ptr<Work> barrier_impl() override;

 private:
  friend class InProcessRendezvous;
  InProcessCommunicator(InProcessRendezvous* group, int rank) : group_(group), rank_(rank) {}

  InProcessRendezvous* group_;
  int rank_;
  std::string local_error_;  // this call's argument problem, reported to every rank; reused
};

/// The state shared by the ranks of one in-process group: the rendezvous, the arguments each
/// rank brought to the current call, and the abort flag that releases waiting ranks.
class InProcessRendezvous {
 public:
  /// A group of `size` ranks (size >= 1).
  static std::shared_ptr<InProcessRendezvous> create(int size);
  ~InProcessRendezvous();
  InProcessRendezvous(const InProcessRendezvous&) = delete;
  InProcessRendezvous& operator=(const InProcessRendezvous&) = delete;

  /// The number of ranks.
  int size() const { return size_; }
  /// Rank `rank`'s endpoint (owned by the group).
  InProcessCommunicator& communicator(int rank);

  /// Releases every rank waiting in a collective that has not started moving data, and makes
  /// every later call raise at once: they raise AbortedError naming the call and `reason`.
  /// Collectives already moving data finish normally (their buffers stay valid).
  void abort(const std::string& reason);
  /// Declares that `rank` will make no more calls (its replica function returned): ranks waiting
  /// for it raise at once, naming it, instead of waiting for the timeout.
  void depart(int rank);
  /// Back to the initial state: call numbers restart at #1, the abort and departures are
  /// cleared. Only while no rank is inside a call (strategies reset between runs).
  void reset();
  /// Call number of the last collective `rank` entered since the last reset.
  uint64_t calls_entered(int rank) const;

 private:
  explicit InProcessRendezvous(int size);
  friend class InProcessCommunicator;

  int size_;
  std::unique_ptr<in_process::State> state_;
  std::vector<std::unique_ptr<InProcessCommunicator>> communicators_;
};

}  // namespace tandem::collectives
