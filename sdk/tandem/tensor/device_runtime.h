// Device controls that exist in every build: wait for the work a thread queued on a device,
// time device work with CUDA events, and the TF32 switch for float32 GEMMs on GPUs.
// On CPU (or without CUDA built) synchronisation is a no-op and timing uses the host clock.
#pragma once

#include <chrono>

#include "tandem/core/device.h"

namespace tandem {

/// Waits until the work the calling thread queued on `device` (on its current stream) is done.
/// A no-op for CPU devices.
void synchronize(Device device);

/// Times the work the calling thread queues on a device between start() and stop(): with a
/// pair of CUDA events on the thread's current stream for a GPU, with the host clock on CPU.
class DeviceTimer {
 public:
  explicit DeviceTimer(Device device);
  ~DeviceTimer();
  DeviceTimer(const DeviceTimer&) = delete;
  DeviceTimer& operator=(const DeviceTimer&) = delete;

  void start();
  /// Milliseconds from start() to now on the device's stream; waits for the queued work.
  double stop();

 private:
  Device device_;
  void* start_event_ = nullptr;  // cudaEvent_t, opaque here so the header needs no CUDA
  void* stop_event_ = nullptr;
  std::chrono::steady_clock::time_point host_start_;
};

namespace cuda {

/// Lets float32 GEMMs use TF32 tensor cores (Ampere and later): several times faster, with
/// products rounded to a 10-bit mantissa. Off by default, so CUDA results match the CPU
/// reference to float32 precision; setting TANDEM_ALLOW_TF32=1 in the environment turns it on
/// at start-up. Takes effect at the next GEMM on every thread.
void set_allow_tf32(bool allow);
bool allow_tf32();

}  // namespace cuda
}  // namespace tandem
