// Thread budget bookkeeping; OpenMP's nthreads ICV is per thread, so each replica thread's
// omp_set_num_threads governs only the parallel regions that thread starts.
#include "tandem/core/threading.h"

#include <sched.h>

#include <algorithm>
#include <thread>

#ifdef _OPENMP
#include <omp.h>
#endif

namespace tandem {

int hardware_cores() {
  static const int cores = [] {
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
    return std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  }();
  return cores;
}

namespace {
thread_local int t_compute_threads = 0;
}

void set_compute_threads(int threads) {
  t_compute_threads = std::max(1, threads);
#ifdef _OPENMP
  omp_set_num_threads(t_compute_threads);
#endif
}

int compute_threads() { return t_compute_threads > 0 ? t_compute_threads : hardware_cores(); }

}  // namespace tandem
