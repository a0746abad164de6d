// StrategyAccess: the tests' way to the parts of a Strategy that are not its public API: a
// replica's collectives endpoint, its compute figures, a reduction across workers. Library code
// reaches the other workers through core/workers.h instead. Not installed.
#pragma once

#include <string>
#include <vector>

#include "tandem/distribute/strategy.h"

namespace tandem::detail {

struct StrategyAccess {
  /// Replica `replica`'s collectives endpoint (call counters; idle outside run).
  static collectives::Communicator& communicator(const Strategy& strategy, int replica) {
    return strategy.communicator(replica);
  }
  /// The latest run's number and each local replica's compute in it (the speed split's figure).
  static data::ReplicaTimes replica_times(const Strategy& strategy) {
    return strategy.replica_times();
  }
  /// Cross-replica: `value` reduced over every worker (as it is with one worker). Every worker
  /// must call it.
  static Tensor reduce_across_workers(const Strategy& strategy, ReduceOp op, const Tensor& value) {
    return strategy.reduce_across_workers(op, value);
  }
};

}  // namespace tandem::detail
