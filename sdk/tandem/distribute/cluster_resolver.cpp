// ClusterResolver: the launcher's environment variables, checked.
#include "tandem/distribute/cluster_resolver.h"

#include <cmath>
#include <cstdlib>
#include <optional>
#include <stdexcept>

#include "tandem/core/error.h"
#include "tandem/core/internal/json.h"

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

/// "host:port" with a port in [1, 65535]; the host part (brackets kept for IPv6).
std::string host_of(const std::string& address, const std::string& field) {
  const size_t colon = address.rfind(':');
  bool ok = colon != std::string::npos && colon > 0 && colon + 1 < address.size();
  if (ok) {
    char* end = nullptr;
    const long port = std::strtol(address.c_str() + colon + 1, &end, 10);
    ok = *end == '\0' && port >= 1 && port <= 65535;
  }
  TANDEM_CHECK(ok, "TF_CONFIG ", field, " = \"", address,
               "\" is not \"host:port\" (a port in 1..65535)");
  return address.substr(0, colon);
}

[[noreturn]] void refuse_job(const std::string& what) {
  TANDEM_THROW("TF_CONFIG ", what,
               ": Tandem has no parameter-server mode (tf.distribute's "
               "ParameterServerStrategy) and no evaluator task; describe \"chief\" and "
               "\"worker\" tasks only (MultiWorkerMirroredStrategy's cluster)");
}

}  // namespace

ClusterSpec ClusterResolver::from_tf_config(std::string_view tf_config) {
  using detail::Json;
  Json root;
  try {
    root = detail::JsonReader::parse(tf_config);
  } catch (const std::runtime_error& e) {
    TANDEM_THROW("TF_CONFIG is not valid JSON (", e.what(), "): ", tf_config);
  }
  TANDEM_CHECK(root.kind == Json::Kind::kObject, "TF_CONFIG must be a JSON object, got ",
               tf_config);
  TANDEM_CHECK(root.has("cluster") && root["cluster"].kind == Json::Kind::kObject,
               "TF_CONFIG has no \"cluster\" object: ", tf_config);
  const Json& cluster = root["cluster"];
  for (const auto& [job, entries] : cluster.object) {
    if (job == "ps" || job == "evaluator") refuse_job("cluster has a \"" + job + "\" job");
    TANDEM_CHECK(job == "chief" || job == "worker", "TF_CONFIG cluster.", job,
                 ": unknown job (expected \"chief\" and \"worker\")");
    TANDEM_CHECK(entries.kind == Json::Kind::kArray, "TF_CONFIG cluster.", job,
                 " must be a list of \"host:port\" strings");
  }
  ClusterSpec spec;
  spec.source = "tf_config";
  std::vector<std::string> fields;
  for (const char* job : {"chief", "worker"}) {
    if (!cluster.has(job)) continue;
    const std::vector<Json>& entries = cluster[job].array;
    TANDEM_CHECK(std::string(job) != "chief" || entries.size() <= 1, "TF_CONFIG cluster.chief has ",
                 entries.size(), " entries; at most one");
    for (size_t i = 0; i < entries.size(); ++i) {
      const std::string field = detail::str_cat("cluster.", job, "[", i, "]");
      TANDEM_CHECK(entries[i].kind == Json::Kind::kString, "TF_CONFIG ", field,
                   " must be a \"host:port\" string");
      host_of(entries[i].string, field);
      for (size_t k = 0; k < spec.addresses.size(); ++k)
        TANDEM_CHECK(spec.addresses[k] != entries[i].string, "TF_CONFIG ", field, " = \"",
                     entries[i].string, "\" repeats ", fields[k],
                     "; every task needs an address of its own");
      spec.addresses.push_back(entries[i].string);
      fields.push_back(field);
    }
  }
  TANDEM_CHECK(!spec.addresses.empty(), "TF_CONFIG cluster lists no \"chief\" or \"worker\"");
  TANDEM_CHECK(root.has("task") && root["task"].kind == Json::Kind::kObject,
               "TF_CONFIG has no \"task\" object (which task this process is): ", tf_config);
  const Json& task = root["task"];
  TANDEM_CHECK(task.has("type") && task["type"].kind == Json::Kind::kString,
               "TF_CONFIG task.type must be \"chief\" or \"worker\"");
  const std::string type = task["type"].string;
  if (type == "ps" || type == "evaluator") refuse_job("task.type is \"" + type + "\"");
  TANDEM_CHECK(type == "chief" || type == "worker", "TF_CONFIG task.type = \"", type,
               "\" is not \"chief\" or \"worker\"");
  const Json* index = task.has("index") ? &task["index"] : nullptr;
  TANDEM_CHECK(index == nullptr || (index->kind == Json::Kind::kNumber && index->number >= 0 &&
                                    std::floor(index->number) == index->number),
               "TF_CONFIG task.index must be a whole number >= 0");
  const size_t i = index ? static_cast<size_t>(index->number) : 0;
  const size_t jobs = cluster.has(type) ? cluster[type].array.size() : 0;
  TANDEM_CHECK(i < jobs, "TF_CONFIG task.index = ", i, " is out of range: cluster.", type, " has ",
               jobs, " entr", jobs == 1 ? "y" : "ies");
  const bool has_chief = cluster.has("chief") && !cluster["chief"].array.empty();
  spec.rank = static_cast<int>(type == "chief" ? 0 : i + (has_chief ? 1 : 0));
  spec.size = static_cast<int>(spec.addresses.size());
  const std::string my_host = host_of(spec.addresses[static_cast<size_t>(spec.rank)], "");
  spec.local_size = 0;
  for (size_t k = 0; k < spec.addresses.size(); ++k) {
    if (host_of(spec.addresses[k], fields[k]) != my_host) continue;
    if (static_cast<int>(k) < spec.rank) ++spec.local_rank;
    ++spec.local_size;
  }
  return spec;
}

ClusterSpec ClusterResolver::from_environment() {
  ClusterSpec launcher = from_launcher();
  const char* tf_config = std::getenv("TF_CONFIG");
  if (tf_config == nullptr || *tf_config == '\0') return launcher;
  ClusterSpec spec = from_tf_config(tf_config);
  TANDEM_CHECK(launcher.size <= 1, "TF_CONFIG describes ", spec.size, " workers, and ",
               launcher.source, " started ", launcher.size,
               " processes: one description of the job at a time (unset TF_CONFIG under "
               "mpirun or srun, or start the workers yourself without a launcher)");
  return spec;
}

ClusterSpec ClusterResolver::from_launcher() {
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
