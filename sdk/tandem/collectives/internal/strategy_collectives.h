// The communicator factory: StrategyCollectives::create builds the collectives of a strategy's
// replicas from a description of them (their devices, and whether they span the workers of an
// MPI job), choosing the backend: in_process (threads; logical replicas sharing a GPU), NCCL
// (distinct GPUs, of one process or of every worker) or hierarchical (CPU replicas of several
// workers: in-process, then MPI). The one place that knows which backends this build has.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "tandem/collectives/communicator.h"
#include "tandem/collectives/in_process.h"
#include "tandem/collectives/internal/worker_collectives.h"
#include "tandem/core/device.h"
#include "tandem/core/workers.h"

namespace tandem::collectives {

/// Who communicates.
struct ReplicaLayout {
  /// Names the owner (the strategy) at the start of error messages.
  std::string owner;
  /// This process's replicas, one device each, in replica order (checked by the caller: not
  /// empty, visible, not mixing CPU and GPU). A GPU listed several times holds logical replicas.
  std::vector<Device> devices;
  /// True: the replicas of every worker of the job that started this process, global
  /// replica = worker x local replicas + local replica (every worker needs as many).
  bool across_workers = false;
  /// Workers started from TF_CONFIG: every worker's "host:port" (the chief's first) and this
  /// one's index; they meet over TCP and reduce with Gloo. Empty: an MPI job (mpirun, srun).
  std::vector<std::string> worker_addresses;
  int worker_rank = 0;
};

/// The collectives of a strategy's replicas. Built once; the strategy's replica threads use the
/// endpoints, its calling thread the cross-worker calls.
class StrategyCollectives {
 public:
  /// Builds the group `layout` describes. Raises NotBuiltError naming what to install when the
  /// build lacks the backend it needs (NCCL for several GPUs, MPI across workers), and
  /// tandem::Error for a layout no backend takes (a GPU listed twice among several, workers
  /// with different replica counts). Across workers, every worker must call it.
  static std::unique_ptr<StrategyCollectives> create(const ReplicaLayout& layout);
  ~StrategyCollectives();
  StrategyCollectives(const StrategyCollectives&) = delete;
  StrategyCollectives& operator=(const StrategyCollectives&) = delete;

  /// Workers of the job (1 unless across_workers) and this process's index among them.
  int num_workers() const { return num_workers_; }
  int worker_index() const { return worker_index_; }

  /// Where this process's replicas meet on the host: rendezvous (merge_call), abort when a
  /// replica fails, depart when one returns, reset between runs. Rank r is local replica r.
  InProcessRendezvous& local_group() const { return *local_; }
  /// Local replica `replica`'s endpoint of the collectives over every replica in sync.
  Communicator& communicator(int replica) const;
  /// The job's workers (CPU tensors, from the strategy's calling thread); null unless
  /// across_workers.
  const std::shared_ptr<WorkerCollectives>& workers() const { return workers_; }
  /// The workers as metrics and checkpoints see them (core/workers.h); null with one worker.
  const std::shared_ptr<WorkerGroup>& worker_group() const { return worker_group_; }

 private:
  StrategyCollectives() = default;
  /// Joins the workers of the MPI job (layout.across_workers).
  void join_workers(const ReplicaLayout& layout, bool distinct_gpus);

  int num_workers_ = 1;
  int worker_index_ = 0;
  std::shared_ptr<InProcessRendezvous> local_;  // may share ownership of an NCCL group
  std::shared_ptr<WorkerCollectives> workers_;
  std::shared_ptr<WorkerGroup> worker_group_;
  // Endpoints that are not local_'s own (NCCL, hierarchical), per local replica; empty when the
  // in-process endpoints serve.
  std::vector<Communicator*> endpoints_;
  std::vector<std::unique_ptr<Communicator>> owned_endpoints_;
};

}  // namespace tandem::collectives
