// Per-thread CUDA state behind cuda_context.h: one record per (thread, device) holding the
// thread's own stream, an optional installed stream and the cuBLAS handle.
#include "tandem/tensor/internal/cuda_context.h"

#include <algorithm>
#include <vector>

#include "tandem/core/internal/cuda_check.h"
#include "tandem/core/logging.h"
#include "tandem/tensor/device_runtime.h"

namespace tandem::cuda {

namespace {

struct ThreadDeviceState {
  cudaStream_t own_stream = nullptr;        ///< created on first use, owned
  cudaStream_t installed_stream = nullptr;  ///< set by StreamGuard, not owned
  cublasHandle_t cublas = nullptr;
  cublasLtHandle_t cublaslt = nullptr;
  cudaStream_t cublas_stream = nullptr;  ///< the stream the handle is bound to
  bool cublas_tf32 = false;              ///< the math mode the handle is set to
  int multiprocessors = 0;               ///< 0: not asked yet
};

/// The calling thread's records, indexed by device. Destroyed when the thread ends: a replica
/// thread's stream and handle go with it. Destructors log instead of throwing.
class ThreadState {
 public:
  ~ThreadState() {
    for (size_t device = 0; device < devices_.size(); ++device) {
      ThreadDeviceState& s = devices_[device];
      if (s.own_stream == nullptr && s.cublas == nullptr && s.cublaslt == nullptr) continue;
      // The handle and the stream are released on the device they belong to.
      if (cudaSetDevice(static_cast<int>(device)) != cudaSuccess) {
        (void)cudaGetLastError();
        continue;
      }
      if (s.cublas != nullptr && cublasDestroy(s.cublas) != CUBLAS_STATUS_SUCCESS)
        TANDEM_LOG_WARNING("cuda:", device, ": cublasDestroy failed at thread exit");
      if (s.cublaslt != nullptr && cublasLtDestroy(s.cublaslt) != CUBLAS_STATUS_SUCCESS)
        TANDEM_LOG_WARNING("cuda:", device, ": cublasLtDestroy failed at thread exit");
      if (s.own_stream != nullptr) {
        const cudaError_t status = cudaStreamDestroy(s.own_stream);
        if (status != cudaSuccess) {
          (void)cudaGetLastError();
          TANDEM_LOG_WARNING("cuda:", device, ": cudaStreamDestroy failed at thread exit: ",
                             cudaGetErrorString(status));
        }
      }
    }
  }

  ThreadDeviceState& at(int device) {
    TANDEM_CHECK(device >= 0, "cuda: invalid current device ", device);
    if (static_cast<size_t>(device) >= devices_.size()) devices_.resize(device + 1);
    return devices_[device];
  }

 private:
  std::vector<ThreadDeviceState> devices_;
};

thread_local ThreadState t_state;

int current_device() {
  int device = 0;
  TANDEM_CUDA_CHECK(cudaGetDevice(&device));
  return device;
}

}  // namespace

DeviceGuard::DeviceGuard(int device) {
  const int previous = current_device();
  if (previous != device) {
    TANDEM_CUDA_CHECK(cudaSetDevice(device));
    previous_ = previous;
  }
}

DeviceGuard::DeviceGuard(Device device) : DeviceGuard(device.index) {
  TANDEM_CHECK(device.is_cuda(), "DeviceGuard: ", device, " is not a CUDA device");
}

DeviceGuard::~DeviceGuard() {
  if (previous_ >= 0 && cudaSetDevice(previous_) != cudaSuccess) {
    (void)cudaGetLastError();
    TANDEM_LOG_WARNING("DeviceGuard: could not restore cuda:", previous_);
  }
}

cudaStream_t current_stream() {
  ThreadDeviceState& s = t_state.at(current_device());
  if (s.installed_stream != nullptr) return s.installed_stream;
  if (s.own_stream == nullptr) {
    // Non-blocking: it never waits for (or holds up) the legacy default stream, so the
    // streams of different threads (replicas) run independently. Copies between host and
    // device run on this stream too (device_memory.cpp), which orders them with the kernels;
    // work handed between threads is ordered with events (StreamEvent).
    TANDEM_CUDA_CHECK(cudaStreamCreateWithFlags(&s.own_stream, cudaStreamNonBlocking));
  }
  return s.own_stream;
}

StreamGuard::StreamGuard(cudaStream_t stream) : device_(current_device()) {
  ThreadDeviceState& s = t_state.at(device_);
  previous_ = s.installed_stream;
  s.installed_stream = stream;
}

StreamGuard::~StreamGuard() { t_state.at(device_).installed_stream = previous_; }

cublasHandle_t cublas_handle(cudaStream_t stream) {
  ThreadDeviceState& s = t_state.at(current_device());
  if (s.cublas == nullptr) {
    TANDEM_CUBLAS_CHECK(cublasCreate(&s.cublas));
    s.cublas_stream = nullptr;
    TANDEM_CUBLAS_CHECK(cublasSetMathMode(s.cublas, CUBLAS_DEFAULT_MATH));
    s.cublas_tf32 = false;
  }
  if (s.cublas_stream != stream) {
    TANDEM_CUBLAS_CHECK(cublasSetStream(s.cublas, stream));
    s.cublas_stream = stream;
  }
  // Read on every call, so set_allow_tf32 takes effect at the next GEMM on every thread.
  const bool tf32 = allow_tf32();
  if (s.cublas_tf32 != tf32) {
    TANDEM_CUBLAS_CHECK(
        cublasSetMathMode(s.cublas, tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH));
    s.cublas_tf32 = tf32;
  }
  return s.cublas;
}

cublasLtHandle_t cublaslt_handle() {
  ThreadDeviceState& s = t_state.at(current_device());
  if (s.cublaslt == nullptr) TANDEM_CUBLAS_CHECK(cublasLtCreate(&s.cublaslt));
  return s.cublaslt;
}

int multiprocessor_count() {
  // Cached per thread, so launchers on different replica threads share no lock.
  const int device = current_device();
  ThreadDeviceState& s = t_state.at(device);
  if (s.multiprocessors == 0) {
    TANDEM_CUDA_CHECK(
        cudaDeviceGetAttribute(&s.multiprocessors, cudaDevAttrMultiProcessorCount, device));
  }
  return s.multiprocessors;
}

int grid_size(int64_t n, int threads) {
  // Eight 256-thread blocks per SM fill an H100 SM (2048 resident threads); beyond that a
  // grid-stride loop does the rest with no launch or tail cost.
  const int64_t wanted = (n + threads - 1) / threads;
  const int64_t cap = static_cast<int64_t>(multiprocessor_count()) * (2048 / threads);
  return static_cast<int>(std::max<int64_t>(1, std::min(wanted, cap)));
}

}  // namespace tandem::cuda
