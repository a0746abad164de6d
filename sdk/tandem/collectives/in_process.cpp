// The InProcess backend: a mutex/condition-variable rendezvous with call numbers, the argument
// check across ranks, the timeout / departure / abort paths, and the data phases that read and
// write the peers' buffers directly.
#include "tandem/collectives/in_process.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <optional>
#include <sstream>

#if defined(__x86_64__)
#include <emmintrin.h>
#endif

#include "tandem/collectives/internal/spin_wait.h"
#include "tandem/core/threading.h"
#include "tandem/tensor/device_runtime.h"

#if TANDEM_WITH_CUDA
#include "tandem/collectives/internal/cuda_in_process.h"
#endif

namespace tandem::collectives {

namespace {

enum class Kind : uint8_t {
  kAllReduce,
  kAllGather,
  kBroadcast,
  kReduceScatter,
  kBarrier,
  kRendezvous
};

/// Kinds whose ranks touch each other's buffers after the opening rendezvous.
bool moves_data(Kind kind) { return kind != Kind::kBarrier && kind != Kind::kRendezvous; }

/// What one rank brought to a call. Points at the caller's arguments, which stay valid until
/// the call returns on that rank.
struct Call {
  Kind kind = Kind::kBarrier;
  const char* label = "barrier";
  ReduceOp op = ReduceOp::kSum;
  int root = 0;
  const std::vector<Tensor>* inputs = nullptr;   // all_reduce, broadcast
  const std::vector<Tensor>* outputs = nullptr;  // all_reduce (== inputs when in place)
  const Tensor* input = nullptr;                 // all_gather, reduce_scatter
  const Tensor* output = nullptr;                // reduce_scatter
  std::vector<Tensor>* gathered = nullptr;       // all_gather
  const std::string* local_error = nullptr;      // non-empty: this rank's arguments are invalid
  Device device = Device::cpu();                 // where this rank's tensors live
};

/// Why the group was aborted; decides what the ranks that find it aborted raise.
enum class AbortCause : uint8_t { kExternal, kTimeout, kDeparture };

}  // namespace

struct InProcessGroup::State {
  explicit State(int n)
      : size(n),
        spin(n <= hardware_cores() ? detail::SpinPolicy::kPause : detail::SpinPolicy::kYield),
        calls(n),
        entered(n, 0),
        departed(n, 0),
        src(n),
        dst(n),
        ready(static_cast<size_t>(n)),
        done(static_cast<size_t>(n)) {
    for (int r = 0; r < n; ++r) {
      src[r].resize(n);
      dst[r].resize(n);
    }
  }

  int size;
  detail::SpinPolicy spin;  // how waiting ranks poll before they sleep (see spin_wait)
  // One mutex and one condition variable for the whole group: every wait below re-checks its
  // own predicate, so a notify_all meant for another phase only costs a spurious wake-up.
  std::mutex mutex;
  std::condition_variable cv;

  std::vector<Call> calls;        // per rank: its current call (stable until the call ends)
  std::vector<uint64_t> entered;  // per rank: number of the last call it entered (from #1)
  std::vector<char> departed;     // per rank: its replica function returned
  int arrived = 0;                // ranks arrived at the open call
  // Written under the mutex; atomic so that waiters may also poll them while spinning.
  std::atomic<uint64_t> committed{0};  // last call every rank arrived at (its data phase may run)
  std::string verdict;                 // the committed call's argument problem; empty when fine
  int finished = 0;                    // ranks done with the committed call's data phase
  std::atomic<uint64_t> completed{0};  // last call whose data phase every rank finished

  bool aborted = false;
  AbortCause abort_cause = AbortCause::kExternal;
  uint64_t abort_call = 0;  // the call that was open when the group was aborted
  std::string abort_reason;

  // Per-rank scratch for the data phases (pointers into every rank's buffers), sized once so
  // steady-state calls allocate nothing.
  std::vector<std::vector<const void*>> src;
  std::vector<std::vector<void*>> dst;

  // GPU tensors (replicas sharing a GPU): per rank, the point in its stream where its buffers
  // are ready (recorded before it arrives) and where its data phase is done (recorded before
  // the closing rendezvous). Each rank's stream waits for its peers' points, so no host thread
  // ever waits for the GPU.
  std::vector<StreamEvent> ready;
  std::vector<StreamEvent> done;
};

namespace {

using State = InProcessGroup::State;

// ---- messages --------------------------------------------------------------------------------

std::string replica_list(const std::vector<int>& ranks) {
  std::ostringstream out;
  out << (ranks.size() == 1 ? "replica " : "replicas ");
  for (size_t i = 0; i < ranks.size(); ++i) out << (i ? ", " : "") << ranks[i];
  return out.str();
}

std::string describe_tensor(const Tensor& t) {
  if (!t.defined()) return "undefined";
  return detail::str_cat(t.dtype(), t.shape());
}

std::string describe_list(const std::vector<Tensor>& tensors) {
  std::ostringstream out;
  out << tensors.size() << (tensors.size() == 1 ? " tensor" : " tensors");
  const size_t shown = std::min<size_t>(tensors.size(), 6);
  for (size_t i = 0; i < shown; ++i) out << (i ? ", " : ": ") << describe_tensor(tensors[i]);
  if (shown < tensors.size()) out << ", ...";
  return out.str();
}

std::string describe(const Call& c) {
  std::ostringstream out;
  out << c.label;
  switch (c.kind) {
    case Kind::kAllReduce:
      out << "(" << c.op << ") of " << describe_list(*c.inputs);
      break;
    case Kind::kBroadcast:
      out << "(root " << c.root << ") of " << describe_list(*c.inputs);
      break;
    case Kind::kAllGather:
      out << " of " << describe_tensor(*c.input);
      break;
    case Kind::kReduceScatter:
      out << "(" << c.op << ") of " << describe_tensor(*c.input);
      break;
    case Kind::kBarrier:
    case Kind::kRendezvous:
      break;
  }
  return out.str();
}

std::string format_seconds(std::chrono::milliseconds ms) {
  std::ostringstream out;
  out << static_cast<double>(ms.count()) / 1000.0 << " s";
  return out.str();
}

bool same_tensors(const std::vector<Tensor>& a, const std::vector<Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].defined() != b[i].defined()) return false;
    if (a[i].defined() && (a[i].dtype() != b[i].dtype() || a[i].shape() != b[i].shape()))
      return false;
  }
  return true;
}

bool same_call(const Call& a, const Call& b) {
  if (a.kind != b.kind || std::strcmp(a.label, b.label) != 0) return false;
  switch (a.kind) {
    case Kind::kAllReduce:
      return a.op == b.op && same_tensors(*a.inputs, *b.inputs);
    case Kind::kBroadcast:
      return a.root == b.root && same_tensors(*a.inputs, *b.inputs);
    case Kind::kAllGather: {
      // Shapes may differ (a split batch gathers 4 + 2 rows); dtype and rank must agree.
      const Tensor& x = *a.input;
      const Tensor& y = *b.input;
      if (!x.defined() || !y.defined()) return x.defined() == y.defined();
      return x.dtype() == y.dtype() && x.rank() == y.rank();
    }
    case Kind::kReduceScatter:
      return a.op == b.op && a.input->defined() == b.input->defined() &&
             (!a.input->defined() ||
              (a.input->dtype() == b.input->dtype() && a.input->shape() == b.input->shape()));
    case Kind::kBarrier:
    case Kind::kRendezvous:
      return true;
  }
  return true;
}

/// Checks every rank's call against rank 0's; returns the problem, or "" when they agree.
std::string check_calls(const State& s, uint64_t call) {
  for (int k = 0; k < s.size; ++k) {
    if (!s.calls[k].local_error->empty())
      return detail::str_cat(s.calls[k].label, " #", call, ": replica ", k,
                             " passed invalid arguments: ", *s.calls[k].local_error);
  }
  const Call& first = s.calls[0];
  if (moves_data(first.kind)) {
    for (int k = 1; k < s.size; ++k) {
      if (s.calls[k].device == first.device ||
          (s.calls[k].device.is_cpu() && first.device.is_cpu()))
        continue;
      return detail::str_cat(first.label, " #", call, ": replica 0's tensors are on ", first.device,
                             " but replica ", k, "'s are on ", s.calls[k].device,
                             "; the in_process backend reduces GPU tensors only between "
                             "replicas that share one GPU (replicas on several GPUs use NCCL)");
    }
  }
  for (int k = 1; k < s.size; ++k) {
    if (same_call(first, s.calls[k])) continue;
    const bool same_kind = std::strcmp(first.label, s.calls[k].label) == 0;
    return detail::str_cat(same_kind ? first.label : "collective call", " #", call,
                           ": the replicas' calls do not match: replica 0 called ", describe(first),
                           " but replica ", k, " called ", describe(s.calls[k]),
                           ". Every replica must make the same collective calls, with the same "
                           "shapes and dtypes, in the same order");
  }
  return {};
}

std::string timeout_message(const State& s, uint64_t call, const char* label,
                            std::chrono::milliseconds timeout) {
  std::vector<int> missing, waiting;
  for (int k = 0; k < s.size; ++k) (s.entered[k] >= call ? waiting : missing).push_back(k);
  std::ostringstream out;
  out << label << " #" << call << " timed out after " << format_seconds(timeout) << ": "
      << replica_list(missing) << " did not arrive (";
  for (size_t i = 0; i < missing.size(); ++i) {
    const int k = missing[i];
    out << (i ? "; " : "") << "replica " << k << " entered " << s.entered[k] << " collective call"
        << (s.entered[k] == 1 ? "" : "s") << (s.departed[k] ? " and returned" : "");
  }
  out << "); " << replica_list(waiting) << (waiting.size() == 1 ? " was" : " were")
      << " waiting. Every replica must make the same collective calls in the same order; if a "
         "replica is only slow, raise TANDEM_COLLECTIVE_TIMEOUT (seconds)";
  return out.str();
}

/// A rank that returned from its replica function before reaching `call`, or -1.
int departed_before(const State& s, uint64_t call) {
  for (int k = 0; k < s.size; ++k)
    if (s.departed[k] && s.entered[k] < call) return k;
  return -1;
}

std::string departure_message(const State& s, uint64_t call, const char* label) {
  std::vector<int> gone, waiting;
  for (int k = 0; k < s.size; ++k) {
    if (s.departed[k] && s.entered[k] < call) gone.push_back(k);
    if (s.entered[k] >= call) waiting.push_back(k);
  }
  std::ostringstream out;
  out << label << " #" << call << ": " << replica_list(gone)
      << " returned from the replica function after " << s.entered[gone[0]] << " collective call"
      << (s.entered[gone[0]] == 1 ? "" : "s") << " and will never join this call; "
      << replica_list(waiting) << (waiting.size() == 1 ? " was" : " were")
      << " waiting. Every replica must make the same collective calls in the same order";
  return out.str();
}

void abort_locked(State& s, AbortCause cause, uint64_t call, std::string reason) {
  if (s.aborted) return;
  s.aborted = true;
  s.abort_cause = cause;
  s.abort_call = call;
  s.abort_reason = std::move(reason);
  s.cv.notify_all();
}

/// Raises what a rank at `call` raises once the group is aborted.
[[noreturn]] void throw_aborted(const State& s, const char* label, uint64_t call) {
  if (call == s.abort_call && s.abort_cause == AbortCause::kTimeout)
    throw TimeoutError(s.abort_reason);
  if (call == s.abort_call && s.abort_cause == AbortCause::kDeparture) throw Error(s.abort_reason);
  throw AbortedError(detail::str_cat(label, " #", call, " abandoned: ", s.abort_reason));
}

/// Spins briefly for `counter` to reach `target` (see spin_wait).
bool spin_until(const State& s, const std::atomic<uint64_t>& counter, uint64_t target) {
  return detail::spin_wait([&] { return counter.load(std::memory_order_acquire) >= target; },
                           s.spin);
}

/// Waits (lock held) until every rank has arrived at `call`; raises on abort, on a departed
/// peer, and after the collective timeout.
void wait_for_commit(State& s, std::unique_lock<std::mutex>& lock, uint64_t call,
                     const char* label) {
  const std::chrono::milliseconds timeout = collective_timeout();
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (s.committed < call) {
    if (s.aborted) throw_aborted(s, label, call);
    if (departed_before(s, call) >= 0) {
      abort_locked(s, AbortCause::kDeparture, call, departure_message(s, call, label));
      throw_aborted(s, label, call);
    }
    // Sleeps until a peer arrives, departs or aborts (each notifies), or until the deadline.
    if (s.cv.wait_until(lock, deadline) == std::cv_status::timeout && s.committed < call &&
        !s.aborted) {
      abort_locked(s, AbortCause::kTimeout, call, timeout_message(s, call, label, timeout));
      throw_aborted(s, label, call);
    }
  }
}

/// One collective on rank `rank`: opening rendezvous (with the argument check), the data
/// phase, then the closing rendezvous for kinds that touch peer buffers.
template <typename DataPhase>
void run_call(State& s, int rank, const Call& call, DataPhase&& data_phase) {
  uint64_t number = 0;
  const bool on_gpu = moves_data(call.kind) && call.device.is_cuda();
  // Peers read this rank's buffers from their own streams once the call opens.
  if (on_gpu) s.ready[static_cast<size_t>(rank)].record(call.device);
  {
    std::unique_lock<std::mutex> lock(s.mutex);
    number = ++s.entered[rank];
    if (s.aborted) throw_aborted(s, call.label, number);
    s.calls[rank] = call;
    if (++s.arrived == s.size) {
      // The last rank to arrive checks every rank's arguments and opens the call. No rank can
      // arrive at the next call (and overwrite calls[]) before every rank has left this one,
      // so the verdict and calls[] stay valid for everyone reading them below.
      s.arrived = 0;
      s.verdict = check_calls(s, number);
      s.committed = number;
      s.cv.notify_all();
    } else {
      lock.unlock();
      spin_until(s, s.committed, number);
      lock.lock();
      wait_for_commit(s, lock, number, call.label);
    }
    if (!s.verdict.empty()) throw Error(s.verdict);
  }
  if (!moves_data(call.kind)) return;

  std::exception_ptr error;
  try {
    if (on_gpu)
      for (int k = 0; k < s.size; ++k)
        if (k != rank) s.ready[static_cast<size_t>(k)].wait();
    data_phase();
    if (on_gpu) s.done[static_cast<size_t>(rank)].record(call.device);
  } catch (...) {
    error = std::current_exception();
  }
  {
    // Closing rendezvous: peers read and write this rank's buffers during the data phase, so no
    // rank may return (letting its caller reuse or free them) until every rank is done. This
    // wait ignores abort and the timeout on purpose: every rank is past the opening rendezvous
    // and the data phase is bounded local work, so it always ends.
    std::unique_lock<std::mutex> lock(s.mutex);
    if (++s.finished == s.size) {
      s.finished = 0;
      s.completed = number;
      s.cv.notify_all();
    } else {
      lock.unlock();
      if (!spin_until(s, s.completed, number)) {
        lock.lock();
        s.cv.wait(lock, [&] { return s.completed >= number; });
      }
    }
  }
  // Peers wrote this rank's outputs and read its inputs on their streams: this rank's later
  // work (and the reuse of its buffers) waits for them.
  if (on_gpu)
    for (int k = 0; k < s.size; ++k)
      if (k != rank) s.done[static_cast<size_t>(k)].wait();
  if (error) std::rethrow_exception(error);
}

// ---- reduction kernel ------------------------------------------------------------------------

template <typename T>
inline T max_propagating_nan(T acc, T in) {
  if constexpr (std::is_floating_point_v<T>) {
    return (in > acc || in != in) ? in : acc;
  } else {
    return in > acc ? in : acc;
  }
}

/// Out-of-place outputs at least this large (bytes per rank) are written with non-temporal
/// stores: they do not fit in the caches next to their peers anyway, and streaming stores skip
/// the read-for-ownership of every destination line (a third of the traffic). In place, the
/// destination line was just read as a source and is in cache, so ordinary stores win there
/// (measured on the 2-core EPYC: 64 MiB in place 3.4 vs 1.9 GB/s, out of place 1.4 vs 1.9).
constexpr size_t kStreamingBytes = size_t{8} << 20;

/// Copies `bytes` from `src` (in L1) to `dst`; with `stream`, through non-temporal stores
/// (the caller issues the store fence before other threads read `dst`).
inline void store_block(void* dst, const void* src, size_t bytes, bool stream) {
#if defined(__x86_64__)
  if (stream) {
    char* d = static_cast<char*>(dst);
    const char* from = static_cast<const char*>(src);
    size_t head = (16 - (reinterpret_cast<uintptr_t>(d) & 15)) & 15;
    head = std::min(head, bytes);
    std::memcpy(d, from, head);
    size_t i = head;
    for (; i + 16 <= bytes; i += 16)
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + i),
                       _mm_loadu_si128(reinterpret_cast<const __m128i*>(from + i)));
    std::memcpy(d + i, from + i, bytes - i);
    return;
  }
#endif
  (void)stream;
  std::memcpy(dst, src, bytes);
}

/// Orders this thread's non-temporal stores before its later stores (the closing
/// rendezvous's mutex), so peers that pass the rendezvous see the results.
inline void store_fence(bool streamed) {
#if defined(__x86_64__)
  if (streamed) _mm_sfence();
#endif
  (void)streamed;
}

/// dst[j][i] = reduce over k of src[k][i] for i < count, summing in the order k = 0, 1, ...
/// Works in blocks whose accumulator stays in L1 while the sources stream through it.
template <typename T>
void reduce_slice(const void* const* src, int num_src, void* const* dst, int num_dst, int64_t count,
                  ReduceOp op, bool stream) {
  constexpr int64_t kBlock = 8192 / static_cast<int64_t>(sizeof(T));
  alignas(64) T acc[kBlock];
  for (int64_t done = 0; done < count; done += kBlock) {
    const int64_t len = std::min(kBlock, count - done);
    const size_t bytes = static_cast<size_t>(len) * sizeof(T);
    std::memcpy(acc, static_cast<const T*>(src[0]) + done, bytes);
    for (int k = 1; k < num_src; ++k) {
      const T* in = static_cast<const T*>(src[k]) + done;
      if (op == ReduceOp::kMax) {
        for (int64_t i = 0; i < len; ++i) acc[i] = max_propagating_nan(acc[i], in[i]);
      } else {
        for (int64_t i = 0; i < len; ++i) acc[i] = static_cast<T>(acc[i] + in[i]);
      }
    }
    if (op == ReduceOp::kMean) {
      for (int64_t i = 0; i < len; ++i) acc[i] = static_cast<T>(acc[i] / num_src);
    }
    // Sources for this block were all read above, so writing in place is safe.
    for (int k = 0; k < num_dst; ++k)
      store_block(static_cast<T*>(dst[k]) + done, acc, bytes, stream && dst[k] != src[k]);
  }
}

void reduce_slice(DType dtype, const void* const* src, int num_src, void* const* dst, int num_dst,
                  int64_t count, ReduceOp op, bool stream) {
  dispatch_numeric(dtype, "all_reduce", [&]<typename T>() {
    reduce_slice<T>(src, num_src, dst, num_dst, count, op, stream);
  });
}

/// reduce_slice on the device the buffers live on: a kernel on this rank's stream for a GPU.
void reduce_slice_on(Device device, DType dtype, const void* const* src, int num_src,
                     void* const* dst, int num_dst, int64_t count, ReduceOp op, bool stream) {
  if (device.is_cpu()) {
    reduce_slice(dtype, src, num_src, dst, num_dst, count, op, stream);
    return;
  }
#if TANDEM_WITH_CUDA
  cuda_in_process::reduce_slice(device, dtype, src, num_src, dst, num_dst, count, op);
#else
  TANDEM_THROW("in_process collectives: ", device, " tensors need a CUDA build");
#endif
}

/// Copies bytes between two buffers on `device` (a GPU: async on this rank's stream).
void copy_on(Device device, void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  if (device.is_cpu()) {
    std::memcpy(dst, src, bytes);
    return;
  }
#if TANDEM_WITH_CUDA
  cuda_in_process::copy(device, dst, src, bytes);
#else
  TANDEM_THROW("in_process collectives: ", device, " tensors need a CUDA build");
#endif
}

/// Elements per rank slice: an equal share, rounded up to whole cache lines, and not below a
/// floor under which splitting costs more in cache traffic than it saves.
int64_t slice_elements(int64_t total, int ranks) {
  constexpr int64_t kGranule = 64;
  constexpr int64_t kMinSlice = 16 * 1024;
  int64_t part = (total + ranks - 1) / ranks;
  part = (part + kGranule - 1) / kGranule * kGranule;
  return std::max(part, kMinSlice);
}

void all_reduce_phase(State& s, int rank, ReduceOp op) {
  const std::vector<Tensor>& layout = *s.calls[0].inputs;
  int64_t total = 0;
  size_t bytes = 0;
  for (const Tensor& t : layout) {
    total += t.numel();
    bytes += t.nbytes();
  }
  const bool stream = bytes >= kStreamingBytes;
  const int64_t part = slice_elements(total, s.size);
  const int64_t begin = std::min(total, rank * part);
  const int64_t end = std::min(total, begin + part);
  if (begin >= end) return;
  const void** src = s.src[rank].data();
  void** dst = s.dst[rank].data();
  int64_t offset = 0;  // flattened index of tensor i's first element
  for (size_t i = 0; i < layout.size() && offset < end; ++i) {
    const int64_t numel = layout[i].numel();
    const int64_t lo = std::max(begin, offset);
    const int64_t hi = std::min(end, offset + numel);
    if (lo < hi) {
      const size_t skip = static_cast<size_t>(lo - offset) * dtype_size(layout[i].dtype());
      for (int k = 0; k < s.size; ++k) {
        src[k] = static_cast<const char*>((*s.calls[k].inputs)[i].raw_data()) + skip;
        dst[k] = static_cast<char*>((*s.calls[k].outputs)[i].raw_data()) + skip;
      }
      reduce_slice_on(s.calls[rank].device, layout[i].dtype(), src, s.size, dst, s.size, hi - lo,
                      op, stream);
    }
    offset += numel;
  }
  if (s.calls[rank].device.is_cpu()) store_fence(stream);
}

// ---- local argument checks (a problem is reported to every rank, not raised alone) ----------

/// Checks one tensor of this rank's call; `device` is the device of the call's first tensor
/// (set here when unset), which every other tensor of the call must share.
bool check_tensor(std::string& error, const Tensor& t, const char* what, size_t index, bool numeric,
                  std::optional<Device>& device) {
  if (!t.defined()) {
    error = detail::str_cat(what, " ", index,
                            " is undefined (e.g. the gradient of a variable the loss does not "
                            "depend on; skip it or use zeros)");
  } else if (device && t.device() != *device && !(t.device().is_cpu() && device->is_cpu())) {
    error = detail::str_cat(what, " ", index, " lives on ", t.device(), " but the call's first ",
                            "tensor on ", *device, "; one call works on one device");
  } else if (numeric && t.dtype() == DType::kBool) {
    error = detail::str_cat(what, " ", index, " is bool; only numeric tensors can be reduced");
  }
  if (error.empty() && !device) device = t.device();
  return error.empty();
}

}  // namespace

// ---- InProcessGroup ----------------------------------------------------------------------------

InProcessGroup::InProcessGroup(int size) : size_(size), state_(std::make_unique<State>(size)) {}
InProcessGroup::~InProcessGroup() = default;

std::shared_ptr<InProcessGroup> InProcessGroup::create(int size) {
  TANDEM_CHECK(size >= 1, "InProcessGroup::create: a group needs at least one rank, got ", size);
  std::shared_ptr<InProcessGroup> group(new InProcessGroup(size));
  for (int r = 0; r < size; ++r)
    group->communicators_.push_back(
        std::unique_ptr<InProcessCommunicator>(new InProcessCommunicator(group.get(), r)));
  return group;
}

InProcessCommunicator& InProcessGroup::communicator(int rank) {
  TANDEM_CHECK(rank >= 0 && rank < size_, "InProcessGroup::communicator: rank ", rank,
               " is outside [0, ", size_, ")");
  return *communicators_[rank];
}

void InProcessGroup::abort(const std::string& reason) {
  std::lock_guard<std::mutex> lock(state_->mutex);
  uint64_t open_call = 0;
  for (uint64_t e : state_->entered) open_call = std::max(open_call, e);
  abort_locked(*state_, AbortCause::kExternal, open_call, reason);
}

void InProcessGroup::depart(int rank) {
  std::lock_guard<std::mutex> lock(state_->mutex);
  state_->departed[rank] = 1;
  state_->cv.notify_all();  // waiters re-check whether this rank can still arrive
}

void InProcessGroup::reset() {
  std::lock_guard<std::mutex> lock(state_->mutex);
  State& s = *state_;
  std::fill(s.entered.begin(), s.entered.end(), 0);
  std::fill(s.departed.begin(), s.departed.end(), 0);
  s.arrived = 0;
  s.committed = 0;
  s.verdict.clear();
  s.finished = 0;
  s.completed = 0;
  s.aborted = false;
  s.abort_cause = AbortCause::kExternal;
  s.abort_call = 0;
  s.abort_reason.clear();
}

uint64_t InProcessGroup::calls_entered(int rank) const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->entered.at(rank);
}

// ---- InProcessCommunicator ---------------------------------------------------------------------

int InProcessCommunicator::size() const { return group_->size(); }

std::shared_ptr<Work> InProcessCommunicator::all_reduce_impl(const std::vector<Tensor>& inputs,
                                                             const std::vector<Tensor>& outputs,
                                                             ReduceOp op) {
  local_error_.clear();
  std::optional<Device> device;
  const bool in_place = &inputs == &outputs;
  if (!in_place && outputs.size() != inputs.size())
    local_error_ = detail::str_cat(inputs.size(), " inputs but ", outputs.size(), " outputs");
  for (size_t i = 0; i < inputs.size() && local_error_.empty(); ++i) {
    if (!check_tensor(local_error_, inputs[i], "tensor", i, /*numeric=*/true, device)) break;
    if (in_place) continue;
    if (!check_tensor(local_error_, outputs[i], "output", i, /*numeric=*/true, device)) break;
    if (outputs[i].shape() != inputs[i].shape() || outputs[i].dtype() != inputs[i].dtype())
      local_error_ = detail::str_cat("output ", i, " is ", describe_tensor(outputs[i]),
                                     " but input ", i, " is ", describe_tensor(inputs[i]));
  }
  if (size() == 1) {
    // One rank: the reduction of one value is the value itself (kMean divides by 1).
    TANDEM_CHECK(local_error_.empty(), "all_reduce: ", local_error_);
    if (!in_place)
      for (size_t i = 0; i < inputs.size(); ++i) {
        Tensor out = outputs[i];
        out.copy_from(inputs[i]);
      }
    return completed_work();
  }
  Call call;
  call.kind = Kind::kAllReduce;
  call.label = "all_reduce";
  call.op = op;
  call.inputs = &inputs;
  call.outputs = &outputs;
  call.local_error = &local_error_;
  call.device = device.value_or(Device::cpu());
  State& s = *group_->state_;
  run_call(s, rank_, call, [&] { all_reduce_phase(s, rank_, op); });
  return completed_work();
}

std::shared_ptr<Work> InProcessCommunicator::all_gather_impl(std::vector<Tensor>& outputs,
                                                             const Tensor& input) {
  local_error_.clear();
  std::optional<Device> device;
  check_tensor(local_error_, input, "input", 0, /*numeric=*/false, device);
  outputs.resize(static_cast<size_t>(size()));
  if (size() == 1) {
    TANDEM_CHECK(local_error_.empty(), "all_gather: ", local_error_);
    outputs[0] = input.clone();
    return completed_work();
  }
  Call call;
  call.kind = Kind::kAllGather;
  call.label = "all_gather";
  call.input = &input;
  call.gathered = &outputs;
  call.local_error = &local_error_;
  call.device = device.value_or(Device::cpu());
  State& s = *group_->state_;
  run_call(s, rank_, call, [&] {
    for (int k = 0; k < s.size; ++k) {
      const Tensor& source = *s.calls[k].input;
      Tensor copy = Tensor::empty(source.shape(), source.dtype(), call.device);
      copy_on(call.device, copy.raw_data(), source.raw_data(), source.nbytes());
      outputs[static_cast<size_t>(k)] = std::move(copy);
    }
  });
  return completed_work();
}

std::shared_ptr<Work> InProcessCommunicator::broadcast_impl(std::vector<Tensor>& tensors,
                                                            int root) {
  local_error_.clear();
  std::optional<Device> device;
  if (root < 0 || root >= size())
    local_error_ = detail::str_cat("root ", root, " is outside [0, ", size(), ")");
  for (size_t i = 0; i < tensors.size() && local_error_.empty(); ++i)
    check_tensor(local_error_, tensors[i], "tensor", i, /*numeric=*/false, device);
  if (size() == 1) {
    TANDEM_CHECK(local_error_.empty(), "broadcast: ", local_error_);
    return completed_work();
  }
  Call call;
  call.kind = Kind::kBroadcast;
  call.label = "broadcast";
  call.root = root;
  call.inputs = &tensors;
  call.local_error = &local_error_;
  call.device = device.value_or(Device::cpu());
  State& s = *group_->state_;
  run_call(s, rank_, call, [&] {
    if (rank_ == root) return;
    // Every non-root rank copies from the root at once: the copies run in parallel.
    const std::vector<Tensor>& from = *s.calls[root].inputs;
    for (size_t i = 0; i < tensors.size(); ++i)
      copy_on(call.device, tensors[i].raw_data(), from[i].raw_data(), tensors[i].nbytes());
  });
  return completed_work();
}

std::shared_ptr<Work> InProcessCommunicator::reduce_scatter_impl(Tensor& output,
                                                                 const Tensor& input, ReduceOp op) {
  local_error_.clear();
  std::optional<Device> device;
  if (check_tensor(local_error_, input, "input", 0, /*numeric=*/true, device)) {
    if (input.rank() == 0 || input.dim(0) % size() != 0) {
      local_error_ = detail::str_cat("the input's first dimension must be divisible by the ",
                                     size(), " replicas; the input is ", describe_tensor(input));
    } else {
      Shape piece = input.shape();
      piece[0] = input.dim(0) / size();
      if (!output.defined()) output = Tensor::empty(piece, input.dtype(), input.device());
      if (output.shape() != piece || output.dtype() != input.dtype() ||
          output.device() != input.device())
        local_error_ =
            detail::str_cat("the output is ", describe_tensor(output), " on ", output.device(),
                            "; it must be ", input.dtype(), piece, " on ", input.device());
    }
  }
  if (size() == 1) {
    TANDEM_CHECK(local_error_.empty(), "reduce_scatter: ", local_error_);
    output.copy_from(input);
    return completed_work();
  }
  Call call;
  call.kind = Kind::kReduceScatter;
  call.label = "reduce_scatter";
  call.op = op;
  call.input = &input;
  call.output = &output;
  call.local_error = &local_error_;
  call.device = device.value_or(Device::cpu());
  State& s = *group_->state_;
  run_call(s, rank_, call, [&] {
    const int64_t count = input.numel() / s.size;
    const size_t skip = static_cast<size_t>(rank_ * count) * dtype_size(input.dtype());
    const void** src = s.src[rank_].data();
    void** dst = s.dst[rank_].data();
    for (int k = 0; k < s.size; ++k)
      src[k] = static_cast<const char*>(s.calls[k].input->raw_data()) + skip;
    dst[0] = output.raw_data();
    reduce_slice_on(call.device, input.dtype(), src, s.size, dst, /*num_dst=*/1, count, op,
                    /*stream=*/false);
  });
  return completed_work();
}

std::shared_ptr<Work> InProcessCommunicator::barrier_impl() {
  if (size() == 1) return completed_work();
  local_error_.clear();
  Call call;
  call.kind = Kind::kBarrier;
  call.label = "barrier";
  call.local_error = &local_error_;
  run_call(*group_->state_, rank_, call, [] {});
  return completed_work();
}

void InProcessCommunicator::rendezvous(const char* label) {
  if (size() == 1) return;
  local_error_.clear();
  Call call;
  call.kind = Kind::kRendezvous;
  call.label = label;
  call.local_error = &local_error_;
  run_call(*group_->state_, rank_, call, [] {});
}

}  // namespace tandem::collectives
