// Input copies to a GPU: host tensors go through page-locked staging buffers and are copied on
// a copy stream of that GPU, ordered with the calling thread's stream by events in both
// directions. The staging buffers of recent copies are kept until their copies are done.
#include <cuda_runtime.h>

#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "tandem/core/internal/cuda_check.h"
#include "tandem/tensor/internal/cuda_allocator.h"
#include "tandem/tensor/internal/cuda_context.h"
#include "tandem/tensor/tensor.h"

namespace tandem::cuda {

namespace {

/// A pinned buffer whose copy is in flight, and the event that marks the copy's end.
struct Staged {
  void* buffer = nullptr;
  size_t bytes = 0;
  cudaEvent_t copied = nullptr;
};

/// Per GPU: its copy stream, two events for the stream hand-offs, and the in-flight buffers.
struct CopyEngine {
  int device = 0;
  cudaStream_t stream = nullptr;
  cudaEvent_t consumer_ready = nullptr;  // the consumer's stream reached the copy's start
  cudaEvent_t copies_done = nullptr;     // the copy stream finished this batch
  std::deque<Staged> in_flight;
  std::vector<cudaEvent_t> spare_events;
  std::mutex mutex;

  explicit CopyEngine(int index) : device(index) {
    DeviceGuard guard(index);
    TANDEM_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    TANDEM_CUDA_CHECK(cudaEventCreateWithFlags(&consumer_ready, cudaEventDisableTiming));
    TANDEM_CUDA_CHECK(cudaEventCreateWithFlags(&copies_done, cudaEventDisableTiming));
  }

  /// Gives back the staging buffers whose copies have finished.
  void reclaim() {
    while (!in_flight.empty()) {
      Staged& oldest = in_flight.front();
      const cudaError_t status = cudaEventQuery(oldest.copied);
      if (status == cudaErrorNotReady) {
        (void)cudaGetLastError();
        break;
      }
      TANDEM_CUDA_CHECK(status);
      pinned_host_allocator().deallocate(oldest.buffer, oldest.bytes);
      spare_events.push_back(oldest.copied);
      in_flight.pop_front();
    }
  }

  cudaEvent_t take_event() {
    if (!spare_events.empty()) {
      cudaEvent_t e = spare_events.back();
      spare_events.pop_back();
      return e;
    }
    cudaEvent_t e = nullptr;
    TANDEM_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    return e;
  }
};

CopyEngine& engine_for(int device) {
  static std::mutex mutex;
  static auto* engines = new std::unordered_map<int, std::unique_ptr<CopyEngine>>();
  std::lock_guard<std::mutex> lock(mutex);
  auto& slot = (*engines)[device];
  if (!slot) slot = std::make_unique<CopyEngine>(device);
  return *slot;
}

}  // namespace

std::vector<Tensor> stage_to_device(const std::vector<Tensor>& host, Device device) {
  CopyEngine& engine = engine_for(device.index);
  std::lock_guard<std::mutex> lock(engine.mutex);
  DeviceGuard guard(device);
  const cudaStream_t consumer = current_stream();
  engine.reclaim();

  std::vector<Tensor> out;
  out.reserve(host.size());
  // The destinations come from the consumer stream's pool: the copy stream starts after the
  // consumer's earlier work on those blocks.
  TANDEM_CUDA_CHECK(cudaEventRecord(engine.consumer_ready, consumer));
  TANDEM_CUDA_CHECK(cudaStreamWaitEvent(engine.stream, engine.consumer_ready, 0));
  for (const Tensor& t : host) {
    if (!t.defined() || t.device() == device) {
      out.push_back(t);
      continue;
    }
    TANDEM_CHECK(t.device().is_cpu(), "input copies to ", device, ": a tensor on ", t.device(),
                 "; only host tensors are staged");
    Tensor destination = Tensor::empty(t.shape(), t.dtype(), device);
    const size_t bytes = t.nbytes();
    if (bytes > 0) {
      Staged staged;
      staged.bytes = bytes;
      staged.buffer = pinned_host_allocator().allocate(bytes);
      std::memcpy(staged.buffer, t.raw_data(), bytes);
      TANDEM_CUDA_CHECK(cudaMemcpyAsync(destination.raw_data(), staged.buffer, bytes,
                                        cudaMemcpyHostToDevice, engine.stream));
      staged.copied = engine.take_event();
      TANDEM_CUDA_CHECK(cudaEventRecord(staged.copied, engine.stream));
      engine.in_flight.push_back(staged);
    }
    out.push_back(std::move(destination));
  }
  // The consumer's later kernels read the copies only after they are done.
  TANDEM_CUDA_CHECK(cudaEventRecord(engine.copies_done, engine.stream));
  TANDEM_CUDA_CHECK(cudaStreamWaitEvent(consumer, engine.copies_done, 0));
  return out;
}

}  // namespace tandem::cuda
