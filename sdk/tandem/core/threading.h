// The CPU thread budget: how many compute threads (OpenMP/oneDNN) the calling thread may use.
// Each replica thread sets its own share so that replicas x threads never exceed the cores.
#pragma once

namespace tandem {

/// Cores available to this process (sched_getaffinity), at least 1.
int hardware_cores();
/// Sets the compute-thread count for parallel loops started from the calling thread.
void set_compute_threads(int threads);
/// The calling thread's compute-thread count (default: all cores).
int compute_threads();

}  // namespace tandem
