// ClusterResolver: which worker this process is, from the variables the launcher sets (Open MPI's
// mpirun, a PMI launcher such as MPICH's or Slurm's, or srun) or from TF_CONFIG (workers started
// one by one, as tf.distribute's are). A process started alone is worker 0 of 1.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace tandem {

/// Where this process stands in a multi-worker job: its rank and the job's size, overall and on
/// its host, and where the numbers came from.
struct ClusterSpec {
  int rank = 0;        ///< this worker's index in [0, size)
  int size = 1;        ///< workers (processes) in the job
  int local_rank = 0;  ///< this worker's index among the workers on its host
  int local_size = 1;  ///< workers on this host
  /// Where the numbers came from: "open mpi", "pmi", "slurm", "tf_config" or "single process".
  std::string source = "single process";
  /// From TF_CONFIG: every worker's "host:port" in worker order (the chief's first); the
  /// chief's is where the workers meet. Empty for the launchers.
  std::vector<std::string> addresses;
  /// True for worker 0, the chief (it writes checkpoints and summaries).
  bool is_chief() const { return rank == 0; }
};

/// Finds the job's layout from the environment: a launcher's variables (mpirun, PMI, Slurm)
/// or TF_CONFIG (tf.distribute's cluster resolvers).
class ClusterResolver {
 public:
  /// Reads OMPI_COMM_WORLD_{RANK,SIZE,LOCAL_RANK,LOCAL_SIZE}, else PMI_RANK/PMI_SIZE (with
  /// MPI_LOCALRANKID/MPI_LOCALNRANKS when present), else SLURM_PROCID/SLURM_NTASKS/SLURM_LOCALID
  /// (SLURM_NTASKS_PER_NODE or SLURM_TASKS_PER_NODE for the local size). A set variable that is
  /// not a whole number in range raises naming it and its value.
  /// Precedence: a launcher's variables (Open MPI, then PMI, then Slurm) describe the processes
  /// it started; TF_CONFIG is used when no launcher started more than one process. TF_CONFIG
  /// set in a process that a launcher started among several raises (unset TF_CONFIG under
  /// mpirun or srun).
  static ClusterSpec from_environment();
  /// The cluster TF_CONFIG describes (tf.distribute's TFConfigClusterResolver):
  ///   {"cluster": {"chief": ["h0:p"], "worker": ["h1:p", "h2:p"]},
  ///    "task": {"type": "worker", "index": 0}}
  /// A "chief" task is worker 0 and the "worker" tasks follow it (without a chief, worker 0 is
  /// the chief). Local rank and size count the workers on this task's host. "ps" and
  /// "evaluator" jobs or tasks are refused (Tandem has no parameter-server mode); invalid JSON,
  /// a missing field, an index out of range, an address that is not "host:port" or one listed
  /// twice raise, naming the field.
  static ClusterSpec from_tf_config(std::string_view tf_config);

 private:
  /// The launcher's variables alone (Open MPI, PMI, Slurm), or a single process.
  static ClusterSpec from_launcher();
};

}  // namespace tandem
