// Device synchronisation, event timing, the TF32 switch and the timeline's NVTX ranges. A dispatch point: the CUDA half
// exists only when CUDA is built; the CPU half (and a build without CUDA) uses the host.
#include "tandem/tensor/device_runtime.h"

#include <atomic>
#include <cstdlib>
#include <string_view>

#include "tandem/core/error.h"
#include "tandem/core/spans.h"

#if TANDEM_WITH_CUDA
#include <nvtx3/nvToolsExt.h>

#include "tandem/core/internal/cuda_check.h"
#include "tandem/core/logging.h"
#include "tandem/tensor/internal/cuda_context.h"
#endif

namespace tandem {

namespace {

#if !TANDEM_WITH_CUDA
[[noreturn]] void throw_cuda_not_built(Device device) {
  throw NotBuiltError(device.to_string() +
                      ": CUDA support was not built (configure with -DTANDEM_ENABLE_CUDA=ON)");
}
#endif

std::atomic<bool>& tf32_flag() {
  static std::atomic<bool> flag{[] {
    const char* value = std::getenv("TANDEM_ALLOW_TF32");
    return value != nullptr && std::string_view(value) == "1";
  }()};
  return flag;
}

}  // namespace

void install_device_ranges() {
#if TANDEM_WITH_CUDA
  static const profile::RangeHooks nvtx{[](const char* name) { nvtxRangePushA(name); },
                                        [] { nvtxRangePop(); }};
  profile::set_range_hooks(&nvtx);
#endif
}

void synchronize(Device device) {
  if (device.is_cpu()) return;
#if TANDEM_WITH_CUDA
  cuda::DeviceGuard guard(device);
  // Waits for this thread's stream only, not the whole device: other replicas keep running.
  TANDEM_CUDA_CHECK(cudaStreamSynchronize(cuda::current_stream()));
#else
  throw_cuda_not_built(device);
#endif
}

StreamEvent::~StreamEvent() {
#if TANDEM_WITH_CUDA
  if (event_ == nullptr) return;
  cuda::DeviceGuard guard(device_);
  if (cudaEventDestroy(static_cast<cudaEvent_t>(event_)) != cudaSuccess) {
    (void)cudaGetLastError();
    TANDEM_LOG_WARNING("StreamEvent: cudaEventDestroy failed on ", device_);
  }
#endif
}

StreamEvent::StreamEvent(StreamEvent&& other) noexcept
    : event_(other.event_), device_(other.device_), recorded_(other.recorded_) {
  other.event_ = nullptr;
  other.recorded_ = false;
}

StreamEvent& StreamEvent::operator=(StreamEvent&& other) noexcept {
  if (this != &other) {
    StreamEvent old(std::move(*this));
    event_ = other.event_;
    device_ = other.device_;
    recorded_ = other.recorded_;
    other.event_ = nullptr;
    other.recorded_ = false;
  }
  return *this;
}

void StreamEvent::record(Device device) {
  if (device.is_cpu()) {
    recorded_ = false;
    return;
  }
#if TANDEM_WITH_CUDA
  if (event_ != nullptr && device_ != device) *this = StreamEvent();
  cuda::DeviceGuard guard(device);
  if (event_ == nullptr) {
    cudaEvent_t event = nullptr;
    TANDEM_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
    event_ = event;
    device_ = device;
  }
  TANDEM_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(event_), cuda::current_stream()));
  recorded_ = true;
#else
  throw_cuda_not_built(device);
#endif
}

void StreamEvent::wait() const {
  if (!recorded_) return;
#if TANDEM_WITH_CUDA
  cuda::DeviceGuard guard(device_);
  TANDEM_CUDA_CHECK(
      cudaStreamWaitEvent(cuda::current_stream(), static_cast<cudaEvent_t>(event_), 0));
#endif
}

void StreamEvent::synchronize() const {
  if (!recorded_) return;
#if TANDEM_WITH_CUDA
  cuda::DeviceGuard guard(device_);
  TANDEM_CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(event_)));
#endif
}

bool StreamEvent::done() const {
  if (!recorded_) return true;
#if TANDEM_WITH_CUDA
  cuda::DeviceGuard guard(device_);
  const cudaError_t status = cudaEventQuery(static_cast<cudaEvent_t>(event_));
  if (status == cudaErrorNotReady) {
    (void)cudaGetLastError();
    return false;
  }
  TANDEM_CUDA_CHECK(status);
#endif
  return true;
}

DeviceTimer::DeviceTimer(Device device) : device_(device) {
  if (device.is_cpu()) return;
#if TANDEM_WITH_CUDA
  cuda::DeviceGuard guard(device);
  cudaEvent_t start = nullptr, stop = nullptr;
  TANDEM_CUDA_CHECK(cudaEventCreate(&start));
  const cudaError_t status = cudaEventCreate(&stop);
  if (status != cudaSuccess) (void)cudaEventDestroy(start);
  TANDEM_CUDA_CHECK(status);
  start_event_ = start;
  stop_event_ = stop;
#else
  throw_cuda_not_built(device);
#endif
}

DeviceTimer::~DeviceTimer() {
#if TANDEM_WITH_CUDA
  if (start_event_ == nullptr) return;
  cuda::DeviceGuard guard(device_);
  if (cudaEventDestroy(static_cast<cudaEvent_t>(start_event_)) != cudaSuccess ||
      cudaEventDestroy(static_cast<cudaEvent_t>(stop_event_)) != cudaSuccess) {
    (void)cudaGetLastError();
    TANDEM_LOG_WARNING("DeviceTimer: cudaEventDestroy failed on ", device_);
  }
#endif
}

void DeviceTimer::start() {
  if (device_.is_cpu()) {
    host_start_ = std::chrono::steady_clock::now();
    return;
  }
#if TANDEM_WITH_CUDA
  cuda::DeviceGuard guard(device_);
  TANDEM_CUDA_CHECK(
      cudaEventRecord(static_cast<cudaEvent_t>(start_event_), cuda::current_stream()));
#endif
}

double DeviceTimer::stop() {
  if (device_.is_cpu()) {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - host_start_)
        .count();
  }
#if TANDEM_WITH_CUDA
  cuda::DeviceGuard guard(device_);
  const auto start = static_cast<cudaEvent_t>(start_event_);
  const auto stop = static_cast<cudaEvent_t>(stop_event_);
  TANDEM_CUDA_CHECK(cudaEventRecord(stop, cuda::current_stream()));
  // Waiting on the event rather than the device blocks only until this stream reaches it.
  TANDEM_CUDA_CHECK(cudaEventSynchronize(stop));
  float ms = 0.0f;
  TANDEM_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
  return ms;
#else
  return 0.0;
#endif
}

namespace cuda {
void set_allow_tf32(bool allow) { tf32_flag().store(allow, std::memory_order_relaxed); }
bool allow_tf32() { return tf32_flag().load(std::memory_order_relaxed); }
}  // namespace cuda

}  // namespace tandem
