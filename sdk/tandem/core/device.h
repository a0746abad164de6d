// Device: where a tensor lives and a replica runs ("cpu:0", "cuda:1"), and device discovery.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

namespace tandem {

/// The kind of a Device: the host's CPU or an NVIDIA GPU.
enum class DeviceKind : uint8_t { kCpu, kCuda };

/// A place where tensors live and replicas run: "cpu:0", "cuda:1". CPU indices tell logical
/// CPU replicas apart; they share the host's memory.
struct Device {
  /// CPU or CUDA.
  DeviceKind kind = DeviceKind::kCpu;
  /// The GPU's index among the visible ones (CUDA_VISIBLE_DEVICES), or the CPU replica's.
  int index = 0;

  /// "cpu:<index>".
  static Device cpu(int index = 0) { return {DeviceKind::kCpu, index}; }
  /// "cuda:<index>".
  static Device cuda(int index = 0) { return {DeviceKind::kCuda, index}; }
  /// Parses "cpu", "cpu:1", "cuda", "cuda:0", "gpu:0" (and TF's "/gpu:0"); bad text raises.
  static Device parse(std::string_view text);

  /// True for a CPU device.
  bool is_cpu() const { return kind == DeviceKind::kCpu; }
  /// True for a GPU.
  bool is_cuda() const { return kind == DeviceKind::kCuda; }
  /// "cpu:0" or "cuda:1" (what parse() reads back).
  std::string to_string() const;

  friend bool operator==(const Device& a, const Device& b) {
    return a.kind == b.kind && a.index == b.index;
  }
  friend bool operator!=(const Device& a, const Device& b) { return !(a == b); }
};

/// Writes device.to_string().
std::ostream& operator<<(std::ostream& out, const Device& device);

/// What device discovery found. Never throws: a missing driver means zero GPUs and a reason.
struct CudaDeviceInfo {
  /// The CUDA device index.
  int index = 0;
  /// The product name ("NVIDIA H100 80GB HBM3").
  std::string name;
  /// The GPU's memory, in bytes.
  size_t total_memory_bytes = 0;
  /// Compute capability, major (9 for Hopper).
  int compute_capability_major = 0;
  /// Compute capability, minor.
  int compute_capability_minor = 0;
};

/// What device discovery found (cuda_availability()).
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
