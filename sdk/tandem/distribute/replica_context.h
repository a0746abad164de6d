// ReplicaContext: the explicit first parameter of every replica function. It names the replica,
// carries its collectives (all_reduce, all_gather, broadcast) and merge_call, the way back to
// cross-replica context.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "tandem/autograd/tape.h"
#include "tandem/collectives/communicator.h"
#include "tandem/collectives/reduce_op.h"
#include "tandem/core/device.h"
#include "tandem/core/per_replica.h"
#include "tandem/optim/gradient_sync.h"
#include "tandem/tensor/tensor.h"

namespace tandem {

class Strategy;

namespace collectives {
class InProcessCommunicator;
}

namespace detail {
/// A merge function with its type erased: run once, on replica 0's thread, with every replica's
/// argument tuple; returns the result (null for void).
struct MergeFn {
  const void* object;
  std::shared_ptr<void> (*call)(const void* object, Strategy& strategy,
                                const void* const* arguments, int num_replicas);
};
/// What the replicas of one strategy share for merge_call (internal/state.h).
struct MergeState;
class GradientReducer;  // internal/gradient_reducer.h
class ReplicaThreads;   // internal/replica_threads.h
class ReplicaScope;     // internal/replica_scope.h
}  // namespace detail

/// Replica `replica_id_in_sync_group()` of the strategy running the current strategy.run.
/// Every replica must make the same collective calls (all_reduce, all_gather, broadcast,
/// merge_call) in the same order; a mismatch or a replica that never arrives raises on every
/// waiting replica (after at most TANDEM_COLLECTIVE_TIMEOUT seconds), never hangs.
/// Collectives here are not recorded on gradient tapes. As an optim::GradientSync it is what
/// optimizer.apply_gradients(ctx, ...) sums the gradients through: with gradient buckets
/// (Strategy::set_communication_options), the sums the replica's buckets computed during the
/// backward pass. It owns those buckets and is their only driver: the replica thread's tapes
/// hand it each gradient as it becomes final (it is the thread's autograd::GradientListener),
/// the optimizer takes the sums from it, and the strategy sets and ends them through it.
class ReplicaContext final : public optim::GradientSync, private autograd::GradientListener {
 public:
  ~ReplicaContext();
  ReplicaContext(const ReplicaContext&) = delete;
  ReplicaContext& operator=(const ReplicaContext&) = delete;

  /// This replica's index in [0, num_replicas_in_sync()).
  int replica_id_in_sync_group() const override { return replica_id_; }
  /// Replicas that run the step in lock-step, over every worker.
  int num_replicas_in_sync() const { return num_replicas_; }
  /// This replica's index among its process's replicas (the index into PerReplica values);
  /// equal to replica_id_in_sync_group() with one worker.
  int local_replica_id() const;
  /// The device this replica computes on.
  Device device() const { return device_; }
  /// The strategy running this replica.
  Strategy& strategy() const { return *strategy_; }

  /// The reduction of `value` across replicas, as a new tensor (the input is not modified).
  /// With one replica it returns `value` itself.
  Tensor all_reduce(ReduceOp op, const Tensor& value);
  /// Reduces every tensor of `values` in ONE batched collective and returns new tensors in the
  /// same order (inputs are not modified; with one replica they are returned as they are).
  /// Undefined entries (variables without a gradient) stay undefined; every replica must
  /// pass the same shapes, dtypes and undefined entries.
  std::vector<Tensor> all_reduce(ReduceOp op, const std::vector<Tensor>& values);
  /// The replicas' values concatenated along `axis` in replica order; they may differ in the
  /// size of that axis (a 4/2 split gathers into 6).
  Tensor all_gather(const Tensor& value, int64_t axis = 0);
  /// Replica `root`'s value, on every replica (a new tensor, except with one replica).
  Tensor broadcast(const Tensor& value, int root = 0);

  /// Runs fn(strategy, PerReplica<Args>...) ONCE, on replica 0's thread, after every replica has
  /// called merge_call; fn runs in cross-replica context and sees, for each argument, every
  /// replica's value. Its result is returned to every replica (each gets a copy). Only replica
  /// 0's `fn` is called. An exception thrown by fn is raised on every replica.
  template <typename Fn, typename... Args>
  auto merge_call(Fn&& fn, const Args&... args);

  /// This replica's endpoint of the strategy's collectives (for call counters, or direct use).
  collectives::Communicator& communicator() const { return *communicator_; }

  /// Gradient buckets currently laid out (0: gradients are reduced after the backward pass)
  /// and the steps whose gradients were reduced in buckets so far.
  size_t num_gradient_buckets() const;
  /// Steps whose gradients were reduced in buckets so far.
  uint64_t bucketed_steps() const;

  /// How this replica's row-sparse gradients (embedding tables) were summed so far: by
  /// gathering the rows the replicas touched, or by the dense all-reduce.
  struct RowSparseCounts {
    /// Row-sparse gradients summed by gathering the rows every replica touched.
    uint64_t gathered = 0;
    /// Row-sparse gradients summed as dense tensors (cheaper when many rows were touched).
    uint64_t dense = 0;
  };
  /// How this replica's row-sparse gradients were summed so far.
  RowSparseCounts row_sparse_counts() const { return row_sparse_counts_; }

 private:
  friend class Strategy;
  friend class detail::ReplicaThreads;
  friend class detail::ReplicaScope;
  ReplicaContext(Strategy* strategy, int replica_id, int num_replicas, Device device,
                 collectives::Communicator* communicator, collectives::InProcessCommunicator* sync,
                 detail::MergeState* merge);

  std::shared_ptr<void> merge_call_erased(const void* my_arguments, detail::MergeFn fn);
  /// optim::GradientSync: all_reduce(kSum, gradients), or the gradient buckets' results.
  std::vector<Tensor> sum_across_replicas(const std::vector<Tensor>& gradients) override;
  /// The same, the row-sparse gradients (on the CPU, float32 or float64, sent uncompressed,
  /// without buckets) summed by gathering their nonzero rows where that moves fewer bytes than
  /// the dense all-reduce, in the in-process reduction's order (row_sparse.cpp).
  std::vector<Tensor> sum_across_replicas(const std::vector<Tensor>& gradients,
                                          const std::vector<bool>& row_sparse) override;
  /// The dense sums of `gradients` and the row-sparse sums of those flagged, every replica
  /// making the same collectives (row_sparse.cpp).
  std::vector<Tensor> sum_with_row_sparse(const std::vector<Tensor>& gradients,
                                          const std::vector<bool>& gather_candidate);
  void expect_micro_step(bool last, const std::vector<Tensor>& accumulators) override;
  /// GradientSync: across workers the shards packed by owner into flat chunks, each
  /// reduce-scattered; in one process each shard reduced to its owner where it lies
  /// (sharded_sync.cpp). The gradient buckets stand by.
  std::vector<Tensor> sum_to_owners(const std::vector<Tensor>& gradients,
                                    const std::vector<Shard>& shards) override;
  /// GradientSync: one replica, or a communicator that reduce-scatters for real and gradients
  /// that travel uncompressed.
  bool reduces_to_owners() const override;
  /// GradientSync: all_reduce(kSum, value).
  Tensor sum_of_shards(const Tensor& value) override;
  /// GradientSync: across workers the shards packed by owner into flat chunks, each
  /// all-gathered in place; in one process each shard copied from its owner (sharded_sync.cpp).
  void gather_from_owners(const std::vector<Tensor>& values,
                          const std::vector<Shard>& shards) override;
  /// Across workers: every replica's description (and the global batch it passed to
  /// compute_average_loss) against the chief's; raises on every replica at the first
  /// difference.
  void agree_before_first_update(
      const std::vector<std::pair<std::string, std::string>>& description) override;
  std::vector<Tensor> sum_accumulated(const std::vector<Tensor>& gradients,
                                      const std::vector<Tensor>& accumulators) override;

  // autograd::GradientListener: the backward passes of this replica's thread, to its buckets.
  bool begin(const std::vector<Tensor>& sources) override;
  void ready(size_t index, const Tensor& gradient) override;
  void end(const std::vector<Tensor>& gradients) override;
  autograd::GradientListener* gradient_listener() { return this; }

  // The strategy's side of the buckets.
  /// Bucket sizes in bytes (0: none) and the type float32 gradients travel in (float32: as
  /// they are); a change lays the buckets out again at the next step.
  void set_communication(int64_t first_bucket_bytes, int64_t bucket_bytes, DType float32_wire);
  /// The batched all-reduce of gradients (kSum), float32 ones sent as the wire type.
  std::vector<Tensor> all_reduce_gradients(const std::vector<Tensor>& gradients);
  /// The end of this replica's task in a run: buckets still in flight are waited for and
  /// dropped; `succeeded`: raise what they raised (otherwise the run failed and the group was
  /// aborted, and the layout is forgotten).
  void finish_task(bool succeeded);
  /// After a run in which any replica failed: every replica lays its buckets out again.
  void forget_bucket_layout();

  Strategy* strategy_;
  int replica_id_;
  int num_replicas_;
  Device device_;
  collectives::Communicator* communicator_;
  collectives::InProcessCommunicator* sync_;  // thread rendezvous for merge_call
  detail::MergeState* merge_;
  std::unique_ptr<detail::GradientReducer> reducer_;  // this replica's gradient buckets
  RowSparseCounts row_sparse_counts_;
};

/// The replica context of the calling thread inside strategy.run, or nullptr in cross-replica
/// context (outside run, or inside a merge_call function).
ReplicaContext* current_replica_context();
/// True outside strategy.run's replica functions (and inside merge_call functions).
inline bool in_cross_replica_context() { return current_replica_context() == nullptr; }

// ---- template definitions ------------------------------------------------------------------

template <typename Fn, typename... Args>
auto ReplicaContext::merge_call(Fn&& fn, const Args&... args) {
  using Pointers = std::tuple<const Args*...>;
  using Result = std::invoke_result_t<Fn&, Strategy&, const PerReplica<Args>&...>;
  using Stored = std::decay_t<Result>;
  using FnType = std::remove_reference_t<Fn>;
  const Pointers mine(&args...);

  auto call = [](const void* object, Strategy& strategy, const void* const* arguments,
                 int num_replicas) -> std::shared_ptr<void> {
    FnType& f = *static_cast<FnType*>(const_cast<void*>(object));
    return [&]<size_t... I>(std::index_sequence<I...>)->std::shared_ptr<void> {
      // Collects argument I of every replica into one PerReplica.
      auto collect = [&]<size_t J>() {
        using A = std::tuple_element_t<J, std::tuple<Args...>>;
        std::vector<A> values;
        values.reserve(static_cast<size_t>(num_replicas));
        for (int r = 0; r < num_replicas; ++r)
          values.push_back(*std::get<J>(*static_cast<const Pointers*>(arguments[r])));
        return PerReplica<A>(std::move(values));
      };
      if constexpr (std::is_void_v<Result>) {
        f(strategy, collect.template operator()<I>()...);
        return nullptr;
      } else {
        return std::make_shared<Stored>(f(strategy, collect.template operator()<I>()...));
      }
    }
    (std::index_sequence_for<Args...>{});
  };

  std::shared_ptr<void> result =
      merge_call_erased(&mine, detail::MergeFn{static_cast<const void*>(std::addressof(fn)), call});
  if constexpr (!std::is_void_v<Result>) return Stored(*static_cast<const Stored*>(result.get()));
}

}  // namespace tandem
