// Distributed input: data::DistributedDataset splits each global batch across the replicas
// (tf.distribute's distribute_dataset) or takes per-replica batches from a pipeline built by
// a function of data::InputContext (distribute_datasets_from_function); AutoShardPolicy
// decides how workers divide the input. Independent of the strategy classes.
#pragma once

#include <cstdint>
#include <functional>
#include <iterator>
#include <memory>
#include <vector>

#include "tandem/core/device.h"
#include "tandem/core/per_replica.h"
#include "tandem/data/batch.h"
#include "tandem/data/dataset.h"

namespace tandem::data {

/// What distribute_datasets_from_function's function is told about its input pipeline.
class InputContext {
 public:
  /// Raises unless 0 <= input_pipeline_id < num_input_pipelines and num_replicas_in_sync >= 1.
  explicit InputContext(int64_t num_input_pipelines = 1, int64_t input_pipeline_id = 0,
                        int64_t num_replicas_in_sync = 1);

  /// Number of input pipelines (one per worker).
  int64_t num_input_pipelines() const { return num_input_pipelines_; }
  /// This pipeline's index in [0, num_input_pipelines).
  int64_t input_pipeline_id() const { return input_pipeline_id_; }
  /// Replicas over all workers.
  int64_t num_replicas_in_sync() const { return num_replicas_in_sync_; }
  /// global_batch_size / num_replicas_in_sync; raises, naming both, unless it divides evenly.
  int64_t get_per_replica_batch_size(int64_t global_batch_size) const;

 private:
  int64_t num_input_pipelines_;
  int64_t input_pipeline_id_;
  int64_t num_replicas_in_sync_;
};

/// How workers divide a distributed dataset's input (tf.data.experimental.AutoShardPolicy).
/// With one worker every policy leaves the dataset unchanged.
enum class AutoShardPolicy {
  kOff,   ///< every worker reads everything
  kFile,  ///< files are dealt to workers round-robin; fewer files than workers is an error
  kData,  ///< every worker reads everything and keeps every W-th element
  kAuto,  ///< kFile when the source has at least one file per worker, else kData
};

/// How distribute_dataset splits each global batch across the local replicas.
enum class SplitPolicy {
  /// Sizes differ by at most one, larger first (tf.distribute's split).
  kEven,
  /// In proportion to each replica's measured speed (examples per second of compute, the
  /// replica's task less its time in all-reduces), re-measured every step and smoothed; the
  /// first step is even. For uneven devices: a slower replica gets fewer examples, so the
  /// others stop waiting for it. Gradients stay exact: compute_average_loss divides by the
  /// global batch, not by the replica's share. With several workers, each worker balances its
  /// own replicas; every worker still reads global_batch / workers examples per step.
  kBySpeed,
};

/// What a strategy measured of its latest run: the run's number and each local replica's
/// seconds of compute in it.
struct ReplicaTimes {
  /// The run's number (strategy.run calls counted from 1; 0: none yet).
  uint64_t run = 0;
  /// Seconds of compute of each local replica in that run, in replica order.
  std::vector<double> compute_seconds;
};

/// `rows` split into one size per weight, in proportion to the weights, by largest remainder
/// (ties to the lower index): the sizes add up to `rows`, and each is at least 1 while `rows` is
/// at least the number of weights. Raises unless every weight is positive and finite.
std::vector<int64_t> proportional_split(int64_t rows, const std::vector<double>& weights);

/// How distribute_dataset divides the input (tf.distribute.InputOptions and the dataset's
/// auto-shard option).
struct DistributeOptions {
  /// How the input is divided between workers (none with one worker).
  AutoShardPolicy auto_shard_policy = AutoShardPolicy::kAuto;
  /// Even, or in proportion to the replicas' speed (distribute_dataset only).
  SplitPolicy split = SplitPolicy::kEven;
  /// Workers (processes) reading this input, and this worker's index; set by the
  /// multi-worker strategy.
  int64_t num_workers = 1;
  /// This worker's index in [0, num_workers).
  int64_t worker_index = 0;
};

/// Per-replica batches, one step at a time. The object is stateful: it remembers the epoch
/// and the position within it (copies share that state), so that a training loop can
/// iterate it once per epoch and a checkpoint can save and restore where it is. Use it from
/// one thread (the training loop's); its prefetch threads are internal.
class DistributedDataset {
 public:
  /// `dataset` is batched by the GLOBAL batch size. Each global batch is split across the
  /// `num_replicas` local replicas in sizes that differ by at most one, larger first (7 on 2
  /// replicas: 4 and 3; 1 on 2: 1 and an empty batch of the same trailing shape and dtype).
  /// With several workers, `options.auto_shard_policy` divides the input between them and
  /// each worker batches global_batch / num_workers examples per step.
  DistributedDataset(Dataset dataset, int64_t num_replicas, DistributeOptions options = {});

  /// distribute_datasets_from_function: calls `fn` once for this worker with an
  /// InputContext (num_input_pipelines = workers, input_pipeline_id = worker index,
  /// num_replicas_in_sync = num_replicas x workers); the dataset it returns is batched per
  /// replica, and each step takes one batch from it for each local replica in turn. When it
  /// runs out mid-step the remaining replicas get empty batches.
  static DistributedDataset from_function(std::function<Dataset(const InputContext&)> fn,
                                          int64_t num_replicas, DistributeOptions options = {});

  /// Local replicas (one Batch each per step).
  int64_t num_replicas() const;
  /// Puts replica r's batches on devices[r] (strategy.distribute_dataset passes the strategy's
  /// devices). A GPU replica's batch is copied through page-locked staging on the GPU's copy
  /// stream, overlapping the compute already queued; the replicas' streams wait for the copy
  /// with events. CPU devices keep the batches where they are. Raises unless there is one
  /// device per replica.
  void set_devices(std::vector<Device> devices);
  /// The dataset this worker actually reads (after auto-sharding).
  const Dataset& dataset() const;

  /// Fills `per_replica` with one Batch per replica for the next step and returns true, or
  /// returns false when no replica has data left; the epoch then ends and the next call
  /// starts the next epoch.
  bool next(std::vector<Batch>& per_replica);
  /// With several workers (set by the multi-worker strategy): `any_worker_has_data(mine)`
  /// all-reduces whether this worker still has a batch. Steps go on while any worker has one;
  /// a worker that ran out gives its replicas empty batches meanwhile, so no worker waits at
  /// the last batch. Every worker calls next() the same number of times.
  void set_end_of_data_agreement(std::function<bool(bool)> any_worker_has_data);
  /// One empty Batch per replica shaped like this dataset's batches: what a worker that has
  /// run out feeds its replicas while other workers still have data.
  std::vector<Batch> empty_batches() const;
  /// The epoch the next (or current) step belongs to.
  uint64_t epoch() const;
  /// With SplitPolicy::kBySpeed, how the dataset learns the replicas' speed: `latest_run`
  /// returns what the strategy measured of its latest run (strategy.distribute_dataset installs
  /// it). A measurement counts when it is of the run right after this dataset's previous step,
  /// so steps of other datasets in between (evaluation) do not mislead it.
  void set_replica_timing(std::function<ReplicaTimes()> latest_run);
  /// The sizes the latest step's batch was split into, one per replica.
  std::vector<int64_t> last_split() const;

  /// The position: epoch, and within it the underlying iterator's state. Independent of
  /// the replica count for a split (global-batch) dataset.
  IteratorState save() const;
  /// Returns to a saved position; the next step is the one that would have followed.
  void restore(const IteratorState& state);
  /// Drops any epoch under way; the next step is the first of epoch `epoch` (for a restore
  /// whose data state cannot be used, e.g. after changing the pipeline).
  void set_epoch(uint64_t epoch);

  /// Range-for over the steps of the current epoch (resuming it if it is under way); each step
  /// is a PerReplica<Batch>, ready to pass to strategy.run.
  class StepCursor {
   public:
    /// Takes `owner`'s next step (logs when that step is not the first of its epoch).
    explicit StepCursor(DistributedDataset* owner);
    /// The current step's batches, one per local replica.
    const PerReplica<Batch>& operator*() const { return current_; }
    /// The current step's batches, one per local replica.
    const PerReplica<Batch>* operator->() const { return &current_; }
    /// Takes the next step.
    StepCursor& operator++();
    /// True once the epoch has no step left.
    bool operator==(std::default_sentinel_t) const { return done_; }

   private:
    DistributedDataset* owner_;
    PerReplica<Batch> current_;
    bool done_ = false;
  };
  /// The first step of this loop: the next step of the epoch under way, or the first step of
  /// the next epoch.
  StepCursor begin() { return StepCursor(this); }
  /// The end of the epoch.
  std::default_sentinel_t end() const { return {}; }

 private:
  struct State;
  /// The sizes this step's global batch of `rows` is split into (DistributeOptions::split).
  std::vector<int64_t> split(int64_t rows);
  /// next() without its timeline span.
  bool next_step(std::vector<Batch>& per_replica);
  /// The next step's batches from this worker's input; false when it has none left.
  bool pull(std::vector<Batch>& per_replica);
  /// The epoch is over everywhere: the next call starts the next one.
  void end_epoch();
  DistributedDataset(std::shared_ptr<State> state) : state_(std::move(state)) {}
  std::shared_ptr<State> state_;
};

/// The dataset one worker reads under `policy` (exposed for tests and the multi-worker
/// strategy): kData inserts shard(W, index) just before the first batch and kFile deals the
/// source's files; both divide that batch's size by W (which must divide it).
Dataset auto_shard(const Dataset& dataset, AutoShardPolicy policy, int64_t num_workers,
                   int64_t worker_index);

}  // namespace tandem::data
