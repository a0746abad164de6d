// The per-replica state of a checkpoint (metric partials, gradient accumulators, dropout
// streams), gathered from every worker of a multi-worker job for the chief to write.
// Internal to Checkpoint and CheckpointManager.
#pragma once

#include <array>
#include <cstdint>
#include <map>
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
};

/// This process's state, or with `workers` (several workers) every worker's, combined: a
/// collective that every worker calls, each with the same tracked objects.
GatheredState gather_state(const Checkpoint& checkpoint, WorkerGroup* workers);

/// Checkpoint::write with the gathered state (what the chief of a multi-worker job writes).
void write_gathered(const Checkpoint& checkpoint, const std::string& path,
                    const GatheredState& gathered);
/// The file write_gathered writes, taken now into host memory (write it with write_image).
FileImage snapshot_gathered(const Checkpoint& checkpoint, const GatheredState& gathered);

}  // namespace tandem::detail
