// The multi-worker job every [mpi] test program joins: one MultiWorkerMirroredStrategy per
// process (MPI, Gloo and shared memory are joined once), with TANDEM_TEST_LOCAL_REPLICAS CPU
// replicas per worker, shared by every test file of the program.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "tandem/distribute/internal/strategy_access.h"
#include "tandem/tandem.h"

namespace tandem::testing {

/// CPU replicas per worker (TANDEM_TEST_LOCAL_REPLICAS, 1 when unset).
inline int local_replicas() {
  const char* value = std::getenv("TANDEM_TEST_LOCAL_REPLICAS");
  return value ? std::atoi(value) : 1;
}

/// The job's strategy, made by the first test case that asks.
inline MultiWorkerMirroredStrategy& job_strategy() {
  static auto* s = [] {
    std::vector<Device> devices;
    for (int i = 0; i < local_replicas(); ++i) devices.push_back(Device::cpu(i));
    return new MultiWorkerMirroredStrategy(devices);
  }();
  return *s;
}

/// The chief's fresh temporary directory "tandem_mpi_<tag>_<chief's pid>", known to every
/// worker.
inline std::string shared_temp_dir(Strategy& s, const std::string& tag = "ckpt") {
  std::vector<int32_t> chars(256, 0);
  if (s.is_chief()) {
    const std::string dir = (std::filesystem::temp_directory_path() /
                             ("tandem_mpi_" + tag + "_" + std::to_string(::getpid())))
                                .string();
    std::filesystem::create_directories(dir);
    for (size_t i = 0; i < dir.size() && i < chars.size(); ++i) chars[i] = dir[i];
  }
  const std::vector<int32_t> all =
      detail::StrategyAccess::reduce_across_workers(s, ReduceOp::kMax, Tensor::from_vector(chars))
          .to_vector<int32_t>();
  std::string dir;
  for (int32_t c : all)
    if (c != 0) dir.push_back(static_cast<char>(c));
  return dir;
}

}  // namespace tandem::testing
