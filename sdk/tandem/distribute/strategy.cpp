// Strategy machinery: the persistent replica threads and the run hand-off, error collection
// and re-raising, scopes and mirrored variables, cross-replica reduce/gather, and the device
// choice of MirroredStrategy's default constructor.
#include "tandem/distribute/strategy.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <sstream>

#include "tandem/collectives/in_process.h"
#include "tandem/collectives/internal/spin_wait.h"
#if TANDEM_WITH_NCCL
#include "tandem/collectives/internal/nccl_communicator.h"
#endif
#if TANDEM_WITH_MPI
#include "tandem/collectives/internal/mpi_communicator.h"
#endif
#include "tandem/core/build_info.h"
#include "tandem/core/logging.h"
#include "tandem/core/threading.h"
#include "tandem/core/workers.h"
#include "tandem/distribute/cluster_resolver.h"
#include "tandem/distribute/internal/host_reduce.h"
#include "tandem/distribute/internal/state.h"
#include "tandem/tensor/device_runtime.h"

namespace tandem {

namespace {
thread_local ReplicaContext* t_replica_context = nullptr;
thread_local const Strategy* t_scope_strategy = nullptr;
thread_local const void* t_worker_of = nullptr;  // the Strategy::Impl whose replica thread this is
thread_local uint64_t t_run_index = 0;           // which strategy.run this replica thread runs
}  // namespace

ReplicaContext* current_replica_context() { return t_replica_context; }

namespace detail {

const Strategy* current_scope_strategy() { return t_scope_strategy; }

uint64_t current_run_index() { return t_run_index; }

void set_current_replica_context(ReplicaContext* context) { t_replica_context = context; }

std::string describe_exception(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "an exception of unknown type";
  }
}

}  // namespace detail

namespace {

/// Makes `initial` the chief's value in every worker (nullptr: one process). Called only where
/// every worker creates the same variables in the same order (the main thread, in scope()).
using InitialBroadcast = std::function<Tensor(const Tensor&)>;

/// A variable with one copy per device, every copy equal to `initial` (replica 0's value).
Variable mirrored_variable(const std::vector<Device>& devices, std::string name,
                           const Tensor& initial, bool trainable,
                           const InitialBroadcast& broadcast = nullptr) {
  const Tensor first = broadcast ? broadcast(initial) : initial;
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

std::string replica_list(const std::vector<int>& ids) {
  std::ostringstream out;
  out << (ids.size() == 1 ? "replica " : "replicas ");
  for (size_t i = 0; i < ids.size(); ++i) out << (i ? ", " : "") << ids[i];
  return out.str();
}

bool is_aborted(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const collectives::AbortedError&) {
    return true;
  } catch (...) {
    return false;
  }
}

bool is_timeout(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const TimeoutError&) {
    return true;
  } catch (...) {
    return false;
  }
}

/// How long run still waits for a replica once a peer's collective timed out waiting for it
/// (at most the collective timeout): time for the replicas released from that collective to
/// unwind.
constexpr std::chrono::milliseconds kStuckGrace{500};

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

std::vector<Device> parse_devices(const std::vector<std::string>& names) {
  std::vector<Device> devices;
  devices.reserve(names.size());
  for (const std::string& name : names) devices.push_back(Device::parse(name));
  return devices;
}

std::vector<Device> cpu_devices(int count) {
  TANDEM_CHECK(count >= 1, "MirroredStrategy::cpu: needs at least one replica, got ", count);
  std::vector<Device> devices;
  for (int i = 0; i < count; ++i) devices.push_back(Device::cpu(i));
  return devices;
}

/// MirroredStrategy's default devices and the one line that explains the choice.
/// TANDEM_CPU_REPLICAS when set (raising on a bad value), else nothing.
std::optional<int> cpu_replicas_from_env() {
  const char* env = std::getenv("TANDEM_CPU_REPLICAS");
  if (env == nullptr || *env == '\0') return std::nullopt;
  char* end = nullptr;
  const long value = std::strtol(env, &end, 10);
  TANDEM_CHECK(end != env && *end == '\0' && value >= 1 && value <= 4096, "TANDEM_CPU_REPLICAS=\"",
               env, "\" is not a replica count (a whole number >= 1)");
  return static_cast<int>(value);
}

std::vector<Device> default_devices(std::string& report) {
  const std::optional<int> from_env_count = cpu_replicas_from_env();
  const bool from_env = from_env_count.has_value();
  const int replicas = from_env_count.value_or(1);
  const CudaAvailability& cuda = cuda_availability();
  std::ostringstream out;
  out << "MirroredStrategy: ";
  if (!cuda.devices.empty() && !from_env) {
    // Every visible GPU, one replica each (CUDA_VISIBLE_DEVICES selects them).
    std::vector<Device> gpus;
    out << cuda.devices.size() << " GPU replica" << (cuda.devices.size() == 1 ? "" : "s") << " (";
    for (size_t i = 0; i < cuda.devices.size(); ++i) {
      const CudaDeviceInfo& info = cuda.devices[i];
      gpus.push_back(Device::cuda(static_cast<int>(i)));
      out << (i ? "; " : "") << "cuda:" << i << " " << info.name << ", "
          << info.total_memory_bytes / (1024 * 1024) << " MiB";
    }
    out << ")";
    const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
    if (visible != nullptr) out << " [CUDA_VISIBLE_DEVICES=" << visible << "]";
    report = out.str();
    return gpus;
  }
  if (!cuda.devices.empty()) {
    out << cuda.devices.size() << " GPU" << (cuda.devices.size() == 1 ? "" : "s")
        << " visible, but TANDEM_CPU_REPLICAS asks for CPU replicas";
  } else {
    out << "no CUDA device (" << cuda.reason << ")";
  }
  out << "; using " << replicas << " CPU replica" << (replicas == 1 ? "" : "s");
  if (from_env) {
    out << " (TANDEM_CPU_REPLICAS=" << replicas << ")";
  } else {
    out << " (set TANDEM_CPU_REPLICAS for more)";
  }
  if (replicas > hardware_cores())
    out << "; " << replicas << " replicas share " << hardware_cores() << " cores";
  report = out.str();
  return cpu_devices(replicas);
}

}  // namespace

#if TANDEM_WITH_MPI
namespace {
/// The workers of an MPI job, for metrics and checkpoints (core/workers.h).
class MpiWorkerGroup final : public WorkerGroup {
 public:
  explicit MpiWorkerGroup(std::shared_ptr<collectives::MpiWorld> world)
      : world_(std::move(world)) {}
  int num_workers() const override { return world_->size(); }
  int worker_index() const override { return world_->rank(); }
  void sum(std::vector<double>& values, const char* label) override {
    if (values.empty()) return;
    std::vector<Tensor> tensor = {
        Tensor::from_vector(values, Shape({static_cast<int64_t>(values.size())}))};
    world_->all_reduce(tensor, ReduceOp::kSum, label);
    values = tensor[0].to_vector<double>();
  }
  std::vector<std::vector<char>> all_gather(const std::vector<char>& mine,
                                            const char* label) override {
    return world_->all_gather(mine, label);
  }

 private:
  std::shared_ptr<collectives::MpiWorld> world_;
};
}  // namespace
#endif

// ---- Strategy::Impl and the replica threads -------------------------------------------------

struct Strategy::Impl {
  std::string name;
  std::vector<Device> devices;
  int num_replicas = 1;
  Execution execution = Execution::kThreads;
  bool is_default = false;

  // The rendezvous of the replicas (merge_call, argument checks, aborts) and, unless `nccl`
  // is set, their collectives too.
  std::shared_ptr<collectives::InProcessGroup> group;
  int num_workers = 1;
  int worker_index = 0;
  InitialBroadcast broadcast_initial;  // set with several workers
#if TANDEM_WITH_MPI
  std::shared_ptr<collectives::MpiWorld> world;        // several workers
  std::shared_ptr<WorkerGroup> worker_group;           // installed for metrics and checkpoints
  std::shared_ptr<WorkerGroup> previous_worker_group;  // given back when this strategy ends
  std::vector<std::unique_ptr<collectives::HierarchicalCommunicator>> hierarchical;
#endif
#if TANDEM_WITH_NCCL
  std::shared_ptr<collectives::NcclGroup> nccl;  // replicas on several GPUs
#endif
  detail::MergeState merge;
  std::vector<std::unique_ptr<ReplicaContext>> contexts;

  // The hand-off between run() and the replica threads: run publishes a task and bumps
  // `generation`; each thread runs it once and decrements `pending`; run waits for zero.
  // Both counters change under `mutex` (so condition-variable waits never miss an update) and
  // are atomic so that waiters can poll them briefly before sleeping.
  std::mutex mutex;
  std::condition_variable work_cv;
  std::condition_variable done_cv;
  std::atomic<uint64_t> generation{0};
  std::atomic<int> pending{0};
  bool stop = false;
  // How replica threads poll for the next run before sleeping: pause when they and the caller
  // each have a core, yield otherwise. The caller always yields while it waits for a run to
  // finish, so that it never takes a core from a replica's compute threads.
  detail::SpinPolicy worker_spin = detail::SpinPolicy::kYield;
  detail::ReplicaTask task{nullptr, nullptr, nullptr};
  std::vector<std::exception_ptr> errors;  // per replica, for the current run
  std::vector<char> finished;              // per replica: returned from the current run
  // Set (under `mutex`) when a run gave up on replicas that did not return: the strategy then
  // refuses every later call, and its destructor leaves the stuck threads this state.
  std::string broken;
  // GPU replicas: the caller's stream -> replica streams at the start of a run (what the caller
  // queued, e.g. input copies, is done before a replica uses it), and replica streams -> the
  // caller's stream at the end (results are complete before the caller uses them). Events
  // only: no host thread waits for a GPU. Unused (no-ops) for CPU replicas.
  bool any_gpu = false;
  std::vector<StreamEvent> run_start;  // per replica, recorded by the caller
  std::vector<StreamEvent> run_end;    // per replica, recorded by the replica
  std::vector<std::thread> threads;
  std::mutex run_mutex;  // one run at a time (runs from several user threads queue here)

  /// Ends the replica threads; returns how many it had to detach (stuck in a replica function).
  int stop_threads() {
    int detached = 0;
    std::vector<char> returned;
    {
      std::lock_guard<std::mutex> lock(mutex);
      stop = true;
      // After a run gave up on replicas, only those that have returned since can be joined.
      returned = broken.empty() ? std::vector<char>(threads.size(), 1) : finished;
    }
    work_cv.notify_all();
    for (size_t r = 0; r < threads.size(); ++r) {
      if (!threads[r].joinable()) continue;
      // A thread still inside a replica function may never return: it keeps running
      // (detached) with this state, which the destructor then leaves to it.
      if (returned[r]) {
        threads[r].join();
      } else {
        threads[r].detach();
        ++detached;
      }
    }
    threads.clear();
    return detached;
  }

  bool is_broken() {
    std::lock_guard<std::mutex> lock(mutex);
    return !broken.empty();
  }

  /// Raises at once once a run has given up on a replica (see wait_for_replicas). `what` names
  /// the call ("run", "reduce", ...).
  void check_usable(const char* what) {
    std::lock_guard<std::mutex> lock(mutex);
    TANDEM_CHECK(broken.empty(), name, ".", what, ": the strategy is unusable: an earlier run ",
                 "gave up on its replicas: ", broken,
                 ". Its replica threads may still be running user code; create a new strategy "
                 "(or end the process)");
  }

  /// Waits for every replica to return from the current run. A replica that has not returned
  /// within the collective timeout after the first one did is stuck in user code (a collective
  /// would have raised by then); so is one still running kStuckGrace after a peer's collective
  /// timed out (the peer waited a whole timeout for it already, and the replicas waiting with
  /// it are released at once). run gives up on it: the strategy becomes unusable, the peers are
  /// released from their collectives, and run raises on the calling thread instead of waiting
  /// for a thread that may never come back.
  void wait_for_replicas() {
    using Clock = std::chrono::steady_clock;
    std::unique_lock<std::mutex> lock(mutex);
    auto all_done = [&] { return pending.load(std::memory_order_acquire) == 0; };
    auto any_done = [&] { return pending.load(std::memory_order_acquire) < num_replicas; };
    done_cv.wait(lock, any_done);
    const std::chrono::milliseconds timeout = collectives::collective_timeout();
    const std::chrono::milliseconds grace = std::min(timeout, kStuckGrace);
    Clock::time_point deadline = Clock::now() + timeout;
    int timed_out = -1;  // a replica whose collective timed out (its error is a TimeoutError)
    // Each replica notifies done_cv when it returns, so the deadline is revised at each return.
    while (!all_done()) {
      for (int r = 0; r < num_replicas && timed_out < 0; ++r) {
        const std::exception_ptr& error = errors[static_cast<size_t>(r)];
        if (finished[static_cast<size_t>(r)] && error && is_timeout(error)) {
          timed_out = r;
          deadline = std::min(deadline, Clock::now() + grace);
        }
      }
      if (done_cv.wait_until(lock, deadline) == std::cv_status::timeout) break;
    }
    if (all_done()) return;

    std::vector<int> stuck, returned;
    for (int r = 0; r < num_replicas; ++r)
      (finished[static_cast<size_t>(r)] ? returned : stuck).push_back(r);
    // What the replicas that returned raised: the first one's own error (not the AbortedError
    // of a replica released because of another's failure).
    int cause = -1;
    for (int r : returned) {
      const std::exception_ptr& error = errors[static_cast<size_t>(r)];
      if (error &&
          (cause < 0 || (is_aborted(errors[static_cast<size_t>(cause)]) && !is_aborted(error))))
        cause = r;
    }
    const double seconds = static_cast<double>(timeout.count()) / 1000.0;
    std::string reason =
        timed_out >= 0
            ? detail::str_cat(replica_list(stuck),
                              " did not return from the replica function: replica ", timed_out,
                              "'s collective timed out after ", seconds,
                              " s (TANDEM_COLLECTIVE_TIMEOUT) waiting for it, and it was still "
                              "running ",
                              static_cast<double>(grace.count()) / 1000.0, " s later")
            : detail::str_cat(replica_list(stuck), " did not return from the replica function ",
                              "within ", seconds, " s (TANDEM_COLLECTIVE_TIMEOUT) after ",
                              replica_list(returned), " finished");
    if (cause >= 0)
      reason += detail::str_cat("; replica ", cause, " raised: ",
                                detail::describe_exception(errors[static_cast<size_t>(cause)]));
    broken = reason;
    lock.unlock();
    group->abort(reason);  // a stuck replica that later enters a collective raises at once
    throw TimeoutError(detail::str_cat(
        name, ".run: ", reason,
        ". The strategy is unusable from now on: every later call raises at once, and the "
        "stuck replica threads are left running"));
  }
};

namespace {

void replica_thread_main(Strategy::Impl* impl, int id) {
  // Thread budget: replicas split the cores, so replicas x compute threads <= cores.
  set_compute_threads(std::max(1, hardware_cores() / impl->num_replicas));
  set_current_replica_binding({id, impl->num_replicas, impl->worker_index * impl->num_replicas,
                               impl->num_workers * impl->num_replicas});
  // Variables created inside run (a model built on first use, optimizer slots) are mirrored
  // too; code that creates them lazily does so once, under its own lock, not once per replica.
  set_variable_creator(mirrored_creator(impl->devices));
  t_worker_of = impl;
  ReplicaContext& ctx = *impl->contexts[static_cast<size_t>(id)];
  t_replica_context = &ctx;

  uint64_t seen = 0;
  for (;;) {
    detail::ReplicaTask task{nullptr, nullptr, nullptr};
    // Training loops call run back to back: poll for the next generation a moment first.
    detail::spin_wait([&] { return impl->generation.load(std::memory_order_acquire) != seen; },
                      impl->worker_spin);
    {
      // Sleeps until run() publishes a new generation (or the strategy shuts down).
      std::unique_lock<std::mutex> lock(impl->mutex);
      impl->work_cv.wait(lock, [&] { return impl->stop || impl->generation != seen; });
      if (impl->stop) return;
      seen = impl->generation;
      task = impl->task;
    }
    t_run_index = seen;
    {
      // Scoped so that this thread's reference to the exception is gone before the decrement
      // below lets run() read, re-raise and free it.
      std::exception_ptr error;
      try {
        impl->run_start[static_cast<size_t>(id)].wait();
        task.call(task.object, ctx);
        impl->run_end[static_cast<size_t>(id)].record(ctx.device());
      } catch (...) {
        error = std::current_exception();
      }
      if (error) {
        // Releases the peers: whoever waits in (or later enters) a collective this replica
        // will never join raises AbortedError at once instead of waiting for the timeout.
        impl->group->abort(detail::str_cat(
            "replica ", id, " raised an exception: ", detail::describe_exception(error)));
        impl->errors[static_cast<size_t>(id)] = std::move(error);
      } else {
        // Peers still waiting for a collective this replica never made raise at once.
        impl->group->depart(id);
      }
    }
    {
      // After this decrement the caller may return: nothing of the task is touched below. The
      // caller learns of every return, not only the last: it times the stragglers from the first.
      std::lock_guard<std::mutex> lock(impl->mutex);
      impl->finished[static_cast<size_t>(id)] = 1;
      impl->pending.fetch_sub(1, std::memory_order_acq_rel);
      impl->done_cv.notify_all();
    }
  }
}

}  // namespace

Strategy::Strategy(std::string name, std::vector<Device> devices, Execution execution, Scope scope)
    : impl_(std::make_unique<Impl>()) {
  validate_devices(name, devices);
  Impl& impl = *impl_;
  impl.name = std::move(name);
  impl.devices = std::move(devices);
  impl.num_replicas = static_cast<int>(impl.devices.size());
  for (const Device& d : impl.devices) impl.any_gpu = impl.any_gpu || d.is_cuda();
  impl.execution = execution;
  impl.worker_spin = impl.num_replicas < hardware_cores() ? detail::SpinPolicy::kPause
                                                          : detail::SpinPolicy::kYield;
  TANDEM_CHECK(execution == Execution::kThreads || impl.num_replicas == 1, impl.name,
               ": inline execution needs exactly one replica");
  // Replicas on distinct GPUs reduce with NCCL; CPU replicas, and logical replicas sharing
  // one GPU, with the in_process backend (through device memory on a GPU).
  std::vector<Device> distinct;
  for (const Device& d : impl.devices)
    if (std::find(distinct.begin(), distinct.end(), d) == distinct.end()) distinct.push_back(d);
  const bool several_gpus =
      impl.devices.front().is_cuda() && distinct.size() > 1 && scope == Scope::kProcess;
  if (several_gpus) {
    TANDEM_CHECK(distinct.size() == impl.devices.size(), impl.name, ": replicas on ",
                 distinct.size(), " GPUs with some GPUs listed more than once; use each GPU once, ",
                 "or list one GPU several times (logical replicas sharing it)");
#if TANDEM_WITH_NCCL
    impl.nccl = collectives::NcclGroup::create(impl.devices);
    impl.group = std::shared_ptr<collectives::InProcessGroup>(impl.nccl, &impl.nccl->host_group());
#else
    throw NotBuiltError(detail::str_cat(impl.name, ": replicas on ", distinct.size(),
                                        " GPUs need NCCL, which this build does not have"));
#endif
  } else {
    impl.group = collectives::InProcessGroup::create(impl.num_replicas);
  }
  if (scope == Scope::kWorkers) {
#if TANDEM_WITH_MPI
    impl.world = collectives::MpiWorld::instance();
    impl.num_workers = impl.world->size();
    impl.worker_index = impl.world->rank();
    set_process_replica_offset(impl.worker_index * impl.num_replicas);
    if (impl.num_workers > 1) {
      // Global replica ids (worker x local replicas + local id) need the same count everywhere.
      std::vector<Tensor> counts = {Tensor::from_vector(
          std::vector<int64_t>{impl.num_replicas, -static_cast<int64_t>(impl.num_replicas)})};
      impl.world->all_reduce(counts, ReduceOp::kMax, "local replica counts");
      const std::vector<int64_t> range = counts[0].to_vector<int64_t>();
      TANDEM_CHECK(range[0] == -range[1], impl.name,
                   ": every worker needs the same number of local replicas; worker ",
                   impl.worker_index, " has ", impl.num_replicas, ", and the workers have between ",
                   -range[1], " and ", range[0]);
    }
    if (impl.any_gpu) {
      // GPU replicas: one NCCL communicator over every worker's GPUs, its unique id made by
      // the chief and sent over MPI. Each worker's GPUs must be distinct.
#if TANDEM_WITH_NCCL
      TANDEM_CHECK(distinct.size() == impl.devices.size(), impl.name,
                   ": a worker's GPU replicas must be on distinct GPUs (NCCL takes one rank per "
                   "GPU), got ",
                   impl.devices.size(), " replicas on ", distinct.size(), " GPUs");
      collectives::NcclGroup::Spanning spanning;
      spanning.first_rank = impl.worker_index * impl.num_replicas;
      spanning.total_ranks = impl.num_workers * impl.num_replicas;
      std::vector<Tensor> id = {Tensor::zeros({128}, DType::kUInt8)};
      if (impl.worker_index == 0) {
        spanning.unique_id = collectives::NcclGroup::unique_id();
        std::memcpy(id[0].raw_data(), spanning.unique_id.data(), 128);
      }
      impl.world->broadcast(id, 0, "nccl unique id");
      std::memcpy(spanning.unique_id.data(), id[0].raw_data(), 128);
      impl.nccl = collectives::NcclGroup::create(impl.devices, spanning);
      impl.group =
          std::shared_ptr<collectives::InProcessGroup>(impl.nccl, &impl.nccl->host_group());
#else
      throw NotBuiltError(impl.name +
                          ": GPU replicas across workers need NCCL, which this "
                          "build does not have");
#endif
    }
    auto shared = std::make_shared<std::vector<Tensor>>();
    if (!impl.any_gpu)
      for (int r = 0; r < impl.num_replicas; ++r)
        impl.hierarchical.push_back(std::make_unique<collectives::HierarchicalCommunicator>(
            impl.world, &impl.group->communicator(r), shared));
    std::shared_ptr<collectives::MpiWorld> world = impl.world;
    if (impl.num_workers > 1) {
      impl.worker_group = std::make_shared<MpiWorkerGroup>(world);
      impl.previous_worker_group = set_worker_group(impl.worker_group);
    }
    impl.broadcast_initial = [world](const Tensor& initial) {
      std::vector<Tensor> value = {initial.to(Device::cpu()).clone()};
      world->broadcast(value, 0, "initial variable value");
      return value[0];
    };
#else
    throw NotBuiltError(impl.name +
                        ": needs Open MPI, which this build does not have "
                        "(install libopenmpi-dev and configure with -DTANDEM_ENABLE_MPI=ON)");
#endif
  }
  impl.merge.arguments.assign(static_cast<size_t>(impl.num_replicas), nullptr);
  impl.errors.assign(static_cast<size_t>(impl.num_replicas), nullptr);
  impl.finished.assign(static_cast<size_t>(impl.num_replicas), 0);
  impl.run_start.resize(static_cast<size_t>(impl.num_replicas));
  impl.run_end.resize(static_cast<size_t>(impl.num_replicas));
  for (int r = 0; r < impl.num_replicas; ++r) {
    collectives::InProcessCommunicator* sync = &impl.group->communicator(r);
    collectives::Communicator* comm = sync;
#if TANDEM_WITH_MPI
    if (!impl.hierarchical.empty()) comm = impl.hierarchical[static_cast<size_t>(r)].get();
#endif
#if TANDEM_WITH_NCCL
    if (impl.nccl) comm = &impl.nccl->communicator(r);
#endif
    impl.contexts.push_back(std::unique_ptr<ReplicaContext>(new ReplicaContext(
        this, impl.worker_index * impl.num_replicas + r, impl.num_workers * impl.num_replicas,
        impl.devices[static_cast<size_t>(r)], comm, sync, &impl.merge)));
  }
  if (execution == Execution::kThreads) {
    try {
      for (int r = 0; r < impl.num_replicas; ++r)
        impl.threads.emplace_back(replica_thread_main, &impl, r);
    } catch (...) {
      impl.stop_threads();
      throw;
    }
  }
}

Strategy::~Strategy() {
  // Never blocks on a replica stuck in user code: stop_threads detaches it instead of joining.
  const int detached = impl_->stop_threads();
#if TANDEM_WITH_MPI
  if (impl_->worker_group && worker_group() == impl_->worker_group)
    set_worker_group(impl_->previous_worker_group);
#endif
  if (detached > 0) {
    // Replica threads that never returned still hold this state: it stays theirs for the life
    // of the process (kept in a list, so it is not reported as a leak), and the process can
    // exit while they run.
    static std::mutex abandoned_mutex;
    static auto* abandoned = new std::vector<std::unique_ptr<Impl>>();
    TANDEM_LOG_WARNING(impl_->name, " ended with ", detached, " replica thread",
                       detached == 1 ? "" : "s", " still running (detached): ", impl_->broken);
    std::lock_guard<std::mutex> lock(abandoned_mutex);
    abandoned->push_back(std::move(impl_));
  }
}

const std::string& Strategy::name() const { return impl_->name; }
void Strategy::mark_default() { impl_->is_default = true; }
int Strategy::num_replicas_in_sync() const { return impl_->num_replicas * impl_->num_workers; }
int Strategy::num_local_replicas() const { return impl_->num_replicas; }
int Strategy::num_workers() const { return impl_->num_workers; }
int Strategy::worker_index() const { return impl_->worker_index; }
const std::vector<Device>& Strategy::devices() const { return impl_->devices; }

collectives::Communicator& Strategy::communicator(int replica) const {
  TANDEM_CHECK(replica >= 0 && replica < impl_->num_replicas, name(), ": no replica ", replica,
               " (", impl_->num_replicas, " replicas)");
#if TANDEM_WITH_NCCL
  if (impl_->nccl) return impl_->nccl->communicator(replica);
#endif
#if TANDEM_WITH_MPI
  if (!impl_->hierarchical.empty()) return *impl_->hierarchical[static_cast<size_t>(replica)];
#endif
  return impl_->group->communicator(replica);
}

void Strategy::check_per_replica_size(size_t size) const {
  TANDEM_CHECK(size == static_cast<size_t>(impl_->num_replicas), name(),
               ".run: a PerReplica argument holds ", size, " values but the strategy has ",
               impl_->num_replicas, " replicas");
}

void Strategy::execute(detail::ReplicaTask task) {
  Impl& impl = *impl_;
  TANDEM_CHECK(t_worker_of != &impl && t_replica_context == nullptr, impl.name,
               ".run was called from inside a replica function (or a merge_call function); "
               "strategy.run cannot nest. Call the function directly instead");
  std::lock_guard<std::mutex> run_lock(impl.run_mutex);
  impl.check_usable("run");
  std::fill(impl.errors.begin(), impl.errors.end(), nullptr);
  // No replica is inside a collective between runs, so the group can restart its call numbers
  // (#1 is the first collective of this run) and forget the previous run's abort.
  impl.group->reset();

  if (impl.execution == Execution::kInline) {
    const ReplicaBinding saved = current_replica_binding();
    set_current_replica_binding({0, 1, 0});
    t_replica_context = impl.contexts[0].get();
    t_run_index = ++impl.generation;
    try {
      task.call(task.object, *impl.contexts[0]);
    } catch (...) {
      impl.errors[0] = std::current_exception();
    }
    t_replica_context = nullptr;
    set_current_replica_binding(saved);
  } else {
    if (impl.any_gpu) {
      for (int r = 0; r < impl.num_replicas; ++r)
        impl.run_start[static_cast<size_t>(r)].record(impl.devices[static_cast<size_t>(r)]);
    }
    {
      std::lock_guard<std::mutex> lock(impl.mutex);
      impl.task = task;
      impl.pending = impl.num_replicas;
      std::fill(impl.finished.begin(), impl.finished.end(), 0);
      ++impl.generation;
    }
    impl.work_cv.notify_all();
    // Every replica finishes (or is released from its collectives) before run returns, so
    // the task and its captures on this stack stay valid while any thread uses them...
    auto all_done = [&] { return impl.pending.load(std::memory_order_acquire) == 0; };
    if (!detail::spin_wait(all_done, detail::SpinPolicy::kYield)) impl.wait_for_replicas();
    if (impl.any_gpu)
      for (const StreamEvent& end : impl.run_end) end.wait();
  }

  // The cause is the first replica whose error is its own (not AbortedError, which marks a
  // replica released from a collective because of another replica's failure).
  int cause = -1;
  for (int r = 0; r < impl.num_replicas && cause < 0; ++r)
    if (impl.errors[static_cast<size_t>(r)] && !is_aborted(impl.errors[static_cast<size_t>(r)]))
      cause = r;
  for (int r = 0; r < impl.num_replicas && cause < 0; ++r)
    if (impl.errors[static_cast<size_t>(r)]) cause = r;
  if (cause < 0) return;

  const std::exception_ptr error = impl.errors[static_cast<size_t>(cause)];
  std::string message = detail::str_cat("replica ", cause, ": ", detail::describe_exception(error));
  std::vector<int> released;
  for (int r = 0; r < impl.num_replicas; ++r) {
    if (r == cause || !impl.errors[static_cast<size_t>(r)]) continue;
    if (is_aborted(impl.errors[static_cast<size_t>(r)])) {
      released.push_back(r);
    } else {
      message += detail::str_cat(
          " [replica ", r,
          " also failed: ", detail::describe_exception(impl.errors[static_cast<size_t>(r)]), "]");
    }
  }
  if (!released.empty())
    message +=
        detail::str_cat(" [", replica_list(released), released.size() == 1 ? " was" : " were",
                        " released from pending collectives]");
  try {
    std::rethrow_exception(error);
  } catch (const TimeoutError&) {
    throw TimeoutError(message);
  } catch (const NotBuiltError&) {
    throw NotBuiltError(message);
  } catch (...) {
    throw Error(message);
  }
}

// ---- scope and variables ----------------------------------------------------------------------

StrategyScope Strategy::scope() const { return StrategyScope(impl_->is_default ? nullptr : this); }

Variable Strategy::create_variable(std::string name, const Tensor& initial, bool trainable) const {
  return mirrored_variable(impl_->devices, std::move(name), initial, trainable,
                           impl_->broadcast_initial);
}

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

// ---- cross-replica reductions -----------------------------------------------------------------

namespace {
void check_cross_replica(const char* what) {
  TANDEM_CHECK(t_replica_context == nullptr, "strategy.", what,
               " is a cross-replica call: use it outside strategy.run (inside a replica function, "
               "use ctx.all_reduce or ctx.all_gather)");
}
}  // namespace

Tensor Strategy::reduce(ReduceOp op, const PerReplica<Tensor>& value,
                        std::optional<int64_t> axis) const {
  check_cross_replica("reduce");
  impl_->check_usable("reduce");
  TANDEM_CHECK(value.size() == static_cast<size_t>(impl_->num_replicas), name(),
               ".reduce: the PerReplica holds ", value.size(), " values but the strategy has ",
               impl_->num_replicas, " replicas");
  const bool workers = impl_->num_workers > 1;
  if (!axis && !workers) return detail::combine_elementwise(value.values(), op, "strategy.reduce");
  if (!axis) {
    // Several workers: this worker's SUM (or MAX), then across workers; kMean divides by every
    // replica of the job.
    const ReduceOp partial = op == ReduceOp::kMax ? ReduceOp::kMax : ReduceOp::kSum;
    Tensor total = detail::combine_elementwise(value.values(), partial, "strategy.reduce")
                       .to(Device::cpu())
                       .clone();
    across_workers(total, partial);
    if (op != ReduceOp::kMean) return total;
    return detail::divide_by(total, static_cast<double>(num_replicas_in_sync()));
  }

  // With an axis: reduce each replica's value over it, combine, and for kMean divide by the
  // total length of that axis over all replicas (not by the replica count).
  const ReduceOp partial_op = op == ReduceOp::kMax ? ReduceOp::kMax : ReduceOp::kSum;
  std::vector<Tensor> partials;
  double count = 0;
  for (const Tensor& v : value.values()) {
    TANDEM_CHECK(v.defined() && v.rank() > 0, "strategy.reduce: axis ", *axis,
                 " given, but a replica's value is ", v.defined() ? "a scalar" : "undefined");
    const int64_t length = v.dim(*axis);
    count += static_cast<double>(length);
    if (op == ReduceOp::kMax && length == 0) continue;  // an empty replica adds nothing
    partials.push_back(detail::reduce_over_axis(v, *axis, partial_op, "strategy.reduce"));
  }
  TANDEM_CHECK(!partials.empty(), "strategy.reduce(max, axis ", *axis,
               "): every replica's value is empty along that axis");
  Tensor total = detail::combine_elementwise(partials, partial_op, "strategy.reduce");
  if (workers) {
    total = total.to(Device::cpu()).clone();
    across_workers(total, partial_op);
    Tensor counted = Tensor::scalar(count, DType::kFloat64);
    across_workers(counted, ReduceOp::kSum);
    count = counted.item<double>();
  }
  if (op != ReduceOp::kMean) return total;
  TANDEM_CHECK(count > 0 || is_floating(total.dtype()), "strategy.reduce(mean, axis ", *axis,
               "): no element along the axis on any replica, and ", total.dtype(), " has no NaN");
  return detail::divide_by(total, count);
}

Tensor Strategy::reduce(ReduceOp op, const Tensor& value, std::optional<int64_t> axis) const {
  check_cross_replica("reduce");
  impl_->check_usable("reduce");
  const int n = impl_->num_replicas;
  TANDEM_CHECK(op != ReduceOp::kSum || n == 1, name(),
               ".reduce(sum, value): the value is a plain Tensor, not a PerReplica, and the "
               "strategy has ",
               n,
               " replicas. A non-distributed value is the same on every "
               "replica, so it has no per-replica parts to add (summing would count it ",
               n,
               " times). Pass the PerReplica<Tensor> that strategy.run returned, or reduce with "
               "ReduceOp::kMean");
  TANDEM_CHECK(value.defined(), name(), ".reduce: the value is undefined");
  if (!axis) return value;
  Tensor total = detail::reduce_over_axis(
      value, *axis, op == ReduceOp::kMax ? ReduceOp::kMax : ReduceOp::kSum, "strategy.reduce");
  if (op != ReduceOp::kMean) return total;
  return detail::divide_by(total, static_cast<double>(value.dim(*axis)));
}

void Strategy::across_workers(Tensor& value, ReduceOp op) const {
  if (impl_->num_workers == 1) return;
#if TANDEM_WITH_MPI
  std::vector<Tensor> values = {value};
  impl_->world->all_reduce(values, op, "strategy.reduce");
#else
  (void)value;
  (void)op;
#endif
}

void Strategy::install_end_of_data_agreement(data::DistributedDataset& dataset) const {
  if (impl_->num_workers == 1) return;
  // One small all-reduce per step (MAX of "I have a batch"), on the thread iterating.
  const Strategy* self = this;
  dataset.set_end_of_data_agreement([self](bool mine) {
    Tensor flag = Tensor::scalar(mine ? 1.0 : 0.0, DType::kInt32);
    self->across_workers(flag, ReduceOp::kMax);
    return flag.item<int32_t>() > 0;
  });
}

std::vector<char> Strategy::broadcast_from_chief(std::vector<char> bytes) const {
  check_cross_replica("broadcast_from_chief");
  impl_->check_usable("broadcast_from_chief");
  if (impl_->num_workers == 1) return bytes;
#if TANDEM_WITH_MPI
  std::vector<Tensor> size = {Tensor::scalar(static_cast<double>(bytes.size()), DType::kInt64)};
  impl_->world->broadcast(size, 0, "broadcast_from_chief (size)");
  const int64_t n = size[0].item<int64_t>();
  std::vector<Tensor> data = {Tensor::empty({n}, DType::kUInt8)};
  if (is_chief() && n > 0) std::memcpy(data[0].raw_data(), bytes.data(), static_cast<size_t>(n));
  impl_->world->broadcast(data, 0, "broadcast_from_chief");
  bytes.resize(static_cast<size_t>(n));
  if (n > 0) std::memcpy(bytes.data(), data[0].raw_data(), static_cast<size_t>(n));
#endif
  return bytes;
}

Tensor Strategy::reduce_across_workers(ReduceOp op, const Tensor& value) const {
  check_cross_replica("reduce_across_workers");
  impl_->check_usable("reduce_across_workers");
  TANDEM_CHECK(value.defined(), name(), ".reduce_across_workers: the value is undefined");
  if (impl_->num_workers == 1) return value;
  Tensor total = value.to(Device::cpu()).clone();
  across_workers(total, op);
  return total;
}

Tensor Strategy::gather(const PerReplica<Tensor>& value, int64_t axis) const {
  check_cross_replica("gather");
  impl_->check_usable("gather");

  TANDEM_CHECK(value.size() == static_cast<size_t>(impl_->num_replicas), name(),
               ".gather: the PerReplica holds ", value.size(), " values but the strategy has ",
               impl_->num_replicas, " replicas");
  Tensor mine = detail::concat_along(value.values(), axis, "strategy.gather");
  if (impl_->num_workers == 1) return mine;
#if TANDEM_WITH_MPI
  // Every worker's part, in worker order (so in global replica order).
  std::vector<Tensor> parts;
  for (std::vector<Tensor>& worker :
       impl_->world->all_gather_tensors({mine.to(Device::cpu())}, "strategy.gather"))
    parts.push_back(std::move(worker.at(0)));
  return detail::concat_along(parts, axis, "strategy.gather");
#else
  return mine;
#endif
}

// ---- input -------------------------------------------------------------------------------------

data::DistributedDataset Strategy::distribute_dataset(const data::Dataset& dataset,
                                                      data::DistributeOptions options) const {
  if (impl_->num_workers > 1 && options.num_workers == 1) {
    options.num_workers = impl_->num_workers;
    options.worker_index = impl_->worker_index;
  }
  data::DistributedDataset distributed(dataset, impl_->num_replicas, options);
  distributed.set_devices(impl_->devices);
  install_end_of_data_agreement(distributed);
  return distributed;
}

data::DistributedDataset Strategy::distribute_datasets_from_function(
    std::function<data::Dataset(const data::InputContext&)> fn,
    data::DistributeOptions options) const {
  if (impl_->num_workers > 1 && options.num_workers == 1) {
    options.num_workers = impl_->num_workers;
    options.worker_index = impl_->worker_index;
  }
  data::DistributedDataset distributed =
      data::DistributedDataset::from_function(std::move(fn), impl_->num_replicas, options);
  distributed.set_devices(impl_->devices);
  install_end_of_data_agreement(distributed);
  return distributed;
}

// ---- concrete strategies ----------------------------------------------------------------------

namespace {
std::vector<Device> default_devices_logged() {
  std::string report;
  std::vector<Device> devices = default_devices(report);
  TANDEM_LOG_INFO(report);
  return devices;
}
}  // namespace

MirroredStrategy::MirroredStrategy()
    : Strategy("MirroredStrategy", default_devices_logged(), Execution::kThreads) {}

MirroredStrategy::MirroredStrategy(std::initializer_list<std::string> devices)
    : MirroredStrategy(std::vector<std::string>(devices)) {}

MirroredStrategy::MirroredStrategy(const std::vector<std::string>& devices)
    : Strategy("MirroredStrategy", parse_devices(devices), Execution::kThreads) {}

MirroredStrategy::MirroredStrategy(std::vector<Device> devices)
    : Strategy("MirroredStrategy", std::move(devices), Execution::kThreads) {}

MirroredStrategy MirroredStrategy::cpu(int num_replicas) {
  return MirroredStrategy(cpu_devices(num_replicas));
}

MultiWorkerMirroredStrategy::MultiWorkerMirroredStrategy()
    : MultiWorkerMirroredStrategy(cpu_devices(cpu_replicas_from_env().value_or(1))) {}

MultiWorkerMirroredStrategy::MultiWorkerMirroredStrategy(std::vector<Device> local_devices)
    : Strategy("MultiWorkerMirroredStrategy", std::move(local_devices), Execution::kThreads,
               Scope::kWorkers) {
  const ClusterSpec cluster = ClusterResolver::from_environment();
  if (is_chief()) {
    TANDEM_LOG_INFO("MultiWorkerMirroredStrategy: ", num_workers(), " worker",
                    num_workers() == 1 ? "" : "s", " (", cluster.source, ") x ",
                    num_local_replicas(), " CPU replica", num_local_replicas() == 1 ? "" : "s",
                    " = ", num_replicas_in_sync(), " replicas; this is worker ", worker_index(),
                    ", the chief");
  }
}

std::unique_ptr<Strategy> make_strategy() {
  const ClusterSpec cluster = ClusterResolver::from_environment();
  if (cluster.size > 1) {
    if (!build_info().mpi)
      throw NotBuiltError(detail::str_cat("make_strategy: started as worker ", cluster.rank, " of ",
                                          cluster.size, " (", cluster.source,
                                          ") but this build has no MPI; configure with Open MPI"));
    return std::make_unique<MultiWorkerMirroredStrategy>();
  }
  return std::make_unique<MirroredStrategy>();
}

OneDeviceStrategy::OneDeviceStrategy(Device device)
    : Strategy("OneDeviceStrategy", {device}, Execution::kInline) {}

OneDeviceStrategy::OneDeviceStrategy(const std::string& device)
    : OneDeviceStrategy(Device::parse(device)) {}

namespace {
class DefaultStrategy final : public Strategy {
 public:
  DefaultStrategy() : Strategy("DefaultStrategy", {Device::cpu()}, Execution::kInline) {}
  using Strategy::mark_default;
};
}  // namespace

Strategy& default_strategy() {
  static DefaultStrategy* strategy = [] {
    auto* s = new DefaultStrategy();  // never destroyed: used from static destructors too
    s->mark_default();
    return s;
  }();
  return *strategy;
}

}  // namespace tandem
