// The Strategy family (tf.distribute): Strategy (the API every strategy shares),
// MirroredStrategy (N replicas in one process, one persistent thread each), OneDeviceStrategy
// and default_strategy() (one replica, collectives are no-ops), and StrategyScope, which mirrors
// the variables created while it lives.
#pragma once

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "tandem/autograd/variable.h"
#include "tandem/collectives/communicator.h"
#include "tandem/collectives/reduce_op.h"
#include "tandem/core/device.h"
#include "tandem/core/per_replica.h"
#include "tandem/data/distributed_dataset.h"
#include "tandem/distribute/replica_context.h"
#include "tandem/tensor/tensor.h"

namespace tandem {

namespace detail {
struct StrategyAccess;  // the library's way to the internals below (internal/strategy_access.h)

/// A replica task with its type erased (no allocation): call(object, ctx).
struct ReplicaTask {
  const void* object;
  void (*call)(const void* object, ReplicaContext& ctx);
  /// Owns `object`; each replica thread holds a copy while it runs the task, so a replica that
  /// returns after run() gave up on it (see Strategy::run) still finds the task alive.
  std::shared_ptr<const void> owner;
};
}  // namespace detail

/// While alive (on the thread that created it), tandem::make_variable creates variables of the
/// strategy: with N replicas, one copy per replica, each initialised from the first copy
/// (replica 0's value, broadcast). Obtain it from strategy.scope(); it must end before the
/// strategy does, on the same thread.
class StrategyScope {
 public:
  /// Takes over `other`'s scope (`other` then ends nothing).
  StrategyScope(StrategyScope&& other) noexcept;
  StrategyScope& operator=(StrategyScope&&) = delete;
  StrategyScope(const StrategyScope&) = delete;
  StrategyScope& operator=(const StrategyScope&) = delete;
  ~StrategyScope();

 private:
  friend class Strategy;
  explicit StrategyScope(const Strategy* strategy);

  const Strategy* strategy_;
  const Strategy* previous_strategy_ = nullptr;
  VariableCreator previous_creator_;
  std::thread::id thread_;
};

/// The type float32 gradients travel in between replicas (CommunicationOptions).
enum class GradientCompression { kNone, kBFloat16, kFloat16 };
/// "none", "bfloat16", "float16".
const char* to_string(GradientCompression compression);

/// How gradients travel between replicas (tf.distribute.experimental.CommunicationOptions'
/// bytes_per_pack; PyTorch DDP's bucket_cap_mb). optimizer.apply_gradients(ctx, ...) sums
/// gradients across the replicas; with buckets (bytes_per_pack > 0, the default) each
/// replica's backward pass (GradientTape::gradient) copies every gradient into a bucket as soon
/// as it is final, and a full bucket's all-reduce starts at once, while the backward pass goes
/// on: communication overlaps compute. The first step lays the buckets out (in the order its
/// backward pass produced the gradients, one dtype per bucket) and reduces after its backward
/// pass; later steps use the buckets. Results are bitwise those of one all-reduce after the
/// backward pass (each element sums the same replicas' values in the same order).
/// Buckets are used when apply_gradients gets the very tensors tape.gradient returned, with
/// the same variables getting a gradient every step (a change raises, naming the variable's
/// index; turn buckets off for such models). With gradient accumulation only the last
/// micro-step before an update reduces: its backward pass packs accumulator + gradient. Loss
/// scaling needs no extra step: compute_average_loss already divides by the global batch.
/// Strategies of GPU replicas, and of CPU workers started from TF_CONFIG with one replica each
/// (Gloo, whose waits sleep), start with the defaults below; other CPU strategies start with
/// buckets off, because there the communication thread spins (in-process) or polls (Open MPI)
/// on a core the compute needs (docs/performance.md has the figures): set them to try.
/// gradient_compression sends float32 gradients as 16-bit values (PyTorch DDP's
/// bf16_compress_hook / fp16_compress_hook), on every transport, with or without buckets.
struct CommunicationOptions {
  /// Bytes per bucket; 0: no buckets (one batched all-reduce in apply_gradients).
  int64_t bytes_per_pack = int64_t{25} << 20;
  /// The first bucket's bytes: small, so that communication starts early in the backward pass.
  int64_t first_bytes_per_pack = int64_t{1} << 20;
  /// kBFloat16 / kFloat16: each replica rounds its float32 gradients to that type (half the
  /// bytes to move); the sum over the replicas adds in float32 (in one process: every
  /// replica's value, rounded once; across workers: each transport's partial sums are rounded
  /// to the 16-bit type between steps, as NCCL's and DDP's are) and comes back as float32 for
  /// the float32 master variables. Every replica gets the same bits. Gradients of other dtypes
  /// travel as they are. float16 overflows above 65504 (a dynamic loss scale then skips the
  /// step); bfloat16 has float32's range and fewer digits. docs/mixed-precision.md.
  GradientCompression gradient_compression = GradientCompression::kNone;
};

/// What every strategy offers (binding names from tf.distribute). Strategies own threads and
/// are neither copied nor moved.
class Strategy {
 public:
  virtual ~Strategy();
  Strategy(const Strategy&) = delete;
  Strategy& operator=(const Strategy&) = delete;

  /// "MirroredStrategy", "OneDeviceStrategy", "DefaultStrategy".
  const std::string& name() const;
  /// Replicas that run each step in lock-step, over every worker.
  int num_replicas_in_sync() const;
  /// This process's replicas (PerReplica values hold one value each).
  int num_local_replicas() const;
  /// Processes of the job (1 unless MultiWorkerMirroredStrategy) and this one's index.
  int num_workers() const;
  /// This process's index among the workers (0: the chief).
  int worker_index() const;
  /// This process's replicas' devices, in replica order.
  const std::vector<Device>& devices() const;
  /// True in the process that writes checkpoints: worker 0 (always, in one process).
  bool is_chief() const { return worker_index() == 0; }

  /// Gradient buckets and compression (see CommunicationOptions). Call outside run; the next
  /// step lays the buckets out again. Raises on negative sizes or an unknown compression.
  void set_communication_options(const CommunicationOptions& options);
  /// The options the next step uses.
  const CommunicationOptions& communication_options() const;

  /// Variables created (tandem::make_variable) while the returned scope lives are mirrored.
  [[nodiscard]] StrategyScope scope() const;

  /// Runs fn(ctx, pieces...) on every replica concurrently and returns PerReplica<R> (nothing
  /// when fn returns void). A PerReplica argument hands replica k its value [k]; any other
  /// argument is passed to every replica by const reference. A step that returns several
  /// values (a std::pair, a std::tuple or a struct) unpacks into one PerReplica each, as
  /// tf.distribute returns a structure of per-replica values:
  ///   auto [losses, correct] = strategy.run(step, batch);  // step returns {loss, correct}
  /// If a replica throws, its peers are released from pending collectives, every replica
  /// finishes, and run raises on this thread one tandem::Error (TimeoutError for timeouts)
  /// whose message starts with the replicas that raised it ("replica 1: " or, when several
  /// raised the same message, "replicas 0, 1: ") followed by the original message; a replica
  /// whose error differs adds " [replica K also failed: ...]". The strategy stays usable.
  /// A replica that has not returned within the collective timeout (TANDEM_COLLECTIVE_TIMEOUT)
  /// after the first one did is stuck in user code (a collective would have raised), and so is
  /// one still running half a second (at most one timeout) after a peer's collective timed out
  /// waiting for it: run then raises TimeoutError naming it and the timeout, and the strategy
  /// becomes unusable (run, reduce, gather and the cross-worker calls raise at once, saying
  /// why; its destructor detaches the stuck thread and leaves it the strategy's state, so the
  /// process can exit). Should that replica's function ever return, its result is discarded;
  /// it must not rely on anything of the caller's that did not outlive run, fn itself included.
  template <typename Fn, typename... Args>
  auto run(Fn&& fn, const Args&... args);

  /// Cross-replica reduction of per-replica tensors. Without `axis`: element-wise across
  /// replicas (shapes must agree; kMean divides by the replica count). With `axis`: that axis
  /// is reduced too, and kMean divides the summed totals by the summed counts along it, so
  /// uneven splits are exact (a batch split 4/2 divides by 6).
  Tensor reduce(ReduceOp op, const PerReplica<Tensor>& value,
                std::optional<int64_t> axis = std::nullopt) const;
  /// A non-distributed value (the same on every replica). kMean and kMax return it (reduced
  /// over `axis` if given); kSum with more than one replica raises, because a value that is
  /// not per-replica has no per-replica parts to add.
  Tensor reduce(ReduceOp op, const Tensor& value, std::optional<int64_t> axis = std::nullopt) const;
  /// A variable's copies, one per replica, reduced as a PerReplica (tf.distribute's reduce of a
  /// distributed variable): kMean of a sync-on-read variable's copies is its aggregate under
  /// kMean, kSum of a mirrored one N times its value. Across workers every worker's copies take
  /// part (a collective: every worker calls it). A variable made outside the strategy's scope
  /// (one copy) is a non-distributed value.
  Tensor reduce(ReduceOp op, const Variable& variable,
                std::optional<int64_t> axis = std::nullopt) const;
  /// The per-replica values concatenated along `axis`, in replica order.
  Tensor gather(const PerReplica<Tensor>& value, int64_t axis = 0) const;
  /// The per-replica values, in replica order.
  template <typename T>
  const std::vector<T>& local_results(const PerReplica<T>& value) const {
    return value.values();
  }

  /// Splits each batch of `dataset` (batched by the GLOBAL batch size) across the replicas:
  /// sizes differ by at most one, larger first, and every replica gets a batch every step.
  data::DistributedDataset distribute_dataset(const data::Dataset& dataset,
                                              data::DistributeOptions options = {}) const;
  /// Calls `fn` once with an InputContext; the dataset it returns is batched per replica.
  data::DistributedDataset distribute_datasets_from_function(
      std::function<data::Dataset(const data::InputContext&)> fn,
      data::DistributeOptions options = {}) const;

 protected:
  /// How replicas execute: each on its own persistent thread, or (one replica) on the calling
  /// thread.
  enum class Execution { kThreads, kInline };
  /// How replicas communicate: within this process, or over every worker of an MPI job.
  enum class Scope { kProcess, kWorkers };
  /// A strategy called `name` (what name() returns) with one replica per device.
  Strategy(std::string name, std::vector<Device> devices, Execution execution,
           Scope scope = Scope::kProcess);
  /// Makes scope() a no-op (default_strategy()).
  void mark_default();

 private:
  friend class StrategyScope;
  friend struct detail::StrategyAccess;
  struct Impl;  // internal/strategy_impl.h

  /// Runs task on every replica and waits; raises the first replica's error as documented in run.
  void execute(detail::ReplicaTask task);
  void check_per_replica_size(size_t size) const;

  // Reached by the tests through detail::StrategyAccess (internal/strategy_access.h); the
  // library reaches the other workers through core/workers.h alone.
  /// Replica `replica`'s collectives endpoint (call counters in tests; idle outside run).
  collectives::Communicator& communicator(int replica) const;
  /// The latest run's number and each local replica's compute in it (its task less its time
  /// outside compute): what SplitPolicy::kBySpeed splits by, and what the timeline shows as
  /// compute (profile::Event::compute_ns). Read between runs.
  data::ReplicaTimes replica_times() const;
  /// Cross-replica: `value` (this worker's own, e.g. a metric's combined totals) reduced over
  /// every worker; returned as it is with one worker. Every worker must call it.
  Tensor reduce_across_workers(ReduceOp op, const Tensor& value) const;

  /// Reduces a CPU tensor in place across workers (no-op with one worker).
  void across_workers(Tensor& value, ReduceOp op) const;
  /// With several workers, makes `dataset` agree with the other workers on the end of data.
  void install_end_of_data_agreement(data::DistributedDataset& dataset) const;

  std::unique_ptr<Impl> impl_;
};

/// N replicas in one process, one persistent worker thread each (created once, reused for every
/// run); each thread's compute-thread budget is max(1, cores / N), so replicas never
/// oversubscribe the cores. Collectives use the in-process backend (fixed reduction order).
class MirroredStrategy : public Strategy {
 public:
  /// Every visible GPU; with none, TANDEM_CPU_REPLICAS CPU replicas (default 1). Logs one line
  /// naming the devices and why.
  MirroredStrategy();
  /// Explicit devices: {"cpu:0", "cpu:1"}; {"cuda:0", "cuda:1"} (NCCL); {"cuda:0", "cuda:0"}
  /// (two replicas sharing a GPU).
  explicit MirroredStrategy(std::initializer_list<std::string> devices);
  /// Explicit devices by name, as above.
  explicit MirroredStrategy(const std::vector<std::string>& devices);
  /// Explicit devices.
  explicit MirroredStrategy(std::vector<Device> devices);
  /// `num_replicas` CPU replicas (logical devices cpu:0 ... cpu:N-1).
  static MirroredStrategy cpu(int num_replicas);
};

/// The replicas of every process of a job (tf.distribute's MultiWorkerMirroredStrategy),
/// started by mpirun or srun, or one by one with TF_CONFIG (docs/multi-worker.md). Each
/// process (worker) runs its local replicas; the global replica id is worker x local replicas +
/// local id; worker 0 is the chief (it alone writes checkpoints). Gradients are reduced
/// in-process among a worker's replicas, then between workers (MPI under a launcher; Gloo over
/// TCP for TF_CONFIG workers, which meet at the chief's address), one call per dtype, then
/// broadcast locally. Variables created in scope() take the chief's initial values. Datasets
/// given to distribute_dataset are sharded across workers (DistributeOptions::auto_shard_policy).
/// GPU replicas (distinct GPUs per worker) share one NCCL communicator over every worker, its
/// unique id broadcast by the chief through the workers' collectives.
class MultiWorkerMirroredStrategy : public Strategy {
 public:
  /// TANDEM_CPU_REPLICAS CPU replicas per worker (default 1).
  MultiWorkerMirroredStrategy();
  /// `local_devices` in every worker, e.g. {"cpu:0", "cpu:1"}.
  explicit MultiWorkerMirroredStrategy(std::vector<Device> local_devices);
};

/// The best strategy for how the program was started, with the one-line device report:
/// MultiWorkerMirroredStrategy under mpirun/srun with more than one process or with a
/// TF_CONFIG of several workers, else
/// MirroredStrategy over the visible GPUs, else one CPU replica (TANDEM_CPU_REPLICAS for more).
std::unique_ptr<Strategy> make_strategy();

/// One replica on `device`, run on the calling thread; collectives are no-ops.
class OneDeviceStrategy : public Strategy {
 public:
  /// One replica on `device` (the CPU by default).
  explicit OneDeviceStrategy(Device device = Device::cpu());
  /// One replica on the device named `device` ("cpu:0", "cuda:1").
  explicit OneDeviceStrategy(const std::string& device);
};

/// The strategy in effect when none is chosen: one replica on the CPU, run on the calling
/// thread, scope() has no effect. Lets the same training loop run without distribution.
Strategy& default_strategy();

// ---- template definitions ------------------------------------------------------------------

namespace detail {
/// Sets what compute_average_loss compares its global_batch_size with on the calling replica
/// thread (the step's examples on every replica; 0: not known).
void set_step_global_batch_size(int64_t examples);
/// The step's examples as a distributed dataset's batch knows them; 0 for other arguments.
inline int64_t step_examples_of(const data::Batch& batch) { return batch.global_batch_size(); }
template <typename A>
int64_t step_examples_of(const A&) {
  return 0;
}
/// The first known step size among a replica's pieces of the run's arguments.
template <typename... Pieces>
int64_t step_examples(const Pieces&... pieces) {
  int64_t examples = 0;
  ((examples = examples != 0 ? examples : step_examples_of(pieces)), ...);
  return examples;
}
}  // namespace detail

template <typename Fn, typename... Args>
auto Strategy::run(Fn&& fn, const Args&... args) {
  // A PerReplica argument must hold one value per replica.
  auto check = [this]<typename A>(const A& argument) {
    if constexpr (detail::is_per_replica_v<A>) check_per_replica_size(argument.size());
  };
  (check(args), ...);
  (void)check;  // no arguments: nothing to check
  using Result = std::invoke_result_t<Fn&, ReplicaContext&, detail::replica_piece_t<Args>...>;
  // The task and the results live on the heap, shared with the replica threads: a replica that
  // returns only after run() gave up on it (stuck past the collective timeout) writes into them,
  // never into this returned frame. (fn and args are the caller's: see the header comment.)
  auto submit = [this](auto closure) {
    auto owner = std::make_shared<decltype(closure)>(std::move(closure));
    execute({owner.get(),
             [](const void* object, ReplicaContext& ctx) {
               (*static_cast<const decltype(closure)*>(object))(ctx);
             },
             owner});
  };
  if constexpr (std::is_void_v<Result>) {
    submit([&fn, &args...](ReplicaContext& ctx) {
      const int id = ctx.local_replica_id();
      (void)id;  // no arguments
      detail::set_step_global_batch_size(detail::step_examples(detail::replica_piece(args, id)...));
      fn(ctx, detail::replica_piece(args, id)...);
    });
  } else {
    using Value = std::decay_t<Result>;
    auto results = std::make_shared<std::vector<std::optional<Value>>>(
        static_cast<size_t>(num_local_replicas()));
    // Each replica writes only its own element, so the threads never share one.
    submit([results, &fn, &args...](ReplicaContext& ctx) {
      const int id = ctx.local_replica_id();
      (void)id;  // no arguments
      detail::set_step_global_batch_size(detail::step_examples(detail::replica_piece(args, id)...));
      (*results)[static_cast<size_t>(id)].emplace(fn(ctx, detail::replica_piece(args, id)...));
    });
    std::vector<Value> values;
    values.reserve(results->size());
    for (std::optional<Value>& r : *results) values.push_back(std::move(*r));
    return PerReplica<Value>(std::move(values));
  }
}

}  // namespace tandem
