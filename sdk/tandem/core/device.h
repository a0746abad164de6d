// Device: where a tensor lives and a replica runs ("cpu:0", "cuda:1"), and device discovery.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

namespace tandem {

enum class DeviceKind : uint8_t { kCpu, kCuda };

struct Device {
  DeviceKind kind = DeviceKind::kCpu;
  int index = 0;

  static Device cpu(int index = 0) { return {DeviceKind::kCpu, index}; }
  static Device cuda(int index = 0) { return {DeviceKind::kCuda, index}; }
  /// Parses "cpu", "cpu:1", "cuda", "cuda:0", "gpu:0" (and TF's "/gpu:0"); bad text raises.
  static Device parse(std::string_view text);

  bool is_cpu() const { return kind == DeviceKind::kCpu; }
  bool is_cuda() const { return kind == DeviceKind::kCuda; }
  std::string to_string() const;

  friend bool operator==(const Device& a, const Device& b) {
    return a.kind == b.kind && a.index == b.index;
  }
  friend bool operator!=(const Device& a, const Device& b) { return !(a == b); }
};

std::ostream& operator<<(std::ostream& out, const Device& device);

/// What device discovery found. Never throws: a missing driver means zero GPUs and a reason.
struct CudaDeviceInfo {
  int index = 0;
  std::string name;
  size_t total_memory_bytes = 0;
  int compute_capability_major = 0;
  int compute_capability_minor = 0;
};

struct CudaAvailability {
  bool built = false;                   ///< TANDEM_ENABLE_CUDA was ON
  std::vector<CudaDeviceInfo> devices;  ///< visible GPUs (CUDA_VISIBLE_DEVICES respected)
  std::string reason;                   ///< why there are none, when devices is empty
};

/// Queries the CUDA runtime once (cached); safe on machines without a driver.
const CudaAvailability& cuda_availability();
/// Number of usable GPUs (0 when CUDA was not built or no driver/device is present).
int cuda_device_count();

}  // namespace tandem
