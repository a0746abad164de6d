// The communicator factory (StrategyCollectives::create): the dispatch point between the collective
// backends, and the only file outside the backends themselves that knows whether this build has
// NCCL, MPI and Gloo.
#include "tandem/collectives/internal/strategy_collectives.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <cstring>
#include <tuple>
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
#include "tandem/collectives/internal/shared_memory_world.h"
#include "tandem/collectives/internal/tcp_store.h"
#include "tandem/core/logging.h"

namespace tandem::collectives {

namespace {

/// The workers of the job as the layers below distribute/ see them (core/workers.h): metrics
/// that combine every worker's state, checkpoints that gather it to the chief.
class CollectiveWorkerGroup final : public WorkerGroup {
 public:
  explicit CollectiveWorkerGroup(std::shared_ptr<WorkerCollectives> workers)
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
  std::vector<char> broadcast_from(int worker, std::vector<char> bytes,
                                   const char* label) override {
    TANDEM_CHECK(worker >= 0 && worker < workers_->size(), label, ": broadcast from worker ",
                 worker, ", outside [0, ", workers_->size(), ")");
    std::vector<Tensor> size = {Tensor::scalar(static_cast<double>(bytes.size()), DType::kInt64)};
    workers_->broadcast(size, worker, label);
    const int64_t n = size[0].item<int64_t>();
    std::vector<Tensor> data = {Tensor::empty({n}, DType::kUInt8)};
    if (workers_->rank() == worker && n > 0)
      std::memcpy(data[0].raw_data(), bytes.data(), static_cast<size_t>(n));
    workers_->broadcast(data, worker, label);
    bytes.resize(static_cast<size_t>(n));
    if (n > 0) std::memcpy(bytes.data(), data[0].raw_data(), static_cast<size_t>(n));
    return bytes;
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

std::unique_ptr<StrategyCollectives> StrategyCollectives::create(const ReplicaLayout& layout) {
  TANDEM_CHECK(!layout.devices.empty(), layout.owner, ": needs at least one device");
  std::unique_ptr<StrategyCollectives> group(new StrategyCollectives());
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
    std::shared_ptr<NcclClique> nccl = NcclClique::create(layout.devices);
    group->local_ = std::shared_ptr<InProcessRendezvous>(nccl, &nccl->host_group());
    for (int r = 0; r < replicas; ++r) group->endpoints_.push_back(&nccl->communicator(r));
#else
    throw NotBuiltError(detail::str_cat(layout.owner, ": replicas on ", distinct.size(),
                                        " GPUs need NCCL, which this build does not have"));
#endif
  } else {
    group->local_ = InProcessRendezvous::create(replicas);
  }
  if (layout.across_workers)
    group->join_workers(layout, /*distinct_gpus=*/distinct.size() == layout.devices.size());
  return group;
}

namespace {

/// Workers started from TF_CONFIG: they meet at the chief's store, then talk through shared
/// memory when every worker runs on this machine (TANDEM_WORKER_TRANSPORT=auto, the default, or
/// shm), else through Gloo over TCP (or when TANDEM_WORKER_TRANSPORT=tcp).
std::shared_ptr<WorkerCollectives> join_tf_config(const ReplicaLayout& layout) {
  const std::vector<std::string>& addresses = layout.worker_addresses;
  const int rank = layout.worker_rank;
  const char* transport_env = std::getenv("TANDEM_WORKER_TRANSPORT");
  const std::string transport = transport_env && *transport_env ? transport_env : "auto";
  TANDEM_CHECK(transport == "auto" || transport == "shm" || transport == "tcp",
               "TANDEM_WORKER_TRANSPORT=\"", transport, "\": expected auto, shm or tcp");
  auto describe = [addresses](int worker) {
    return detail::str_cat("worker ", worker, " (", addresses[static_cast<size_t>(worker)], ")");
  };
  TcpStoreOptions options;
  std::tie(options.host, options.port) = split_host_port(addresses.front());
  options.serve = rank == 0;
  options.rank = rank;
  options.world_size = static_cast<int>(addresses.size());
  for (size_t i = 0; i < addresses.size(); ++i) options.cluster += (i ? ", " : "") + addresses[i];
  if (const char* token = std::getenv("TANDEM_JOB_TOKEN")) options.token = token;
  options.timeout = collective_timeout();
  options.describe_worker = describe;
  // Keys end with the index of the worker that sets them ("machine/2"; Gloo's "2", "rank_2").
  options.describe_key = [describe,
                          size = static_cast<int>(addresses.size())](const std::string& key) {
    size_t digits = key.size();
    while (digits > 0 && std::isdigit(static_cast<unsigned char>(key[digits - 1]))) --digits;
    const int worker = digits < key.size() ? std::atoi(key.c_str() + digits) : -1;
    return worker >= 0 && worker < size ? describe(worker) : "key \"" + key + "\"";
  };
  auto store = std::make_shared<TcpStore>(std::move(options));
  // Every worker must choose alike: a tcp worker would wait for Gloo while an auto one waits
  // for the shared-memory offer, both until the timeout.
  store->set("transport/" + std::to_string(rank),
             std::vector<char>(transport.begin(), transport.end()));
  for (int w = 0; w < static_cast<int>(addresses.size()); ++w) {
    const std::vector<char> theirs = store->get("transport/" + std::to_string(w));
    TANDEM_CHECK(std::string(theirs.begin(), theirs.end()) == transport,
                 "TF_CONFIG workers: TANDEM_WORKER_TRANSPORT is \"", transport, "\" on ",
                 describe(rank), " and \"", std::string(theirs.begin(), theirs.end()), "\" on ",
                 describe(w), "; set it alike on every worker (or on none)");
  }
  std::string why_not = "TANDEM_WORKER_TRANSPORT=tcp";
  if (transport != "tcp") {
    if (std::shared_ptr<SharedMemoryWorld> world =
            SharedMemoryWorld::connect(rank, addresses, store, &why_not)) {
      TANDEM_LOG_INFO("TF_CONFIG workers: the ", addresses.size(),
                      " workers share this machine and talk through shared memory");
      return world;
    }
    TANDEM_CHECK(transport != "shm",
                 "TANDEM_WORKER_TRANSPORT=shm, but shared memory cannot be "
                 "used: ",
                 why_not);
  }
#if TANDEM_WITH_GLOO
  TANDEM_LOG_INFO("TF_CONFIG workers: Gloo over TCP (", why_not, ")");
  return std::make_shared<GlooWorld>(rank, addresses, store);
#else
  throw NotBuiltError(layout.owner +
                      ": workers started from TF_CONFIG on several machines need "
                      "Gloo (" +
                      why_not +
                      "), which this build does not have (install "
                      "libgloo-dev and configure with -DTANDEM_ENABLE_GLOO=ON)");
#endif
}

/// The job's workers: from TF_CONFIG (shared memory or Gloo), else MPI.
std::shared_ptr<WorkerCollectives> join(const ReplicaLayout& layout) {
  if (!layout.worker_addresses.empty()) return join_tf_config(layout);
#if TANDEM_WITH_MPI
  return MpiWorld::instance();
#else
  throw NotBuiltError(layout.owner +
                      ": needs Open MPI, which this build does not have "
                      "(install libopenmpi-dev and configure with -DTANDEM_ENABLE_MPI=ON)");
#endif
}

}  // namespace

void StrategyCollectives::join_workers(const ReplicaLayout& layout, bool distinct_gpus) {
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
    NcclClique::Spanning spanning;
    spanning.first_rank = worker_index_ * replicas;
    spanning.total_ranks = num_workers_ * replicas;
    std::vector<Tensor> id = {Tensor::zeros({128}, DType::kUInt8)};
    if (worker_index_ == 0) {
      spanning.unique_id = NcclClique::unique_id();
      std::memcpy(id[0].raw_data(), spanning.unique_id.data(), 128);
    }
    world->broadcast(id, 0, "nccl unique id");
    std::memcpy(spanning.unique_id.data(), id[0].raw_data(), 128);
    std::shared_ptr<NcclClique> nccl = NcclClique::create(layout.devices, spanning);
    local_ = std::shared_ptr<InProcessRendezvous>(nccl, &nccl->host_group());
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
  if (num_workers_ > 1) worker_group_ = std::make_shared<CollectiveWorkerGroup>(workers_);
}

StrategyCollectives::~StrategyCollectives() = default;

Communicator& StrategyCollectives::communicator(int replica) const {
  if (endpoints_.empty()) return local_->communicator(replica);
  return *endpoints_.at(static_cast<size_t>(replica));
}

}  // namespace tandem::collectives
