// Internal to the in_process backend: what one rank brings to a call, the state the ranks of a
// group share, the rendezvous that runs a call (in_process_rendezvous.cpp) and the data phases
// that work on the peers' buffers (in_process_kernels.cpp).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "tandem/collectives/internal/spin_wait.h"
#include "tandem/collectives/reduce_op.h"
#include "tandem/core/device.h"
#include "tandem/core/dtype.h"
#include "tandem/core/threading.h"
#include "tandem/tensor/device_runtime.h"
#include "tandem/tensor/tensor.h"

namespace tandem::collectives::in_process {

enum class Kind : uint8_t {
  kAllReduce,
  kAllGather,
  kBroadcast,
  kReduceScatter,
  kReduceScatterRanges,  // flat ranges (Note [flat ranges] in communicator.h)
  kAllGatherRanges,
  kBarrier,
  kRendezvous
};

/// Kinds whose ranks touch each other's buffers after the opening rendezvous.
inline bool moves_data(Kind kind) { return kind != Kind::kBarrier && kind != Kind::kRendezvous; }

/// What one rank brought to a call. Points at the caller's arguments, which stay valid until
/// the call returns on that rank.
struct Call {
  Kind kind = Kind::kBarrier;
  const char* label = "barrier";
  ReduceOp op = ReduceOp::kSum;
  int root = 0;
  const std::vector<Tensor>* inputs = nullptr;   // all_reduce, broadcast
  const std::vector<Tensor>* outputs = nullptr;  // all_reduce (== inputs when in place)
  const Tensor* input = nullptr;                 // all_gather, reduce_scatter (the buffer)
  const Tensor* output = nullptr;                // reduce_scatter
  std::vector<Tensor>* gathered = nullptr;       // all_gather
  std::span<const int64_t> offsets;              // the flat ranges' kinds
  const std::string* local_error = nullptr;      // non-empty: this rank's arguments are invalid
  Device device = Device::cpu();                 // where this rank's tensors live
};

/// Why the group was aborted; decides what the ranks that find it aborted raise.
enum class AbortCause : uint8_t { kExternal, kTimeout, kDeparture };

/// The state shared by the ranks of one InProcessRendezvous.
struct State {
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
  // How long they poll: one budget for the opening rendezvous, one for the closing one.
  detail::SpinBudget commit_budget, complete_budget;
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

// ---- the rendezvous (in_process_rendezvous.cpp) ----------------------------------------------

/// A call's data phase with its type erased (no allocation); the callable must outlive the
/// run_call it is passed to (a lambda written in the call does).
class DataPhase {
 public:
  template <typename Fn, typename = std::enable_if_t<!std::is_same_v<std::decay_t<Fn>, DataPhase>>>
  DataPhase(Fn&& fn)  // NOLINT(google-explicit-constructor): call sites pass lambdas
      : object_(const_cast<void*>(static_cast<const void*>(std::addressof(fn)))),
        call_([](void* object) { (*static_cast<std::remove_reference_t<Fn>*>(object))(); }) {}
  void operator()() const { call_(object_); }

 private:
  void* object_;
  void (*call_)(void* object);
};

/// One collective on rank `rank`: opening rendezvous (with the argument check across ranks),
/// the data phase, then the closing rendezvous for kinds that touch peer buffers. Raises on a
/// mismatch, an abort, a departed peer, and after the collective timeout.
void run_call(State& s, int rank, const Call& call, DataPhase data_phase);

/// Marks the group aborted (the mutex held); the first cause wins.
void abort_locked(State& s, AbortCause cause, uint64_t call, std::string reason);

/// "float32[2, 3]", or "undefined".
std::string describe_tensor(const Tensor& t);

// ---- the data phases (in_process_kernels.cpp) ------------------------------------------------

/// Rank `rank`'s share of the committed all_reduce: its slice of the flattened tensors, reduced
/// over every rank's inputs in rank order and written into every rank's outputs.
void all_reduce_phase(State& s, int rank, ReduceOp op);

/// Rank `rank`'s share of the committed flat reduce_scatter: an equal slice of the flat buffer
/// (whoever owns it), reduced over every rank's input in rank order as all_reduce_phase does,
/// and written into the output of the rank that owns each element.
void reduce_scatter_ranges_phase(State& s, int rank, ReduceOp op);

/// Rank `rank`'s share of the committed flat all_gather: every peer's range of its buffer
/// copied into this rank's buffer.
void all_gather_ranges_phase(State& s, int rank);

/// dst[j][i] = src[0][i] op src[1][i] op ... for i < count, on the device the buffers live on (a
/// GPU: a kernel on this rank's stream). `stream`: write large CPU outputs with non-temporal
/// stores.
void reduce_slice_on(Device device, DType dtype, const void* const* src, int num_src,
                     void* const* dst, int num_dst, int64_t count, ReduceOp op, bool stream);

/// Copies bytes between two buffers on `device` (a GPU: async on this rank's stream).
void copy_on(Device device, void* dst, const void* src, size_t bytes);

}  // namespace tandem::collectives::in_process
