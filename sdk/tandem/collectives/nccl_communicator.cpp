// The NCCL backend for several GPUs of one process: communicators created together in
// non-blocking mode, a host rendezvous with an argument check before each collective, and a
// watchdog thread that polls ncclCommGetAsyncError and the completion of queued collectives,
// aborting every communicator on an error or after the collective timeout.
#include "tandem/collectives/internal/nccl_communicator.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <sstream>
#include <thread>

#include "tandem/collectives/internal/flat_ranges.h"
#include "tandem/core/internal/cuda_check.h"
#include "tandem/core/logging.h"
#include "tandem/tensor/internal/cuda_context.h"

namespace tandem::collectives {

namespace {

using Clock = std::chrono::steady_clock;

ncclDataType_t nccl_type(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return ncclFloat32;
    case DType::kFloat64:
      return ncclFloat64;
    case DType::kInt32:
      return ncclInt32;
    case DType::kInt64:
      return ncclInt64;
    case DType::kUInt8:
      return ncclUint8;
    case DType::kBFloat16:
      return ncclBfloat16;
    case DType::kFloat16:
      return ncclFloat16;
    default:
      TANDEM_THROW("nccl: ", dtype, " tensors cannot be reduced (numeric types only)");
  }
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return ncclSum;
    case ReduceOp::kMean:
      return ncclAvg;
    case ReduceOp::kMax:
      return ncclMax;
  }
  return ncclSum;
}

/// A collective queued on a rank's stream: the watchdog checks that it ends in time.
struct InFlight {
  int rank = 0;
  const char* label = "";
  cudaEvent_t done = nullptr;
  Clock::time_point queued;
};

}  // namespace

struct NcclClique::State {
  std::vector<Device> devices;    // this process's ranks
  int first_rank = 0;             // global rank of devices[0]
  int total_ranks = 0;            // over every process
  std::vector<ncclComm_t> comms;  // each entry guarded by its comm_mutexes entry
  // Held while a rank's thread queues work on its communicator, and while the communicator is
  // aborted and freed, so that no call uses a freed communicator. Lock order: a comm mutex,
  // then `mutex`; code holding `mutex` never takes a comm mutex.
  std::vector<std::unique_ptr<std::mutex>> comm_mutexes;
  // Per rank: the communication stream NCCL runs on, and the two hand-off events between it
  // and the stream of the replica's thread (its compute stream).
  std::vector<cudaStream_t> comm_streams;
  std::vector<cudaEvent_t> inputs_ready;
  std::vector<cudaEvent_t> results_ready;
  std::shared_ptr<InProcessRendezvous> host;

  std::mutex mutex;  // guards everything below
  std::condition_variable cv;
  std::deque<InFlight> in_flight;
  std::vector<cudaEvent_t> spare_events;
  bool aborted = false;
  std::string abort_reason;
  bool stop = false;
  std::thread watchdog;
};

namespace {

/// Waits for a non-blocking communicator to leave ncclInProgress; raises on an error or after
/// the collective timeout.
void wait_ready(ncclComm_t comm, const char* what, int rank) {
  const auto deadline = Clock::now() + collective_timeout();
  for (;;) {
    ncclResult_t state = ncclSuccess;
    const ncclResult_t status = ncclCommGetAsyncError(comm, &state);
    TANDEM_CHECK(status == ncclSuccess, "nccl ", what, " on rank ", rank,
                 ": ncclCommGetAsyncError failed: ", ncclGetErrorString(status));
    if (state == ncclSuccess) return;
    if (state != ncclInProgress)
      TANDEM_THROW("nccl ", what, " on rank ", rank, ": ", ncclGetErrorString(state), " (",
                   ncclGetLastError(comm), ")");
    if (Clock::now() > deadline)
      throw TimeoutError(
          detail::str_cat("nccl ", what, " on rank ", rank, " did not finish within ",
                          collective_timeout().count() / 1000.0, " s (TANDEM_COLLECTIVE_TIMEOUT)"));
    std::this_thread::yield();
  }
}

void check_nccl(ncclResult_t status, ncclComm_t comm, const char* what, int rank) {
  if (status == ncclSuccess || status == ncclInProgress) {
    if (status == ncclInProgress) wait_ready(comm, what, rank);
    return;
  }
  TANDEM_THROW("nccl ", what, " on rank ", rank, ": ", ncclGetErrorString(status), " (",
               ncclGetLastError(comm), ")");
}

/// Marks the group aborted and releases the host rendezvous (with the state's mutex held by the
/// caller); false when it already was. free_comms then aborts the communicators.
bool mark_aborted(NcclClique::State& s, const std::string& reason) {
  if (s.aborted) return false;
  s.aborted = true;
  s.abort_reason = reason;
  s.host->abort(reason);
  TANDEM_LOG_ERROR("nccl: communicators aborted: ", reason);
  return true;
}

/// Aborts and frees every communicator of an aborted group: kernels waiting for peers return.
/// Called without the state's mutex; takes each communicator's own.
void free_comms(NcclClique::State& s) {
  for (size_t r = 0; r < s.comms.size(); ++r) {
    std::lock_guard<std::mutex> use(*s.comm_mutexes[r]);
    if (s.comms[r] == nullptr) continue;
    cuda::DeviceGuard guard(s.devices[r]);
    (void)ncclCommAbort(s.comms[r]);
    s.comms[r] = nullptr;
  }
}

void watchdog_main(NcclClique::State* s) {
  std::unique_lock<std::mutex> lock(s->mutex);
  while (!s->stop) {
    s->cv.wait_for(lock, std::chrono::milliseconds(50));
    if (s->stop || s->aborted) continue;
    std::string failure;
    // Asynchronous errors of any communicator (a failed peer, a network error), each read
    // under its own mutex (not the state's: see the lock order).
    lock.unlock();
    for (size_t r = 0; r < s->comms.size() && failure.empty(); ++r) {
      std::lock_guard<std::mutex> use(*s->comm_mutexes[r]);
      if (s->comms[r] == nullptr) continue;
      ncclResult_t state = ncclSuccess;
      if (ncclCommGetAsyncError(s->comms[r], &state) == ncclSuccess && state != ncclSuccess &&
          state != ncclInProgress)
        failure = detail::str_cat("rank ", r, " reported ", ncclGetErrorString(state));
    }
    lock.lock();
    // Collectives queued longer ago than the timeout and still not done on the GPU.
    while (failure.empty() && !s->in_flight.empty()) {
      InFlight& oldest = s->in_flight.front();
      cuda::DeviceGuard guard(s->devices[static_cast<size_t>(oldest.rank)]);
      const cudaError_t status = cudaEventQuery(oldest.done);
      if (status == cudaSuccess) {
        s->spare_events.push_back(oldest.done);
        s->in_flight.pop_front();
        continue;
      }
      (void)cudaGetLastError();
      if (Clock::now() - oldest.queued > collective_timeout())
        failure = detail::str_cat(
            oldest.label, " on rank ", oldest.rank, " did not finish on the GPU within ",
            collective_timeout().count() / 1000.0, " s (TANDEM_COLLECTIVE_TIMEOUT)");
      break;
    }
    if (!failure.empty() && mark_aborted(*s, failure)) {
      lock.unlock();
      free_comms(*s);
      lock.lock();
    }
  }
}

}  // namespace

// ---- NcclClique ---------------------------------------------------------------------------------

NcclClique::NcclClique() : state_(std::make_unique<State>()) {}

NcclClique::~NcclClique() {
  State& s = *state_;
  {
    std::lock_guard<std::mutex> lock(s.mutex);
    s.stop = true;
  }
  s.cv.notify_all();
  if (s.watchdog.joinable()) s.watchdog.join();
  // ncclCommDestroy waits for queued work, which never ends if a peer died: abort instead
  // when the group failed or a collective is still running on a GPU.
  bool pending = s.aborted;
  for (const InFlight& f : s.in_flight) {
    cuda::DeviceGuard guard(s.devices[static_cast<size_t>(f.rank)]);
    pending = pending || cudaEventQuery(f.done) != cudaSuccess;
  }
  (void)cudaGetLastError();
  for (size_t r = 0; r < s.comms.size(); ++r) {
    if (s.comms[r] == nullptr) continue;
    cuda::DeviceGuard guard(s.devices[r]);
    // A failed destroy may have freed the handle already: it is not touched again.
    if (pending) {
      (void)ncclCommAbort(s.comms[r]);
    } else {
      (void)ncclCommDestroy(s.comms[r]);
    }
  }
  for (size_t r = 0; r < s.comm_streams.size(); ++r) {
    cuda::DeviceGuard guard(s.devices[r]);
    if (s.comm_streams[r] != nullptr) (void)cudaStreamDestroy(s.comm_streams[r]);
    if (s.inputs_ready[r] != nullptr) (void)cudaEventDestroy(s.inputs_ready[r]);
    if (s.results_ready[r] != nullptr) (void)cudaEventDestroy(s.results_ready[r]);
  }
  for (const InFlight& f : s.in_flight) (void)cudaEventDestroy(f.done);
  for (cudaEvent_t e : s.spare_events) (void)cudaEventDestroy(e);
}

std::array<char, 128> NcclClique::unique_id() {
  static_assert(sizeof(ncclUniqueId) == 128, "ncclUniqueId is 128 bytes");
  ncclUniqueId id;
  TANDEM_CHECK(ncclGetUniqueId(&id) == ncclSuccess, "nccl: ncclGetUniqueId failed");
  std::array<char, 128> bytes{};
  std::memcpy(bytes.data(), &id, sizeof(id));
  return bytes;
}

std::shared_ptr<NcclClique> NcclClique::create(const std::vector<Device>& devices) {
  Spanning one_process;
  one_process.first_rank = 0;
  one_process.total_ranks = static_cast<int>(devices.size());
  one_process.unique_id = unique_id();
  return create(devices, one_process);
}

std::shared_ptr<NcclClique> NcclClique::create(const std::vector<Device>& devices,
                                               const Spanning& spanning) {
  TANDEM_CHECK(!devices.empty(), "nccl: a group needs at least one GPU");
  for (size_t i = 0; i < devices.size(); ++i) {
    TANDEM_CHECK(devices[i].is_cuda(), "nccl: rank ", i, " is on ", devices[i], ", not a GPU");
    for (size_t j = 0; j < i; ++j)
      TANDEM_CHECK(devices[i] != devices[j], "nccl: ranks ", j, " and ", i, " are both on ",
                   devices[i], "; NCCL takes one rank per GPU (logical replicas sharing a GPU ",
                   "use the in_process backend)");
  }
  std::shared_ptr<NcclClique> group(new NcclClique());
  State& s = *group->state_;
  s.devices = devices;
  s.first_rank = spanning.first_rank;
  s.total_ranks = spanning.total_ranks;
  s.host = InProcessRendezvous::create(static_cast<int>(devices.size()));
  const int n = static_cast<int>(devices.size());
  TANDEM_CHECK(s.first_rank >= 0 && s.first_rank + n <= s.total_ranks, "nccl: ranks ", s.first_rank,
               "..", s.first_rank + n - 1, " do not fit in ", s.total_ranks);
  s.comms.assign(devices.size(), nullptr);
  for (size_t i = 0; i < devices.size(); ++i)
    s.comm_mutexes.push_back(std::make_unique<std::mutex>());
  ncclUniqueId id;
  std::memcpy(&id, spanning.unique_id.data(), sizeof(id));
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // calls return at once; progress and errors are polled (watchdog)
  TANDEM_CHECK(ncclGroupStart() == ncclSuccess, "nccl: ncclGroupStart failed");
  for (int r = 0; r < n; ++r) {
    cuda::DeviceGuard guard(devices[static_cast<size_t>(r)]);
    const ncclResult_t status = ncclCommInitRankConfig(
        &s.comms[static_cast<size_t>(r)], s.total_ranks, id, s.first_rank + r, &config);
    TANDEM_CHECK(status == ncclSuccess || status == ncclInProgress, "nccl: creating rank ", r,
                 " on ", devices[static_cast<size_t>(r)], " failed: ", ncclGetErrorString(status));
  }
  const ncclResult_t end = ncclGroupEnd();
  TANDEM_CHECK(end == ncclSuccess || end == ncclInProgress,
               "nccl: creating the communicators failed: ", ncclGetErrorString(end));
  for (int r = 0; r < n; ++r) wait_ready(s.comms[static_cast<size_t>(r)], "init", r);
  s.comm_streams.assign(devices.size(), nullptr);
  s.inputs_ready.assign(devices.size(), nullptr);
  s.results_ready.assign(devices.size(), nullptr);
  for (int r = 0; r < n; ++r) {
    const auto i = static_cast<size_t>(r);
    cuda::DeviceGuard guard(devices[i]);
    TANDEM_CUDA_CHECK(cudaStreamCreateWithFlags(&s.comm_streams[i], cudaStreamNonBlocking));
    TANDEM_CUDA_CHECK(cudaEventCreateWithFlags(&s.inputs_ready[i], cudaEventDisableTiming));
    TANDEM_CUDA_CHECK(cudaEventCreateWithFlags(&s.results_ready[i], cudaEventDisableTiming));
  }
  for (int r = 0; r < n; ++r)
    group->communicators_.push_back(
        std::unique_ptr<NcclCommunicator>(new NcclCommunicator(group.get(), r)));
  s.watchdog = std::thread(watchdog_main, &s);
  return group;
}

int NcclClique::size() const { return state_->total_ranks; }
int NcclClique::local_size() const { return static_cast<int>(state_->devices.size()); }

NcclCommunicator& NcclClique::communicator(int rank) {
  TANDEM_CHECK(rank >= 0 && rank < local_size(), "nccl: no local rank ", rank, " (", local_size(),
               " in this process)");
  return *communicators_[static_cast<size_t>(rank)];
}

InProcessRendezvous& NcclClique::host_group() { return *state_->host; }

void NcclClique::abort(const std::string& reason) {
  bool newly = false;
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    newly = mark_aborted(*state_, reason);
  }
  if (newly) free_comms(*state_);
}

// ---- NcclCommunicator --------------------------------------------------------------------------

int NcclCommunicator::rank() const { return group_->state_->first_rank + rank_; }
int NcclCommunicator::size() const { return group_->size(); }

Device NcclCommunicator::device() const {
  return group_->state_->devices[static_cast<size_t>(rank_)];
}

void NcclCommunicator::enter(const char* label, const std::vector<Tensor>& tensors, int64_t extra) {
  NcclClique::State& s = *group_->state_;
  raise_if_aborted(label);
  const Device mine = device();
  for (size_t i = 0; i < tensors.size(); ++i) {
    TANDEM_CHECK(tensors[i].defined(), "nccl ", label, ": tensor ", i,
                 " is undefined (e.g. the gradient of a variable the loss does not depend on)");
    TANDEM_CHECK(tensors[i].device() == mine, "nccl ", label, " on rank ", rank_, ": tensor ", i,
                 " lives on ", tensors[i].device(), " but this rank's GPU is ", mine);
  }
  // The host rendezvous: every rank brings a signature of its call; a missing rank times out
  // (or is reported as departed), a different call raises on every rank.
  std::vector<int64_t> signature = {static_cast<int64_t>(std::hash<std::string>{}(label)), extra,
                                    static_cast<int64_t>(tensors.size())};
  for (const Tensor& t : tensors) {
    signature.push_back(static_cast<int64_t>(t.dtype()));
    signature.push_back(t.numel());
  }
  // Fixed-size records, so that lists of different lengths still gather.
  constexpr size_t kFields = 16;
  const int64_t digest = static_cast<int64_t>(std::hash<std::string>{}(std::string(
      reinterpret_cast<const char*>(signature.data()), signature.size() * sizeof(int64_t))));
  std::vector<int64_t> record(kFields, 0);
  for (size_t i = 0; i < std::min(kFields - 1, signature.size()); ++i) record[i] = signature[i];
  record[kFields - 1] = digest;
  std::vector<Tensor> gathered;
  s.host->communicator(rank_).all_gather(gathered, Tensor::from_vector(record))->wait();
  for (int k = 0; k < group_->local_size(); ++k) {
    if (gathered[static_cast<size_t>(k)].to_vector<int64_t>() == record) continue;
    TANDEM_THROW("nccl ", label, ": rank ", k, " made a different call than rank ", rank_,
                 " (another collective, or tensors of other sizes or dtypes); every replica must "
                 "make the same collective calls in the same order");
  }
}

namespace {
/// The communication stream of `rank`, after making it wait for the work queued so far on the
/// calling thread's (compute) stream: the inputs are ready when NCCL reads them.
cudaStream_t begin_on_comm_stream(NcclClique::State& s, int rank) {
  const auto i = static_cast<size_t>(rank);
  TANDEM_CUDA_CHECK(cudaEventRecord(s.inputs_ready[i], cuda::current_stream()));
  TANDEM_CUDA_CHECK(cudaStreamWaitEvent(s.comm_streams[i], s.inputs_ready[i], 0));
  return s.comm_streams[i];
}

/// The compute stream waits for the collective: later kernels see its results, and the
/// buffers it used are reused only after it.
void end_on_comm_stream(NcclClique::State& s, int rank) {
  const auto i = static_cast<size_t>(rank);
  TANDEM_CUDA_CHECK(cudaEventRecord(s.results_ready[i], s.comm_streams[i]));
  TANDEM_CUDA_CHECK(cudaStreamWaitEvent(cuda::current_stream(), s.results_ready[i], 0));
}
}  // namespace

void NcclCommunicator::queued(const char* label) {
  NcclClique::State& s = *group_->state_;
  std::lock_guard<std::mutex> lock(s.mutex);
  if (s.aborted) throw_aborted(label);
  cuda::DeviceGuard guard(device());
  cudaEvent_t event = nullptr;
  if (!s.spare_events.empty()) {
    event = s.spare_events.back();
    s.spare_events.pop_back();
  } else {
    TANDEM_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
  }
  TANDEM_CUDA_CHECK(cudaEventRecord(event, s.comm_streams[static_cast<size_t>(rank_)]));
  s.in_flight.push_back({rank_, label, event, Clock::now()});
}

std::shared_ptr<Work> NcclCommunicator::all_reduce_impl(const std::vector<Tensor>& inputs,
                                                        const std::vector<Tensor>& outputs,
                                                        ReduceOp op) {
  TANDEM_CHECK(outputs.size() == inputs.size(), "nccl all_reduce: ", inputs.size(), " inputs but ",
               outputs.size(), " outputs");
  for (size_t i = 0; i < inputs.size(); ++i)
    TANDEM_CHECK(outputs[i].defined() && outputs[i].shape() == inputs[i].shape() &&
                     outputs[i].dtype() == inputs[i].dtype(),
                 "nccl all_reduce: output ", i, " does not match input ", i);
  enter("all_reduce", inputs, static_cast<int64_t>(op));
  cuda::DeviceGuard guard(device());
  std::lock_guard<std::mutex> use(*group_->state_->comm_mutexes[static_cast<size_t>(rank_)]);
  ncclComm_t comm = live_comm("all_reduce");
  // One group call for the whole list: NCCL fuses the launches.
  const cudaStream_t stream = begin_on_comm_stream(*group_->state_, rank_);
  check_nccl(ncclGroupStart(), comm, "all_reduce", rank_);
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (inputs[i].numel() == 0) continue;
    check_nccl(ncclAllReduce(inputs[i].raw_data(), outputs[i].raw_data(),
                             static_cast<size_t>(inputs[i].numel()), nccl_type(inputs[i].dtype()),
                             nccl_op(op), comm, stream),
               comm, "all_reduce", rank_);
  }
  check_nccl(ncclGroupEnd(), comm, "all_reduce", rank_);
  queued("all_reduce");
  end_on_comm_stream(*group_->state_, rank_);
  return completed_work();
}

std::vector<std::vector<int64_t>> NcclCommunicator::exchange_shapes(const Shape& shape) {
  if (group_->local_size() == size()) {
    // One process: the host rendezvous carries the shapes.
    std::vector<Tensor> sizes;
    group_->state_->host->communicator(rank_)
        .all_gather(sizes, Tensor::from_vector(shape.dims()))
        ->wait();
    std::vector<std::vector<int64_t>> out;
    for (const Tensor& t : sizes) out.push_back(t.to_vector<int64_t>());
    return out;
  }
  // Across processes: an NCCL all-gather of fixed-size records {rank of the shape, dims...},
  // read back once it completes (polled, so an aborted group raises instead of waiting).
  constexpr int64_t kMaxRank = 8;
  TANDEM_CHECK(shape.rank() <= kMaxRank, "nccl all_gather across processes: the input has rank ",
               shape.rank(), "; at most ", kMaxRank, " is supported");
  std::vector<int64_t> record(kMaxRank + 1, 0);
  record[0] = shape.rank();
  for (int64_t d = 0; d < shape.rank(); ++d) record[static_cast<size_t>(d + 1)] = shape[d];
  const Tensor mine = Tensor::from_vector(record).to(device());
  Tensor all = Tensor::zeros({size() * (kMaxRank + 1)}, DType::kInt64, device());
  NcclClique::State& s = *group_->state_;
  {
    std::lock_guard<std::mutex> use(*s.comm_mutexes[static_cast<size_t>(rank_)]);
    ncclComm_t comm = live_comm("all_gather (shapes)");
    const cudaStream_t stream = begin_on_comm_stream(s, rank_);
    check_nccl(ncclAllGather(mine.raw_data(), all.raw_data(), static_cast<size_t>(kMaxRank + 1),
                             ncclInt64, comm, stream),
               comm, "all_gather (shapes)", rank_);
    queued("all_gather (shapes)");
  }
  wait_for_comm_stream("all_gather (shapes)");
  const std::vector<int64_t> records = all.to(Device::cpu()).to_vector<int64_t>();
  std::vector<std::vector<int64_t>> out(static_cast<size_t>(size()));
  for (int k = 0; k < size(); ++k) {
    const int64_t* r = records.data() + k * (kMaxRank + 1);
    TANDEM_CHECK(r[0] >= 0 && r[0] <= kMaxRank, "nccl all_gather: rank ", k,
                 " sent an invalid shape record");
    out[static_cast<size_t>(k)].assign(r + 1, r + 1 + r[0]);
  }
  return out;
}

std::shared_ptr<Work> NcclCommunicator::all_gather_impl(std::vector<Tensor>& outputs,
                                                        const Tensor& input) {
  // Pieces may differ in their first dimension: first the shapes, then one broadcast per rank
  // (of every process) into outputs of the right size.
  // Checked before meeting the peers, so that a bad input raises here alone (the local peers
  // are released by the strategy) instead of after the shapes went out.
  TANDEM_CHECK(input.defined() && input.device() == device(), "nccl all_gather on rank ", rank(),
               ": the input must be a tensor on ", device());
  enter("all_gather", {}, static_cast<int64_t>(input.dtype()));
  cuda::DeviceGuard guard(device());
  const std::vector<std::vector<int64_t>> shapes = exchange_shapes(input.shape());
  outputs.resize(static_cast<size_t>(size()));
  std::lock_guard<std::mutex> use(*group_->state_->comm_mutexes[static_cast<size_t>(rank_)]);
  ncclComm_t comm = live_comm("all_gather");
  const int me = rank();  // global: roots are global ranks
  for (int k = 0; k < size(); ++k)
    outputs[static_cast<size_t>(k)] =
        k == me ? input.clone()
                : Tensor::empty(Shape(shapes[static_cast<size_t>(k)]), input.dtype(), device());
  const cudaStream_t stream = begin_on_comm_stream(*group_->state_, rank_);
  check_nccl(ncclGroupStart(), comm, "all_gather", rank_);
  for (int k = 0; k < size(); ++k) {
    Tensor& out = outputs[static_cast<size_t>(k)];
    if (out.numel() == 0) continue;
    check_nccl(
        ncclBroadcast(k == me ? input.raw_data() : out.raw_data(), out.raw_data(),
                      static_cast<size_t>(out.numel()), nccl_type(out.dtype()), k, comm, stream),
        comm, "all_gather", rank_);
  }
  check_nccl(ncclGroupEnd(), comm, "all_gather", rank_);
  queued("all_gather");
  end_on_comm_stream(*group_->state_, rank_);
  return completed_work();
}

std::shared_ptr<Work> NcclCommunicator::broadcast_impl(std::vector<Tensor>& tensors, int root) {
  TANDEM_CHECK(root >= 0 && root < size(), "nccl broadcast: root ", root, " is outside [0, ",
               size(), ")");
  enter("broadcast", tensors, root);
  cuda::DeviceGuard guard(device());
  std::lock_guard<std::mutex> use(*group_->state_->comm_mutexes[static_cast<size_t>(rank_)]);
  ncclComm_t comm = live_comm("broadcast");
  const cudaStream_t stream = begin_on_comm_stream(*group_->state_, rank_);
  check_nccl(ncclGroupStart(), comm, "broadcast", rank_);
  for (Tensor& t : tensors) {
    if (t.numel() == 0) continue;
    check_nccl(ncclBroadcast(t.raw_data(), t.raw_data(), static_cast<size_t>(t.numel()),
                             nccl_type(t.dtype()), root, comm, stream),
               comm, "broadcast", rank_);
  }
  check_nccl(ncclGroupEnd(), comm, "broadcast", rank_);
  queued("broadcast");
  end_on_comm_stream(*group_->state_, rank_);
  return completed_work();
}

std::shared_ptr<Work> NcclCommunicator::reduce_scatter_impl(Tensor& output, const Tensor& input,
                                                            ReduceOp op) {
  TANDEM_CHECK(input.defined() && input.rank() > 0 && input.dim(0) % size() == 0,
               "nccl reduce_scatter: the input's first dimension must be divisible by the ", size(),
               " ranks");
  Shape piece = input.shape();
  piece[0] = input.dim(0) / size();
  if (!output.defined()) output = Tensor::empty(piece, input.dtype(), device());
  TANDEM_CHECK(
      output.shape() == piece && output.dtype() == input.dtype() && output.device() == device(),
      "nccl reduce_scatter: the output must be ", input.dtype(), piece, " on ", device());
  enter("reduce_scatter", {input}, static_cast<int64_t>(op));
  cuda::DeviceGuard guard(device());
  std::lock_guard<std::mutex> use(*group_->state_->comm_mutexes[static_cast<size_t>(rank_)]);
  ncclComm_t comm = live_comm("reduce_scatter");
  const cudaStream_t stream = begin_on_comm_stream(*group_->state_, rank_);
  if (output.numel() > 0)
    check_nccl(
        ncclReduceScatter(input.raw_data(), output.raw_data(), static_cast<size_t>(output.numel()),
                          nccl_type(input.dtype()), nccl_op(op), comm, stream),
        comm, "reduce_scatter", rank_);
  queued("reduce_scatter");
  end_on_comm_stream(*group_->state_, rank_);
  return completed_work();
}

std::shared_ptr<Work> NcclCommunicator::reduce_scatter_ranges_impl(const Tensor& input,
                                                                   Tensor& output,
                                                                   std::span<const int64_t> offsets,
                                                                   ReduceOp op) {
  const std::string problem = flat_ranges_problem(input, offsets, size(), "the input", true);
  TANDEM_CHECK(problem.empty(), "nccl reduce_scatter on rank ", rank(), ": ", problem);
  TANDEM_CHECK(input.device() == device(), "nccl reduce_scatter on rank ", rank(),
               ": the input lives on ", input.device(), " but this rank's GPU is ", device());
  const auto me = static_cast<size_t>(rank());  // global: the offsets cover every process
  if (!output.defined())
    output = Tensor::empty({offsets[me + 1] - offsets[me]}, input.dtype(), device());
  const std::string output_problem = flat_output_problem(input, output, offsets, rank());
  TANDEM_CHECK(output_problem.empty(), "nccl reduce_scatter on rank ", rank(), ": ",
               output_problem);
  enter("reduce_scatter", {input}, offsets_digest(offsets) ^ static_cast<int64_t>(op));
  cuda::DeviceGuard guard(device());
  // Allocated on this thread's stream, which waits for the communication stream below
  // (end_on_comm_stream): the block is reused on that stream only after the copy read it.
  const Tensor reduced = Tensor::empty({input.numel()}, input.dtype(), device());
  std::lock_guard<std::mutex> use(*group_->state_->comm_mutexes[static_cast<size_t>(rank_)]);
  ncclComm_t comm = live_comm("reduce_scatter");
  const cudaStream_t stream = begin_on_comm_stream(*group_->state_, rank_);
  if (input.numel() > 0) {
    // Grouped like all_reduce_impl's call, so that NCCL plans the same all-reduce.
    check_nccl(ncclGroupStart(), comm, "reduce_scatter", rank_);
    check_nccl(
        ncclAllReduce(input.raw_data(), reduced.raw_data(), static_cast<size_t>(input.numel()),
                      nccl_type(input.dtype()), nccl_op(op), comm, stream),
        comm, "reduce_scatter", rank_);
    check_nccl(ncclGroupEnd(), comm, "reduce_scatter", rank_);
    if (output.numel() > 0)
      TANDEM_CUDA_CHECK(
          cudaMemcpyAsync(output.raw_data(),
                          static_cast<const char*>(reduced.raw_data()) +
                              static_cast<size_t>(offsets[me]) * dtype_size(input.dtype()),
                          output.nbytes(), cudaMemcpyDeviceToDevice, stream));
  }
  queued("reduce_scatter");
  end_on_comm_stream(*group_->state_, rank_);
  return completed_work();
}

std::shared_ptr<Work> NcclCommunicator::all_gather_ranges_impl(Tensor& buffer,
                                                               std::span<const int64_t> offsets) {
  const std::string problem = flat_ranges_problem(buffer, offsets, size(), "the buffer", false);
  TANDEM_CHECK(problem.empty(), "nccl all_gather on rank ", rank(), ": ", problem);
  TANDEM_CHECK(buffer.device() == device(), "nccl all_gather on rank ", rank(),
               ": the buffer lives on ", buffer.device(), " but this rank's GPU is ", device());
  enter("all_gather", {buffer}, offsets_digest(offsets));
  cuda::DeviceGuard guard(device());
  std::lock_guard<std::mutex> use(*group_->state_->comm_mutexes[static_cast<size_t>(rank_)]);
  ncclComm_t comm = live_comm("all_gather");
  const cudaStream_t stream = begin_on_comm_stream(*group_->state_, rank_);
  const size_t element = dtype_size(buffer.dtype());
  char* data = static_cast<char*>(buffer.raw_data());
  // As bytes: any dtype gathers (roots are global ranks, as the offsets are).
  check_nccl(ncclGroupStart(), comm, "all_gather", rank_);
  for (int k = 0; k < size(); ++k) {
    const auto begin = static_cast<size_t>(offsets[static_cast<size_t>(k)]) * element;
    const auto end = static_cast<size_t>(offsets[static_cast<size_t>(k) + 1]) * element;
    if (end == begin) continue;
    check_nccl(ncclBroadcast(data + begin, data + begin, end - begin, ncclUint8, k, comm, stream),
               comm, "all_gather", rank_);
  }
  check_nccl(ncclGroupEnd(), comm, "all_gather", rank_);
  queued("all_gather");
  end_on_comm_stream(*group_->state_, rank_);
  return completed_work();
}

std::shared_ptr<Work> NcclCommunicator::barrier_impl() {
  // A host barrier among this process's ranks (the GPU streams are not involved: order them
  // with events when needed); across processes, a one-element NCCL all-reduce that every rank
  // waits for on the host.
  enter("barrier", {}, 0);
  if (group_->local_size() == size()) return completed_work();
  cuda::DeviceGuard guard(device());
  Tensor token = Tensor::zeros({1}, DType::kFloat32, device());
  NcclClique::State& s = *group_->state_;
  {
    std::lock_guard<std::mutex> use(*s.comm_mutexes[static_cast<size_t>(rank_)]);
    ncclComm_t comm = live_comm("barrier");
    const cudaStream_t stream = begin_on_comm_stream(s, rank_);
    check_nccl(
        ncclAllReduce(token.raw_data(), token.raw_data(), 1, ncclFloat32, ncclSum, comm, stream),
        comm, "barrier", rank_);
    queued("barrier");
  }
  wait_for_comm_stream("barrier");
  return completed_work();
}

ncclComm_t NcclCommunicator::live_comm(const char* label) {
  NcclClique::State& s = *group_->state_;
  ncclComm_t comm = s.comms[static_cast<size_t>(rank_)];
  if (comm != nullptr) return comm;
  std::lock_guard<std::mutex> lock(s.mutex);
  throw_aborted(label);  // only an abort frees a communicator
}

void NcclCommunicator::wait_for_comm_stream(const char* label) {
  NcclClique::State& s = *group_->state_;
  const auto i = static_cast<size_t>(rank_);
  TANDEM_CUDA_CHECK(cudaEventRecord(s.results_ready[i], s.comm_streams[i]));
  // Polled, so that an abort (the watchdog's timeout, a peer's error) raises here; an aborted
  // communicator's kernels return early, so the results are not read after an abort.
  for (;;) {
    raise_if_aborted(label);
    const cudaError_t status = cudaEventQuery(s.results_ready[i]);
    if (status == cudaSuccess) break;
    TANDEM_CHECK(status == cudaErrorNotReady, "nccl ", label, " on rank ", rank(), ": ",
                 cudaGetErrorString(status));
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
  raise_if_aborted(label);
}

void NcclCommunicator::throw_aborted(const char* label) const {
  throw AbortedError(detail::str_cat("nccl ", label, " on rank ", rank(),
                                     ": the group was aborted: ", group_->state_->abort_reason));
}

void NcclCommunicator::raise_if_aborted(const char* label) const {
  std::lock_guard<std::mutex> lock(group_->state_->mutex);
  if (group_->state_->aborted) throw_aborted(label);
}

}  // namespace tandem::collectives
