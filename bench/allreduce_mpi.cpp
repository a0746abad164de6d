// Multi-process all-reduce: Tandem's path (MultiWorkerMirroredStrategy's communicator, one CPU
// replica per worker, through ReplicaContext-free Communicator::all_reduce in place) against raw
// MPI_Allreduce on the same buffer, 1 KiB to 256 MiB, float32 sum. Run it under mpirun:
//
//   mpirun -np 2 ./build/bench/bench_allreduce_mpi [--min-kib 1] [--max-mib 256] [--samples 7]
//
// The chief prints the table: median seconds per call (over samples, each timing a batch of
// calls between barriers), algbw = bytes / time, and the ratio Tandem / MPI (target >= 0.9 at
// >= 16 MiB).
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "tandem/distribute/internal/strategy_access.h"
#include "tandem/tandem.h"
#include "timing.h"

namespace td = tandem;
namespace tb = tandem::bench;

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int calls_for(size_t bytes) {
  return static_cast<int>(std::clamp<double>(2e8 / static_cast<double>(bytes), 2, 2000));
}

}  // namespace

int main(int argc, char** argv) {
  int min_kib = 1, max_mib = 256, samples = 7;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--min-kib") {
      min_kib = std::atoi(argv[i + 1]);
    } else if (flag == "--max-mib") {
      max_mib = std::atoi(argv[i + 1]);
    } else if (flag == "--samples") {
      samples = std::atoi(argv[i + 1]);
    } else {
      std::fprintf(stderr, "bench_allreduce_mpi: unknown flag \"%s\"\n", argv[i]);
      return 2;
    }
  }
  if (min_kib < 1 || max_mib < 1 || samples < 1) {
    std::fprintf(stderr,
                 "bench_allreduce_mpi: --min-kib, --max-mib and --samples need numbers >= 1\n");
    return 2;
  }
  // The strategy initialises MPI (MPI_THREAD_SERIALIZED); this program then calls MPI itself
  // only from its main thread while no replica runs.
  td::MultiWorkerMirroredStrategy strategy(std::vector<td::Device>{td::Device::cpu(0)});
  td::collectives::Communicator& comm = td::detail::StrategyAccess::communicator(strategy, 0);
  const bool chief = strategy.is_chief();
  if (chief)
    std::printf(
        "all-reduce across %d processes (1 CPU replica each), float32 sum, median of %d\n"
        "%10s %12s %12s %12s %12s %8s\n",
        strategy.num_workers(), samples, "bytes", "mpi_us", "tandem_us", "mpi_GB/s", "tandem_GB/s",
        "ratio");
  for (size_t bytes = static_cast<size_t>(min_kib) << 10;
       bytes <= static_cast<size_t>(max_mib) << 20; bytes *= 4) {
    const int64_t n = static_cast<int64_t>(bytes / sizeof(float));
    // One buffer for both: Open MPI's reduction speed depends on where a buffer starts within
    // its page (by up to 15% at 256 MiB on a 2-core VM: malloc's page + 16 bytes was fastest,
    // 64-byte or page alignment slower), so separate buffers would compare placements, not
    // code paths. Zeros stay zeros when summed.
    td::Tensor tandem_buffer = td::Tensor::zeros({n});
    float* mpi_buffer = tandem_buffer.data<float>();
    std::vector<td::Tensor> list = {tandem_buffer};
    const int calls = calls_for(bytes);
    std::vector<double> mpi_times, tandem_times;
    for (int s = 0; s < samples; ++s) {
      // Alternate which goes first, so that neither always runs on a warmer machine.
      for (int pass = 0; pass < 2; ++pass) {
        const bool run_mpi = (s + pass) % 2 == 0;
        MPI_Barrier(MPI_COMM_WORLD);
        const double start = tb::now_seconds();
        for (int c = 0; c < calls; ++c) {
          if (run_mpi) {
            MPI_Allreduce(MPI_IN_PLACE, mpi_buffer, static_cast<int>(n), MPI_FLOAT, MPI_SUM,
                          MPI_COMM_WORLD);
          } else {
            // The communicator's entry point, called on this (main) thread: the same code a
            // replica's ctx.all_reduce reaches, without the strategy.run hand-off.
            comm.all_reduce(list, td::ReduceOp::kSum)->wait();
          }
        }
        const double per_call = (tb::now_seconds() - start) / calls;
        (run_mpi ? mpi_times : tandem_times).push_back(per_call);
      }
    }
    // Every process's median; the slowest process decides.
    double medians[2] = {median(mpi_times), median(tandem_times)};
    MPI_Allreduce(MPI_IN_PLACE, medians, 2, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    if (chief)
      std::printf("%10zu %12.1f %12.1f %12.2f %12.2f %8.2f\n", bytes, medians[0] * 1e6,
                  medians[1] * 1e6, static_cast<double>(bytes) / medians[0] / 1e9,
                  static_cast<double>(bytes) / medians[1] / 1e9, medians[0] / medians[1]);
  }
  if (chief)
    std::printf(
        "\ntarget: ratio (Tandem / MPI throughput) >= 0.9 at >= 16 MiB\n"
        "reproduce: mpirun -np %d ./build/bench/bench_allreduce_mpi\n",
        strategy.num_workers());
  return 0;
}
