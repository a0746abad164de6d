// Strategy: what a strategy is made of and how it is put together (devices checked, collectives
// from the communicator factory, one ReplicaContext and one thread per replica), its scope and
// mirrored variables, and its input (distribute_dataset). The reductions are in
// cross_replica.cpp, the replica threads in replica_threads.cpp, the concrete strategies and
// their device choice in mirrored_strategy.cpp.
#include "tandem/distribute/strategy.h"

#include <algorithm>
#include <cstdlib>
#include <mutex>

#include "tandem/core/logging.h"
#include "tandem/core/threading.h"
#include "tandem/distribute/cluster_resolver.h"
#include "tandem/distribute/internal/gradient_reducer.h"
#include "tandem/distribute/internal/strategy_impl.h"
#include "tandem/tensor/device_runtime.h"

namespace tandem {

namespace {

thread_local const Strategy* t_scope_strategy = nullptr;

/// Workers that share a machine divide its cores, as mpirun's --bind-to core does: every
/// worker says which kernel it runs on and which cores it may use, and the workers with the
/// same kernel and the same cores each take a share (rank order). Workers already bound apart
/// (mpirun, taskset, a container's cpuset) keep their cores, and TANDEM_CPU_BIND=none keeps
/// every worker on all of them. Logs what this worker took.
void divide_machine_cores(collectives::WorkerCollectives& workers, const std::string& owner,
                          int replicas) {
  const char* setting = std::getenv("TANDEM_CPU_BIND");
  const std::string bind = setting && *setting ? setting : "cores";
  TANDEM_CHECK(bind == "cores" || bind == "none", "TANDEM_CPU_BIND=\"", bind,
               "\": expected cores (the default) or none");
  const std::vector<int> mine = process_cores();
  const std::string identity = kernel_identity() + "\n" + format_cores(mine);
  const std::vector<std::vector<char>> all =
      workers.all_gather(std::vector<char>(identity.begin(), identity.end()), "machine cores");
  int sharing = 0, position = 0;
  for (int w = 0; w < static_cast<int>(all.size()); ++w) {
    if (std::string(all[static_cast<size_t>(w)].begin(), all[static_cast<size_t>(w)].end()) !=
        identity)
      continue;
    if (w < workers.rank()) ++position;
    ++sharing;
  }
  std::vector<int> share = mine;
  std::string how;
  if (sharing <= 1 || mine.empty()) {
    how = "no other worker of the job uses them";
  } else if (bind == "none") {
    how = detail::str_cat("shared with ", sharing - 1, " other worker", sharing == 2 ? "" : "s",
                          " of the job (TANDEM_CPU_BIND=none)");
  } else {
    // Whole physical cores each (hyperthread siblings together, as --bind-to core), in order.
    const std::vector<std::vector<int>> cores = physical_cores(mine);
    const size_t count = cores.size(), n = static_cast<size_t>(sharing),
                 p = static_cast<size_t>(position);
    share.clear();
    if (count >= n) {
      for (size_t c = p * count / n; c < (p + 1) * count / n; ++c)
        share.insert(share.end(), cores[c].begin(), cores[c].end());
    } else {
      share = cores[p % count];
    }
    std::sort(share.begin(), share.end());
    bind_process_to_cores(share);
    how = detail::str_cat(share.size(), " of the ", mine.size(), " this machine gives the job's ",
                          sharing, " workers here (TANDEM_CPU_BIND=none to keep them all)");
  }
  // The replica threads split this process's cores (replica_threads.cpp).
  const int threads = std::max(1, static_cast<int>(share.size()) / replicas);
  TANDEM_LOG_INFO(owner, ": worker ", workers.rank(), " of ", workers.size(), " computes on core",
                  share.size() == 1 ? " " : "s ", format_cores(share), " with ", threads,
                  " compute thread", threads == 1 ? "" : "s", " for each of its ", replicas,
                  " replica", replicas == 1 ? "" : "s", ": ", how);
}

using InitialBroadcast = std::function<Tensor(const std::string&, const Tensor&)>;

/// A variable with one copy per device, every copy equal to `initial` (replica 0's value; with
/// `broadcast`, the chief's).
Variable mirrored_variable(const std::vector<Device>& devices, std::string name,
                           const Tensor& initial, bool trainable,
                           const InitialBroadcast& broadcast = nullptr) {
  const Tensor first = broadcast ? broadcast(name, initial) : initial;
  Variable variable(std::move(name), first.to(devices[0]), trainable);
  if (devices.size() == 1) return variable;
  std::vector<Tensor> copies;
  copies.reserve(devices.size());
  copies.push_back(variable.copy(0));
  for (size_t r = 1; r < devices.size(); ++r)
    copies.push_back(variable.copy(0).to(devices[r]).clone());
  variable.set_copies(std::move(copies));
  return variable;
}

VariableCreator mirrored_creator(std::vector<Device> devices,
                                 InitialBroadcast broadcast = nullptr) {
  // Captures the devices by value, so the creator never refers back to the strategy.
  return [devices = std::move(devices), broadcast = std::move(broadcast)](
             std::string name, const Tensor& initial, bool trainable) {
    return mirrored_variable(devices, std::move(name), initial, trainable, broadcast);
  };
}

void validate_devices(const std::string& strategy, const std::vector<Device>& devices) {
  TANDEM_CHECK(!devices.empty(), strategy, ": needs at least one device");
  bool any_cpu = false, any_cuda = false;
  for (const Device& d : devices) {
    any_cpu = any_cpu || d.is_cpu();
    if (!d.is_cuda()) continue;
    any_cuda = true;
    const CudaAvailability& cuda = cuda_availability();
    if (!cuda.built)
      throw NotBuiltError(detail::str_cat(strategy, ": device ", d,
                                          " needs CUDA support, which this build does not have; "
                                          "configure with -DTANDEM_ENABLE_CUDA=ON"));
    TANDEM_CHECK(d.index >= 0 && d.index < static_cast<int>(cuda.devices.size()), strategy,
                 ": device ", d, " is not a visible GPU (",
                 cuda.devices.empty() ? "none is visible: " + cuda.reason
                                      : std::to_string(cuda.devices.size()) + " visible",
                 ")");
  }
  TANDEM_CHECK(!(any_cpu && any_cuda), strategy,
               ": mixes CPU and GPU replicas; use GPUs only (they would wait for the CPUs)");
}

}  // namespace

namespace detail {
const Strategy* current_scope_strategy() { return t_scope_strategy; }
}  // namespace detail

// ---- construction ------------------------------------------------------------------------------

Strategy::Strategy(std::string name, std::vector<Device> devices, Execution execution, Scope scope)
    : impl_(std::make_unique<Impl>()) {
  validate_devices(name, devices);
  Impl& impl = *impl_;
  impl.name = std::move(name);
  impl.devices = std::move(devices);
  const int replicas = impl.num_replicas();
  TANDEM_CHECK(execution == Execution::kThreads || replicas == 1, impl.name,
               ": inline execution needs exactly one replica");
  // The communicator factory picks the backend: in_process, NCCL (replicas on distinct GPUs),
  // or across the workers of an MPI job.
  collectives::ReplicaLayout layout;
  layout.owner = impl.name;
  layout.devices = impl.devices;
  layout.across_workers = scope == Scope::kWorkers;
  if (scope == Scope::kWorkers) {
    // Workers started from TF_CONFIG meet at the chief's address (TCP, Gloo); a launcher's
    // workers through MPI.
    const ClusterSpec cluster = ClusterResolver::from_environment();
    if (cluster.source == "tf_config") {
      layout.worker_addresses = cluster.addresses;
      layout.worker_rank = cluster.rank;
    }
  }
  impl.collectives = collectives::StrategyCollectives::create(layout);
  // Before the replica threads exist: each sizes its compute threads from this process's cores.
  if (scope == Scope::kWorkers && impl.collectives->workers() &&
      impl.collectives->workers()->size() > 1 && impl.devices.front().is_cpu())
    divide_machine_cores(*impl.collectives->workers(), impl.name, impl.num_replicas());
  if (scope == Scope::kWorkers) {
    set_process_replica_offset(impl.worker_index() * replicas);
    set_job_replicas({.in_sync = impl.num_workers() * replicas, .local = replicas});
    // Metrics and checkpoints combine the workers' state through the installed group.
    if (const std::shared_ptr<WorkerGroup>& workers = impl.collectives->worker_group())
      impl.previous_worker_group = set_worker_group(workers);
    impl.broadcast_initial = [workers = impl.collectives->workers()](const std::string& name,
                                                                     const Tensor& initial) {
      std::vector<Tensor> value = {initial.to(Device::cpu()).clone()};
      // The label names the variable: a worker building another model is told which differs.
      const std::string label = detail::str_cat("the initial value of variable \"", name, "\" ",
                                                initial.shape(), " ", initial.dtype());
      workers->broadcast(value, 0, label.c_str());
      return value[0];
    };
  }
  impl.merge.arguments.assign(static_cast<size_t>(replicas), nullptr);
  const int first_replica = impl.worker_index() * replicas;
  const int replicas_in_sync = impl.num_workers() * replicas;
  detail::ReplicaThreads::Options threads;
  for (int r = 0; r < replicas; ++r) {
    impl.contexts.push_back(std::unique_ptr<ReplicaContext>(
        new ReplicaContext(this, first_replica + r, replicas_in_sync,
                           impl.devices[static_cast<size_t>(r)], &impl.collectives->communicator(r),
                           &impl.collectives->local_group().communicator(r), &impl.merge)));
    threads.contexts.push_back(impl.contexts.back().get());
  }
  threads.name = impl.name;
  threads.devices = impl.devices;
  threads.on_calling_thread = execution == Execution::kInline;
  threads.worker_index = impl.worker_index();
  threads.num_workers = impl.num_workers();
  threads.group = &impl.collectives->local_group();
  threads.creator = mirrored_creator(impl.devices);
  impl.replicas = std::make_unique<detail::ReplicaThreads>(std::move(threads));
  // Buckets on GPUs, where their all-reduces queue on the communication stream, and on CPU
  // workers whose collectives wait without polling (Gloo, one replica per worker); off on
  // other CPU replicas, whose communication thread would spin or poll on a core the compute
  // needs (bench_overlap_cpu, bench/overlap_veth.sh).
  const bool gpus = !impl.devices.empty() && impl.devices.front().is_cuda();
  const bool sleeps = replicas > 0 && impl.collectives->communicator(0).waits_without_polling();
  set_communication_options(
      gpus || sleeps ? CommunicationOptions{}
                     : CommunicationOptions{.bytes_per_pack = 0, .first_bytes_per_pack = 0});
}

void Strategy::set_communication_options(const CommunicationOptions& options) {
  detail::check_cross_replica("set_communication_options");
  TANDEM_CHECK(options.bytes_per_pack >= 0 && options.first_bytes_per_pack >= 0, name(),
               ".set_communication_options: bytes_per_pack (", options.bytes_per_pack,
               ") and first_bytes_per_pack (", options.first_bytes_per_pack,
               ") must not be negative");
  const auto compression = static_cast<int>(options.gradient_compression);
  TANDEM_CHECK(compression >= 0 && compression <= static_cast<int>(GradientCompression::kFloat16),
               name(), ".set_communication_options: gradient_compression ", compression,
               " is none of kNone, kBFloat16, kFloat16");
  impl_->communication = options;
  const int64_t first =
      options.first_bytes_per_pack > 0 ? options.first_bytes_per_pack : options.bytes_per_pack;
  const DType float32_wire =
      options.gradient_compression == GradientCompression::kBFloat16  ? DType::kBFloat16
      : options.gradient_compression == GradientCompression::kFloat16 ? DType::kFloat16
                                                                      : DType::kFloat32;
  for (const std::unique_ptr<ReplicaContext>& ctx : impl_->contexts)
    ctx->set_communication(first, options.bytes_per_pack, float32_wire);
}

const CommunicationOptions& Strategy::communication_options() const { return impl_->communication; }

const char* to_string(GradientCompression compression) {
  switch (compression) {
    case GradientCompression::kNone:
      return "none";
    case GradientCompression::kBFloat16:
      return "bfloat16";
    case GradientCompression::kFloat16:
      return "float16";
  }
  return "unknown";
}

Strategy::~Strategy() {
  // Never blocks on a replica stuck in user code: stop detaches it instead of joining.
  const int detached = impl_->replicas->stop();
  const std::shared_ptr<WorkerGroup>& workers = impl_->collectives->worker_group();
  if (workers && worker_group() == workers) {
    set_worker_group(impl_->previous_worker_group);
    set_job_replicas({});  // this process is no longer a worker of that job
    set_process_replica_offset(0);
  }
  if (detached > 0) {
    // Replica threads that never returned still hold this state: it stays theirs for the life
    // of the process (kept in a list, so it is not reported as a leak), and the process can
    // exit while they run.
    static std::mutex abandoned_mutex;
    static auto* abandoned = new std::vector<std::unique_ptr<Impl>>();
    TANDEM_LOG_WARNING(impl_->name, " ended with ", detached, " replica thread",
                       detached == 1 ? "" : "s",
                       " still running (detached): ", impl_->replicas->broken());
    std::lock_guard<std::mutex> lock(abandoned_mutex);
    abandoned->push_back(std::move(impl_));
  }
}

const std::string& Strategy::name() const { return impl_->name; }
void Strategy::mark_default() { impl_->is_default = true; }
int Strategy::num_replicas_in_sync() const { return impl_->num_replicas() * impl_->num_workers(); }
int Strategy::num_local_replicas() const { return impl_->num_replicas(); }
int Strategy::num_workers() const { return impl_->num_workers(); }
int Strategy::worker_index() const { return impl_->worker_index(); }
const std::vector<Device>& Strategy::devices() const { return impl_->devices; }

collectives::Communicator& Strategy::communicator(int replica) const {
  TANDEM_CHECK(replica >= 0 && replica < impl_->num_replicas(), name(), ": no replica ", replica,
               " (", impl_->num_replicas(), " replicas)");
  return impl_->collectives->communicator(replica);
}

void Strategy::check_per_replica_size(size_t size) const {
  TANDEM_CHECK(size == static_cast<size_t>(impl_->num_replicas()), name(),
               ".run: a PerReplica argument holds ", size, " values but the strategy has ",
               impl_->num_replicas(), " replicas");
}

void Strategy::execute(detail::ReplicaTask task) { impl_->replicas->run(task); }

// ---- scope and variables ----------------------------------------------------------------------

StrategyScope Strategy::scope() const { return StrategyScope(impl_->is_default ? nullptr : this); }

StrategyScope::StrategyScope(const Strategy* strategy)
    : strategy_(strategy), thread_(std::this_thread::get_id()) {
  if (strategy_ == nullptr) return;
  TANDEM_CHECK(t_scope_strategy == nullptr || t_scope_strategy == strategy_,
               "strategy.scope(): this thread is already inside the scope of another strategy (",
               t_scope_strategy ? t_scope_strategy->name() : std::string(), " with ",
               t_scope_strategy ? t_scope_strategy->num_replicas_in_sync() : 0,
               " replicas); end that scope first, Tandem does not mix strategies");
  previous_strategy_ = t_scope_strategy;
  t_scope_strategy = strategy_;
  previous_creator_ = set_variable_creator(
      mirrored_creator(strategy_->devices(), strategy_->impl_->broadcast_initial));
}

StrategyScope::StrategyScope(StrategyScope&& other) noexcept
    : strategy_(other.strategy_),
      previous_strategy_(other.previous_strategy_),
      previous_creator_(std::move(other.previous_creator_)),
      thread_(other.thread_) {
  other.strategy_ = nullptr;
}

StrategyScope::~StrategyScope() {
  if (strategy_ == nullptr) return;
  if (std::this_thread::get_id() != thread_) {
    TANDEM_LOG_ERROR(
        "a strategy scope ended on another thread than the one that entered it; "
        "the entering thread stays in the scope");
    return;
  }
  set_variable_creator(std::move(previous_creator_));
  t_scope_strategy = previous_strategy_;
}

data::ReplicaTimes Strategy::replica_times() const {
  return data::ReplicaTimes{impl_->replicas->runs(), impl_->replicas->compute_seconds()};
}

// ---- input -------------------------------------------------------------------------------------

data::DistributedDataset Strategy::distribute_dataset(const data::Dataset& dataset,
                                                      data::DistributeOptions options) const {
  if (impl_->num_workers() > 1 && options.num_workers == 1) {
    options.num_workers = impl_->num_workers();
    options.worker_index = impl_->worker_index();
  }
  data::DistributedDataset distributed(dataset, impl_->num_replicas(), options);
  distributed.set_devices(impl_->devices);
  install_end_of_data_agreement(distributed);
  if (options.split == data::SplitPolicy::kBySpeed) {
    // The replica threads' timing of the latest run (read between runs, on the loop's thread).
    distributed.set_replica_timing([this] { return replica_times(); });
  }
  return distributed;
}

data::DistributedDataset Strategy::distribute_datasets_from_function(
    std::function<data::Dataset(const data::InputContext&)> fn,
    data::DistributeOptions options) const {
  if (impl_->num_workers() > 1 && options.num_workers == 1) {
    options.num_workers = impl_->num_workers();
    options.worker_index = impl_->worker_index();
  }
  data::DistributedDataset distributed =
      data::DistributedDataset::from_function(std::move(fn), impl_->num_replicas(), options);
  distributed.set_devices(impl_->devices);
  install_end_of_data_agreement(distributed);
  return distributed;
}

}  // namespace tandem
