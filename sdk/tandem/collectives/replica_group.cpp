// The communicator factory (ReplicaGroup::create): the dispatch point between the collective
// backends, and the only file outside the backends themselves that knows whether this build has
// NCCL, MPI and Gloo.
#include "tandem/collectives/internal/replica_group.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "tandem/core/error.h"

#if TANDEM_WITH_NCCL
#include "tandem/collectives/internal/nccl_communicator.h"
#endif
#include "tandem/collectives/internal/hierarchical.h"
#if TANDEM_WITH_MPI
#include "tandem/collectives/internal/mpi_communicator.h"
#endif
#if TANDEM_WITH_GLOO
#include "tandem/collectives/internal/gloo_world.h"
#endif

namespace tandem::collectives {

namespace {

/// The workers of the job as the layers below distribute/ see them (core/workers.h): metrics
/// that combine every worker's state, checkpoints that gather it to the chief.
class WorkersAsGroup final : public WorkerGroup {
 public:
  explicit WorkersAsGroup(std::shared_ptr<WorkerCollectives> workers)
      : workers_(std::move(workers)) {}
  int num_workers() const override { return workers_->size(); }
  int worker_index() const override { return workers_->rank(); }
  void sum(std::vector<double>& values, const char* label) override {
    if (values.empty()) return;
    std::vector<Tensor> tensor = {
        Tensor::from_vector(values, Shape({static_cast<int64_t>(values.size())}))};
    workers_->all_reduce(tensor, ReduceOp::kSum, label);
    values = tensor[0].to_vector<double>();
  }
  std::vector<std::vector<char>> all_gather(const std::vector<char>& mine,
                                            const char* label) override {
    return workers_->all_gather(mine, label);
  }

 private:
  std::shared_ptr<WorkerCollectives> workers_;
};

std::vector<Device> distinct_devices(const std::vector<Device>& devices) {
  std::vector<Device> distinct;
  for (const Device& d : devices)
    if (std::find(distinct.begin(), distinct.end(), d) == distinct.end()) distinct.push_back(d);
  return distinct;
}

}  // namespace

std::unique_ptr<ReplicaGroup> ReplicaGroup::create(const ReplicaLayout& layout) {
  TANDEM_CHECK(!layout.devices.empty(), layout.owner, ": needs at least one device");
  std::unique_ptr<ReplicaGroup> group(new ReplicaGroup());
  const int replicas = static_cast<int>(layout.devices.size());
  const std::vector<Device> distinct = distinct_devices(layout.devices);
  // Replicas on distinct GPUs of one process reduce with NCCL; CPU replicas, and logical
  // replicas sharing one GPU, with the in_process backend (through device memory on a GPU).
  const bool several_gpus =
      layout.devices.front().is_cuda() && distinct.size() > 1 && !layout.across_workers;
  if (several_gpus) {
    TANDEM_CHECK(distinct.size() == layout.devices.size(), layout.owner, ": replicas on ",
                 distinct.size(), " GPUs with some GPUs listed more than once; use each GPU once, ",
                 "or list one GPU several times (logical replicas sharing it)");
#if TANDEM_WITH_NCCL
    std::shared_ptr<NcclGroup> nccl = NcclGroup::create(layout.devices);
    group->local_ = std::shared_ptr<InProcessGroup>(nccl, &nccl->host_group());
    for (int r = 0; r < replicas; ++r) group->endpoints_.push_back(&nccl->communicator(r));
#else
    throw NotBuiltError(detail::str_cat(layout.owner, ": replicas on ", distinct.size(),
                                        " GPUs need NCCL, which this build does not have"));
#endif
  } else {
    group->local_ = InProcessGroup::create(replicas);
  }
  if (layout.across_workers)
    group->join_workers(layout, /*distinct_gpus=*/distinct.size() == layout.devices.size());
  return group;
}

namespace {

/// The job's workers: Gloo for workers started from TF_CONFIG, else MPI.
std::shared_ptr<WorkerCollectives> join(const ReplicaLayout& layout) {
  if (!layout.worker_addresses.empty()) {
#if TANDEM_WITH_GLOO
    return std::make_shared<GlooWorld>(layout.worker_rank, layout.worker_addresses);
#else
    throw NotBuiltError(layout.owner +
                        ": workers started from TF_CONFIG need Gloo, which this build does not "
                        "have (install libgloo-dev and configure with -DTANDEM_ENABLE_GLOO=ON)");
#endif
  }
#if TANDEM_WITH_MPI
  return MpiWorld::instance();
#else
  throw NotBuiltError(layout.owner +
                      ": needs Open MPI, which this build does not have "
                      "(install libopenmpi-dev and configure with -DTANDEM_ENABLE_MPI=ON)");
#endif
}

}  // namespace

void ReplicaGroup::join_workers(const ReplicaLayout& layout, bool distinct_gpus) {
  const std::shared_ptr<WorkerCollectives> world = join(layout);
  const int replicas = static_cast<int>(layout.devices.size());
  workers_ = world;
  num_workers_ = world->size();
  worker_index_ = world->rank();
  if (num_workers_ > 1) {
    // Global replica ids (worker x local replicas + local id) need the same count everywhere.
    std::vector<Tensor> counts = {
        Tensor::from_vector(std::vector<int64_t>{replicas, -static_cast<int64_t>(replicas)})};
    world->all_reduce(counts, ReduceOp::kMax, "local replica counts");
    const std::vector<int64_t> range = counts[0].to_vector<int64_t>();
    TANDEM_CHECK(range[0] == -range[1], layout.owner,
                 ": every worker needs the same number of local replicas; worker ", worker_index_,
                 " has ", replicas, ", and the workers have between ", -range[1], " and ",
                 range[0]);
  }
  const bool any_gpu = std::any_of(layout.devices.begin(), layout.devices.end(),
                                   [](const Device& d) { return d.is_cuda(); });
  if (any_gpu) {
    // GPU replicas: one NCCL communicator over every worker's GPUs, its unique id made by the
    // chief and sent over the workers' collectives (MPI or Gloo). Each worker's GPUs must be
    // distinct.
#if TANDEM_WITH_NCCL
    TANDEM_CHECK(distinct_gpus, layout.owner,
                 ": a worker's GPU replicas must be on distinct GPUs (NCCL takes one rank per "
                 "GPU), got ",
                 layout.devices.size(), " replicas on ", distinct_devices(layout.devices).size(),
                 " GPUs");
    NcclGroup::Spanning spanning;
    spanning.first_rank = worker_index_ * replicas;
    spanning.total_ranks = num_workers_ * replicas;
    std::vector<Tensor> id = {Tensor::zeros({128}, DType::kUInt8)};
    if (worker_index_ == 0) {
      spanning.unique_id = NcclGroup::unique_id();
      std::memcpy(id[0].raw_data(), spanning.unique_id.data(), 128);
    }
    world->broadcast(id, 0, "nccl unique id");
    std::memcpy(spanning.unique_id.data(), id[0].raw_data(), 128);
    std::shared_ptr<NcclGroup> nccl = NcclGroup::create(layout.devices, spanning);
    local_ = std::shared_ptr<InProcessGroup>(nccl, &nccl->host_group());
    for (int r = 0; r < replicas; ++r) endpoints_.push_back(&nccl->communicator(r));
#else
    (void)distinct_gpus;
    throw NotBuiltError(layout.owner +
                        ": GPU replicas across workers need NCCL, which this build does not "
                        "have");
#endif
  } else {
    // CPU replicas: in-process among a worker's replicas, MPI or Gloo between the workers.
    auto shared = std::make_shared<std::vector<Tensor>>();
    for (int r = 0; r < replicas; ++r) {
      owned_endpoints_.push_back(
          std::make_unique<HierarchicalCommunicator>(world, &local_->communicator(r), shared));
      endpoints_.push_back(owned_endpoints_.back().get());
    }
  }
  if (num_workers_ > 1) worker_group_ = std::make_shared<WorkersAsGroup>(workers_);
}

ReplicaGroup::~ReplicaGroup() = default;

Communicator& ReplicaGroup::communicator(int replica) const {
  if (endpoints_.empty()) return local_->communicator(replica);
  return *endpoints_.at(static_cast<size_t>(replica));
}

}  // namespace tandem::collectives
