// The per-replica state of a checkpoint (metric partials, gradient accumulators, dropout
// streams), gathered from every worker of a multi-worker job for the chief to write.
// Internal to Checkpoint and CheckpointManager.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tandem/checkpoint/checkpoint.h"
#include "tandem/checkpoint/internal/file_image.h"
#include "tandem/core/workers.h"
#include "tandem/metrics/metrics.h"
#include "tandem/tensor/tensor.h"

namespace tandem::detail {

struct GatheredState {
  int num_workers = 1;
  int64_t num_replicas = 1;  ///< over every worker
  /// Tracked metric name -> SUM of the partials (of every worker, for metrics of the job).
  std::map<std::string, metrics::MetricState> metrics;
  /// Variable name -> its accumulator summed over every replica (mid-accumulation only).
  std::vector<std::pair<std::string, Tensor>> accumulators;
  /// One dropout-stream row {seed, stream, offset, 0} per replica, in global replica order.
  std::vector<std::array<uint64_t, 4>> rng_rows;
  /// Model variable name -> the aggregate over every replica of every worker of a variable
  /// synchronized on read with aggregation kSum or kMean (what the checkpoint stores).
  std::map<std::string, Tensor> on_read;
  /// Slot name -> whole value, on the chief: the optimizer slots it cannot write as they are
  /// (optimizer-state sharding): split among replicas, or held by other workers' replicas
  /// (gathered bucket by bucket).
  std::map<std::string, Tensor> slots;
};

/// This process's state, or with `workers` (several workers) every worker's, combined: a
/// collective that every worker calls, each with the same tracked objects.
GatheredState gather_state(const Checkpoint& checkpoint, WorkerGroup* workers);

/// Checkpoint::write with the gathered state (what the chief of a multi-worker job writes).
void write_gathered(const Checkpoint& checkpoint, const std::string& path,
                    const GatheredState& gathered);
/// What the saves of one CheckpointManager keep from one save to the next so that taking an
/// image costs the caller little more than the copy of the values: what is derived only from
/// the tracked objects' structure, checked against them at every save and remade when it
/// changed (write.cpp).
struct SnapshotCache;
std::shared_ptr<SnapshotCache> make_snapshot_cache();

/// The file write_gathered writes, taken now into host memory (write it with write_image).
/// What only describes the values (the model_signature, the creation time's text) is made
/// when the image is written. `cache` (optional) is used by one thread at a time; `recycled`
/// (optional) is the emptied op list of an earlier image, whose memory this one reuses.
FileImage snapshot_gathered(const Checkpoint& checkpoint, const GatheredState& gathered,
                            SnapshotCache* cache = nullptr, std::vector<ImageOp> recycled = {});

/// "" when every floating-point value of the image's /model_weights and /optimizer_weights is
/// finite; else what is not: the first such variable or slot (its name, dataset, how many of
/// its elements are NaN and Inf, the first index and value) and how many others: the check of
/// a diverged run, made before anything is written. Integer datasets are skipped, and the
/// training state is not looked at here; write_image reads the written file back through
/// validate_checkpoint, which refuses whatever else a restore would.
std::string non_finite_state(const FileImage& image);

}  // namespace tandem::detail
