// The concrete strategies (MirroredStrategy, MultiWorkerMirroredStrategy, OneDeviceStrategy,
// default_strategy(), make_strategy()) and the device choice of MirroredStrategy's default
// constructor, with the one line that explains it.
#include <cstdlib>
#include <optional>
#include <sstream>

#include "tandem/core/build_info.h"
#include "tandem/core/logging.h"
#include "tandem/core/threading.h"
#include "tandem/distribute/cluster_resolver.h"
#include "tandem/distribute/strategy.h"
#include "tandem/tensor/device_runtime.h"

namespace tandem {

namespace {

std::vector<Device> parse_devices(const std::vector<std::string>& names) {
  std::vector<Device> devices;
  devices.reserve(names.size());
  for (const std::string& name : names) devices.push_back(Device::parse(name));
  return devices;
}

std::vector<Device> cpu_devices(int count) {
  TANDEM_CHECK(count >= 1, "MirroredStrategy::cpu: needs at least one replica, got ", count);
  std::vector<Device> devices;
  for (int i = 0; i < count; ++i) devices.push_back(Device::cpu(i));
  return devices;
}

/// TANDEM_CPU_REPLICAS when set (raising on a bad value), else nothing.
std::optional<int> cpu_replicas_from_env() {
  const char* env = std::getenv("TANDEM_CPU_REPLICAS");
  if (env == nullptr || *env == '\0') return std::nullopt;
  char* end = nullptr;
  const long value = std::strtol(env, &end, 10);
  TANDEM_CHECK(end != env && *end == '\0' && value >= 1 && value <= 4096, "TANDEM_CPU_REPLICAS=\"",
               env, "\" is not a replica count (a whole number >= 1)");
  return static_cast<int>(value);
}

/// MirroredStrategy's default devices, and in `report` the one line that explains the choice.
std::vector<Device> default_devices(std::string& report) {
  const std::optional<int> from_env_count = cpu_replicas_from_env();
  const bool from_env = from_env_count.has_value();
  const int replicas = from_env_count.value_or(1);
  const CudaAvailability& cuda = cuda_availability();
  std::ostringstream out;
  out << "MirroredStrategy: ";
  if (!cuda.devices.empty() && !from_env) {
    // Every visible GPU, one replica each (CUDA_VISIBLE_DEVICES selects them).
    std::vector<Device> gpus;
    out << cuda.devices.size() << " GPU replica" << (cuda.devices.size() == 1 ? "" : "s") << " (";
    for (size_t i = 0; i < cuda.devices.size(); ++i) {
      const CudaDeviceInfo& info = cuda.devices[i];
      gpus.push_back(Device::cuda(static_cast<int>(i)));
      out << (i ? "; " : "") << "cuda:" << i << " " << info.name << ", "
          << info.total_memory_bytes / (1024 * 1024) << " MiB";
    }
    out << ")";
    const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
    if (visible != nullptr) out << " [CUDA_VISIBLE_DEVICES=" << visible << "]";
    report = out.str();
    return gpus;
  }
  if (!cuda.devices.empty()) {
    out << cuda.devices.size() << " GPU" << (cuda.devices.size() == 1 ? "" : "s")
        << " visible, but TANDEM_CPU_REPLICAS asks for CPU replicas";
  } else {
    out << "no CUDA device (" << cuda.reason << ")";
  }
  out << "; using " << replicas << " CPU replica" << (replicas == 1 ? "" : "s");
  if (from_env) {
    out << " (TANDEM_CPU_REPLICAS=" << replicas << ")";
  } else {
    out << " (set TANDEM_CPU_REPLICAS for more)";
  }
  if (replicas > hardware_cores())
    out << "; " << replicas << " replicas share " << hardware_cores() << " cores";
  report = out.str();
  return cpu_devices(replicas);
}

std::vector<Device> default_devices_logged() {
  std::string report;
  std::vector<Device> devices = default_devices(report);
  TANDEM_LOG_INFO(report);
  return devices;
}

}  // namespace

MirroredStrategy::MirroredStrategy()
    : Strategy("MirroredStrategy", default_devices_logged(), Execution::kThreads) {}

MirroredStrategy::MirroredStrategy(std::initializer_list<std::string> devices)
    : MirroredStrategy(std::vector<std::string>(devices)) {}

MirroredStrategy::MirroredStrategy(const std::vector<std::string>& devices)
    : Strategy("MirroredStrategy", parse_devices(devices), Execution::kThreads) {}

MirroredStrategy::MirroredStrategy(std::vector<Device> devices)
    : Strategy("MirroredStrategy", std::move(devices), Execution::kThreads) {}

MirroredStrategy MirroredStrategy::cpu(int num_replicas) {
  return MirroredStrategy(cpu_devices(num_replicas));
}

MultiWorkerMirroredStrategy::MultiWorkerMirroredStrategy()
    : MultiWorkerMirroredStrategy(cpu_devices(cpu_replicas_from_env().value_or(1))) {}

MultiWorkerMirroredStrategy::MultiWorkerMirroredStrategy(std::vector<Device> local_devices)
    : Strategy("MultiWorkerMirroredStrategy", std::move(local_devices), Execution::kThreads,
               Scope::kWorkers) {
  const ClusterSpec cluster = ClusterResolver::from_environment();
  if (is_chief()) {
    TANDEM_LOG_INFO("MultiWorkerMirroredStrategy: ", num_workers(), " worker",
                    num_workers() == 1 ? "" : "s", " (", cluster.source, ") x ",
                    num_local_replicas(), devices().front().is_cuda() ? " GPU" : " CPU", " replica",
                    num_local_replicas() == 1 ? "" : "s", " = ", num_replicas_in_sync(),
                    " replicas; this is worker ", worker_index(), ", the chief");
  }
}

std::unique_ptr<Strategy> make_strategy() {
  const ClusterSpec cluster = ClusterResolver::from_environment();
  if (cluster.size > 1) {
    // TF_CONFIG workers on one machine need nothing more (shared memory); on several, Gloo,
    // which the strategy asks for by name when it is missing.
    if (cluster.source != "tf_config" && !build_info().mpi)
      throw NotBuiltError(detail::str_cat("make_strategy: started as worker ", cluster.rank, " of ",
                                          cluster.size, " (", cluster.source,
                                          ") but this build has no MPI; configure with Open MPI"));
    return std::make_unique<MultiWorkerMirroredStrategy>();
  }
  return std::make_unique<MirroredStrategy>();
}

OneDeviceStrategy::OneDeviceStrategy(Device device)
    : Strategy("OneDeviceStrategy", {device}, Execution::kInline) {}

OneDeviceStrategy::OneDeviceStrategy(const std::string& device)
    : OneDeviceStrategy(Device::parse(device)) {}

namespace {
class DefaultStrategy final : public Strategy {
 public:
  DefaultStrategy() : Strategy("DefaultStrategy", {Device::cpu()}, Execution::kInline) {}
  using Strategy::mark_default;
};
}  // namespace

Strategy& default_strategy() {
  static DefaultStrategy* strategy = [] {
    auto* s = new DefaultStrategy();  // never destroyed: used from static destructors too
    s->mark_default();
    return s;
  }();
  return *strategy;
}

}  // namespace tandem
