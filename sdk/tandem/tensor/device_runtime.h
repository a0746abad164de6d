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

/// With CUDA built, makes the timeline's spans (core/spans.h) NVTX ranges of the same names
/// while a profiler records, so Nsight Systems shows them next to the kernels; a no-op otherwise.
void install_device_ranges();

/// Times the work the calling thread queues on a device between start() and stop(): with a
/// pair of CUDA events on the thread's current stream for a GPU, with the host clock on CPU.
class DeviceTimer {
 public:
  /// A timer of the work queued on `device` (creates its CUDA events for a GPU).
  explicit DeviceTimer(Device device);
  ~DeviceTimer();
  DeviceTimer(const DeviceTimer&) = delete;
  DeviceTimer& operator=(const DeviceTimer&) = delete;

  /// Marks the start: records an event on the thread's current stream, or reads the host clock.
  void start();
  /// Milliseconds from start() to now on the device's stream; waits for the queued work.
  double stop();

 private:
  Device device_;
  void* start_event_ = nullptr;  // cudaEvent_t, opaque here so the header needs no CUDA
  void* stop_event_ = nullptr;
  std::chrono::steady_clock::time_point host_start_;
};

/// A point in a thread's stream on a GPU (a CUDA event), to order work between threads without
/// blocking the host: record() on the thread that produced something, wait() on the thread
/// that uses it makes that thread's stream wait for the recorded point. Re-recording moves the
/// point. Every member is a no-op for a CPU device (CPU work is done when the call returns).
class StreamEvent {
 public:
  StreamEvent() = default;
  ~StreamEvent();
  /// Takes over `other`'s event; `other` is left with none recorded.
  StreamEvent(StreamEvent&& other) noexcept;
  /// Releases this event, then takes over `other`'s.
  StreamEvent& operator=(StreamEvent&& other) noexcept;
  StreamEvent(const StreamEvent&) = delete;
  StreamEvent& operator=(const StreamEvent&) = delete;

  /// Marks the end of the work queued so far on the calling thread's current stream of
  /// `device`.
  void record(Device device);
  /// Makes the calling thread's current stream of the recorded device wait for that point.
  void wait() const;
  /// Blocks the host until the recorded point is reached.
  void synchronize() const;
  /// True when nothing was recorded or the recorded point was reached.
  bool done() const;

 private:
  void* event_ = nullptr;  // cudaEvent_t, opaque here so the header needs no CUDA
  Device device_ = Device::cpu();
  bool recorded_ = false;
};

namespace cuda {

/// Lets float32 GEMMs use TF32 tensor cores (Ampere and later): several times faster, with
/// products rounded to a 10-bit mantissa. Off by default, so CUDA results match the CPU
/// reference to float32 precision; setting TANDEM_ALLOW_TF32=1 in the environment turns it on
/// at start-up. Takes effect at the next GEMM on every thread.
void set_allow_tf32(bool allow);
/// Whether float32 GEMMs may use TF32 (set_allow_tf32(), or TANDEM_ALLOW_TF32=1 at start-up).
bool allow_tf32();

}  // namespace cuda
}  // namespace tandem
