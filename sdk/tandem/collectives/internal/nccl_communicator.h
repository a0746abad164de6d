// collectives::Nccl: the backend for replicas on several GPUs of one process, or on the GPUs of
// several processes (NcclClique::Spanning). One NCCL communicator per GPU, created together in
// non-blocking mode; a host rendezvous before every
// collective (so a missing or mismatched replica raises instead of leaving a GPU waiting
// forever); and a watchdog that aborts the communicators on an asynchronous NCCL error or when a
// collective has not finished on the GPU within TANDEM_COLLECTIVE_TIMEOUT. Built only with NCCL.
#pragma once

#include <array>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "tandem/collectives/communicator.h"
#include "tandem/collectives/in_process.h"
#include "tandem/core/device.h"

struct ncclComm;  // nccl.h stays out of this header

namespace tandem::collectives {

class NcclClique;

/// Rank r's endpoint; only the thread playing rank r may call it. Collectives are queued on the
/// calling thread's current stream of its GPU and return before the GPU has done them (the
/// Work is complete from the host's point of view: later work on that stream sees the result).
/// After the watchdog aborted the group, every call raises AbortedError naming the cause.
class NcclCommunicator final : public Communicator {
 public:
  /// The rank among every process's ranks (first_rank of the group + this one's local index).
  int rank() const override;
  int size() const override;
  std::string name() const override { return "nccl"; }
  bool queues_on_device() const override { return true; }
  /// The GPU of this rank.
  Device device() const;

 protected:
  std::shared_ptr<Work> all_reduce_impl(const std::vector<Tensor>& inputs,
                                        const std::vector<Tensor>& outputs, ReduceOp op) override;
  std::shared_ptr<Work> all_gather_impl(std::vector<Tensor>& outputs, const Tensor& input) override;
  std::shared_ptr<Work> broadcast_impl(std::vector<Tensor>& tensors, int root) override;
  std::shared_ptr<Work> reduce_scatter_impl(Tensor& output, const Tensor& input,
                                            ReduceOp op) override;
  /// NCCL chooses the algorithm and chunking of a collective (and so the order in which each
  /// element's pieces are added) per collective and size: its reduce-scatter and reduce do not
  /// promise its all-reduce's bits. So this is the all-reduce of the whole buffer into a
  /// scratch buffer, as all_reduce queues it, and a copy of this rank's range out of it.
  std::shared_ptr<Work> reduce_scatter_ranges_impl(const Tensor& input, Tensor& output,
                                                   std::span<const int64_t> offsets,
                                                   ReduceOp op) override;
  /// One grouped ncclBroadcast per non-empty range, in place, from the range's owner.
  std::shared_ptr<Work> all_gather_ranges_impl(Tensor& buffer,
                                               std::span<const int64_t> offsets) override;
  std::shared_ptr<Work> barrier_impl() override;

 private:
  friend class NcclClique;
  NcclCommunicator(NcclClique* group, int local) : group_(group), rank_(local) {}

  /// Checks this rank's tensors, meets the peers on the host (every rank must bring the same
  /// call: kind, dtype and sizes), and raises on every rank when one does not.
  void enter(const char* label, const std::vector<Tensor>& tensors, int64_t extra);
  /// After queueing: records the point the watchdog watches and surfaces a pending error.
  void queued(const char* label);
  /// Every rank's shape of `shape` (of every process), for all_gather's outputs: on the host
  /// within one process, with an NCCL all-gather across processes.
  std::vector<std::vector<int64_t>> exchange_shapes(const Shape& shape);
  /// This rank's communicator (call with its comm mutex held); raises AbortedError when the
  /// group was aborted and the communicator freed.
  ncclComm* live_comm(const char* label);
  /// Waits on the host, polling for an abort, until the work queued on this rank's
  /// communication stream is done.
  void wait_for_comm_stream(const char* label);
  /// Raises AbortedError naming the call and the abort's cause (the group's mutex held).
  [[noreturn]] void throw_aborted(const char* label) const;
  /// Raises AbortedError when the group was aborted.
  void raise_if_aborted(const char* label) const;

  NcclClique* group_;
  int rank_;  // the local index: this process's ranks are 0 .. devices - 1 here
};

/// The NCCL communicators of one process's GPUs and their watchdog.
class NcclClique {
 public:
  /// One rank per device, in order; the devices must be distinct GPUs (NCCL refuses two ranks
  /// on one GPU: logical replicas sharing a GPU use the in_process backend).
  static std::shared_ptr<NcclClique> create(const std::vector<Device>& devices);

  /// The same, as part of one communicator over the GPUs of several processes: this process's
  /// ranks are first_rank .. first_rank + devices - 1 of total_ranks, and every process passes
  /// the unique id the chief made with unique_id() (sent over MPI). Every collective works
  /// across processes; all_gather first exchanges the pieces' shapes with an NCCL all-gather.
  struct Spanning {
    int first_rank = 0;
    int total_ranks = 0;
    std::array<char, 128> unique_id{};
  };
  static std::shared_ptr<NcclClique> create(const std::vector<Device>& devices,
                                            const Spanning& spanning);
  /// A new NCCL unique id (ncclGetUniqueId), as bytes.
  static std::array<char, 128> unique_id();
  ~NcclClique();
  NcclClique(const NcclClique&) = delete;
  NcclClique& operator=(const NcclClique&) = delete;

  /// Ranks over every process.
  int size() const;
  /// This process's ranks.
  int local_size() const;
  /// This process's rank with local index `rank`.
  NcclCommunicator& communicator(int rank);
  /// The host-side group the ranks meet in before each collective (strategies reset it between
  /// runs and abort it when a replica fails).
  InProcessRendezvous& host_group();
  /// Aborts every NCCL communicator (kernels waiting for peers return) and makes later calls
  /// raise AbortedError naming `reason`.
  void abort(const std::string& reason);

  struct State;  // implementation detail (nccl_communicator.cpp)

 private:
  NcclClique();
  friend class NcclCommunicator;
  std::unique_ptr<State> state_;
  std::vector<std::unique_ptr<NcclCommunicator>> communicators_;
};

}  // namespace tandem::collectives
