// ClusterResolver: the launcher's environment variables, checked.
#include "tandem/distribute/cluster_resolver.h"

#include <cstdlib>
#include <optional>

#include "tandem/core/error.h"

namespace tandem {

namespace {

/// The variable as a whole number, or nothing when unset; raises when set to anything else.
std::optional<int> read_int(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') return std::nullopt;
  char* end = nullptr;
  const long parsed = std::strtol(value, &end, 10);
  TANDEM_CHECK(end != value && *end == '\0' && parsed >= 0 && parsed < (1L << 30), name, "=\"",
               value, "\" is not a whole number >= 0");
  return static_cast<int>(parsed);
}

/// "4(x2),3" (Slurm's tasks-per-node list) -> 4: the first node's count.
std::optional<int> slurm_tasks_per_node() {
  if (const std::optional<int> n = read_int("SLURM_NTASKS_PER_NODE")) return n;
  const char* list = std::getenv("SLURM_TASKS_PER_NODE");
  if (list == nullptr || *list == '\0') return std::nullopt;
  const int first = std::atoi(list);
  return first > 0 ? std::optional<int>(first) : std::nullopt;
}

ClusterSpec check(ClusterSpec spec, const char* rank_name, const char* size_name) {
  TANDEM_CHECK(spec.size >= 1, size_name, "=", spec.size, ": a job needs at least one worker");
  TANDEM_CHECK(spec.rank < spec.size, rank_name, "=", spec.rank, " is not below ", size_name, "=",
               spec.size);
  TANDEM_CHECK(spec.local_size >= 1 && spec.local_rank < spec.local_size, "local rank ",
               spec.local_rank, " of ", spec.local_size, " (", spec.source, ") is out of range");
  return spec;
}

}  // namespace

ClusterSpec ClusterResolver::from_environment() {
  ClusterSpec spec;
  if (const std::optional<int> rank = read_int("OMPI_COMM_WORLD_RANK")) {
    spec.source = "open mpi";
    spec.rank = *rank;
    spec.size = read_int("OMPI_COMM_WORLD_SIZE").value_or(1);
    spec.local_rank = read_int("OMPI_COMM_WORLD_LOCAL_RANK").value_or(0);
    spec.local_size = read_int("OMPI_COMM_WORLD_LOCAL_SIZE").value_or(1);
    return check(spec, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE");
  }
  if (const std::optional<int> rank = read_int("PMI_RANK")) {
    spec.source = "pmi";
    spec.rank = *rank;
    spec.size = read_int("PMI_SIZE").value_or(1);
    spec.local_rank = read_int("MPI_LOCALRANKID").value_or(0);
    spec.local_size = read_int("MPI_LOCALNRANKS").value_or(1);
    return check(spec, "PMI_RANK", "PMI_SIZE");
  }
  if (const std::optional<int> rank = read_int("SLURM_PROCID")) {
    spec.source = "slurm";
    spec.rank = *rank;
    spec.size = read_int("SLURM_NTASKS").value_or(1);
    spec.local_rank = read_int("SLURM_LOCALID").value_or(0);
    spec.local_size = slurm_tasks_per_node().value_or(1);
    if (spec.local_rank >= spec.local_size) spec.local_size = spec.local_rank + 1;
    return check(spec, "SLURM_PROCID", "SLURM_NTASKS");
  }
  return spec;
}

}  // namespace tandem
