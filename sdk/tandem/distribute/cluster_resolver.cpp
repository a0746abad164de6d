// ClusterResolver: the launcher's environment variables, checked.
#include "tandem/distribute/cluster_resolver.h"

#include <cctype>
#include <cmath>
#include <cstdlib>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string_view>

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

/// A host name or address as TF_CONFIG may give it: letters, digits, '.', '-' and '_' (names,
/// IPv4), or an IPv6 address in brackets ("[::1]"). Nothing else: no spaces, signs or control
/// characters, which a resolver would either reject later or read as something else.
bool valid_host(std::string_view host) {
  if (host.empty() || host.size() > 253) return false;
  if (host.front() == '[') {
    if (host.size() < 3 || host.back() != ']') return false;
    for (const char c : host.substr(1, host.size() - 2))
      if (!std::isxdigit(static_cast<unsigned char>(c)) && c != ':' && c != '.') return false;
    return true;
  }
  for (const char c : host)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '-' && c != '_')
      return false;
  return true;
}

/// The text for an error: control characters shown as \xNN, so that a NUL or a newline in a
/// value cannot cut or fake the message.
std::string printable(std::string_view text) {
  std::string out;
  for (const char c : text) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {
      static const char* const kHex = "0123456789abcdef";
      out += "\\x";
      out += kHex[(static_cast<unsigned char>(c) >> 4) & 0xf];
      out += kHex[static_cast<unsigned char>(c) & 0xf];
    } else {
      out += c;
    }
  }
  return out;
}

/// The first 200 characters of a value, printable, for an error message.
std::string excerpt(std::string_view text) {
  constexpr size_t kShown = 200;
  if (text.size() <= kShown) return printable(text);
  return printable(text.substr(0, kShown)) + "... (" + std::to_string(text.size()) + " characters)";
}

/// "host:port": a host valid_host accepts and a port of decimal digits alone in [1, 65535];
/// returns the host part (brackets kept for IPv6).
std::string host_of(const std::string& address, const std::string& field) {
  const size_t colon = address.rfind(':');
  bool ok = colon != std::string::npos && colon > 0 && colon + 1 < address.size() &&
            address.size() - colon - 1 <= 5 &&
            valid_host(std::string_view(address).substr(0, colon));
  long port = 0;
  for (size_t i = colon + 1; ok && i < address.size(); ++i) {
    ok = std::isdigit(static_cast<unsigned char>(address[i])) != 0;
    port = port * 10 + (address[i] - '0');
  }
  ok = ok && port >= 1 && port <= 65535;
  TANDEM_CHECK(ok, "TF_CONFIG ", field, " = \"", printable(address),
               "\" is not \"host:port\" (a host name or address, a port of digits in 1..65535)");
  return address.substr(0, colon);
}

/// How an index value reads in an error: numbers as TensorFlow users wrote them.
std::string index_text(const detail::Json& value) {
  using detail::Json;
  switch (value.kind) {
    case Json::Kind::kNumber: {
      if (!std::isfinite(value.number)) return "a number too large to represent";
      std::ostringstream out;
      out.precision(17);
      out << value.number;
      return out.str();
    }
    case Json::Kind::kString:
      return "the string \"" + printable(value.string) + "\"";
    case Json::Kind::kBool:
      return value.boolean ? "true" : "false";
    case Json::Kind::kNull:
      return "null";
    default:
      return "a JSON object or array";
  }
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
    TANDEM_THROW("TF_CONFIG is not valid JSON (", e.what(), "): ", excerpt(tf_config));
  }
  TANDEM_CHECK(root.kind == Json::Kind::kObject, "TF_CONFIG must be a JSON object, got ",
               excerpt(tf_config));
  TANDEM_CHECK(root.has("cluster") && root["cluster"].kind == Json::Kind::kObject,
               "TF_CONFIG has no \"cluster\" object: ", excerpt(tf_config));
  const Json& cluster = root["cluster"];
  for (const auto& [job, entries] : cluster.object) {
    if (job == "ps" || job == "evaluator") refuse_job("cluster has a \"" + job + "\" job");
    TANDEM_CHECK(job == "chief" || job == "worker", "TF_CONFIG cluster.", printable(job),
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
  TANDEM_CHECK(
      root.has("task") && root["task"].kind == Json::Kind::kObject,
      "TF_CONFIG has no \"task\" object (which task this process is): ", excerpt(tf_config));
  const Json& task = root["task"];
  TANDEM_CHECK(task.has("type") && task["type"].kind == Json::Kind::kString,
               "TF_CONFIG task.type must be \"chief\" or \"worker\"");
  const std::string type = task["type"].string;
  if (type == "ps" || type == "evaluator") refuse_job("task.type is \"" + type + "\"");
  TANDEM_CHECK(type == "chief" || type == "worker", "TF_CONFIG task.type = \"", printable(type),
               "\" is not \"chief\" or \"worker\"");
  // TensorFlow's resolver needs the index too: without it, a second process would silently
  // take worker 0's place (and be a second chief).
  TANDEM_CHECK(task.has("index"), "TF_CONFIG task.index is missing (which ", type,
               " this process is); TensorFlow refuses it too: give every task its index");
  const Json& index = task["index"];
  // Checked as a number before any conversion: 1e20, 2^64 or 1e400 must not wrap to 0.
  TANDEM_CHECK(index.kind == Json::Kind::kNumber && std::isfinite(index.number) &&
                   index.number >= 0 && index.number < 2147483648.0 &&
                   std::floor(index.number) == index.number,
               "TF_CONFIG task.index must be a whole number >= 0, got ", index_text(index));
  const size_t jobs = cluster.has(type) ? cluster[type].array.size() : 0;
  TANDEM_CHECK(index.number < static_cast<double>(jobs),
               "TF_CONFIG task.index = ", index_text(index), " is out of range: cluster.", type,
               " has ", jobs, " entr", jobs == 1 ? "y" : "ies");
  const auto i = static_cast<size_t>(index.number);
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
