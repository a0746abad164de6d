// ClusterResolver: which worker this process is, from the variables the launcher sets (Open MPI's
// mpirun, a PMI launcher such as MPICH's or Slurm's, or srun). A process started alone is worker
// 0 of 1.
#pragma once

#include <string>

namespace tandem {

struct ClusterSpec {
  int rank = 0;        ///< this worker's index in [0, size)
  int size = 1;        ///< workers (processes) in the job
  int local_rank = 0;  ///< this worker's index among the workers on its host
  int local_size = 1;  ///< workers on this host
  /// Where the numbers came from: "open mpi", "pmi", "slurm" or "single process".
  std::string source = "single process";
  bool is_chief() const { return rank == 0; }
};

class ClusterResolver {
 public:
  /// Reads OMPI_COMM_WORLD_{RANK,SIZE,LOCAL_RANK,LOCAL_SIZE}, else PMI_RANK/PMI_SIZE (with
  /// MPI_LOCALRANKID/MPI_LOCALNRANKS when present), else SLURM_PROCID/SLURM_NTASKS/SLURM_LOCALID
  /// (SLURM_NTASKS_PER_NODE or SLURM_TASKS_PER_NODE for the local size). A set variable that is
  /// not a whole number in range raises naming it and its value.
  static ClusterSpec from_environment();
};

}  // namespace tandem
