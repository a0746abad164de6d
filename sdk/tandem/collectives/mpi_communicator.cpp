// MpiWorld. Before each collective, small non-blocking arrival
// messages are polled against the collective timeout, so a worker that never arrives (it died,
// or it is stuck) makes the others raise naming it instead of hanging; then the blocking MPI
// call runs.
#include "tandem/collectives/internal/mpi_communicator.h"

// The C API only (Open MPI's C++ bindings do not build warning-free).
#include <unistd.h>

#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tandem/collectives/internal/flat_ranges.h"
#include "tandem/collectives/internal/process_watch.h"
#include "tandem/collectives/internal/tensor_bytes.h"
#include "tandem/core/logging.h"
#include "tandem/core/spans.h"

namespace tandem::collectives {

namespace {

using Clock = std::chrono::steady_clock;

/// An arrival message: {call number, call signature} as two int64, then any data.
constexpr size_t kArrivalHeaderBytes = 2 * sizeof(int64_t);
/// All-reduces of at most this many bytes send their data with the arrival messages, which
/// then stay within 4 KiB: Open MPI's eager limit on shared memory (larger messages take a
/// rendezvous round trip).
constexpr size_t kEagerBytes = 4096 - kArrivalHeaderBytes;

MPI_Datatype mpi_type(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return MPI_FLOAT;
    case DType::kFloat64:
      return MPI_DOUBLE;
    case DType::kInt32:
      return MPI_INT32_T;
    case DType::kInt64:
      return MPI_INT64_T;
    case DType::kUInt8:
      return MPI_UINT8_T;
    case DType::kBFloat16:
    case DType::kFloat16:
      return MPI_UINT16_T;  // combined by the operations of half_op
    default:
      TANDEM_THROW("mpi: ", dtype, " tensors cannot be reduced (numeric types only)");
  }
}

/// MPI's reduction functions for 16-bit floating values (gradients sent compressed), which MPI
/// has no type for: a sum added in float32 and rounded once per pair, and a maximum that keeps
/// NaN (inout = in op inout).
template <typename T, bool kMax>
void combine_half(void* in, void* inout, int* length, MPI_Datatype* /*type*/) {
  const T* x = static_cast<const T*>(in);
  T* y = static_cast<T*>(inout);
  for (int i = 0; i < *length; ++i) {
    if constexpr (kMax) {
      y[i] = detail::max_propagating_nan(y[i], x[i]);
    } else {
      y[i] = T(static_cast<float>(x[i]) + static_cast<float>(y[i]));
    }
  }
}

template <typename T, bool kMax>
MPI_Op half_op() {
  static const MPI_Op op = [] {
    MPI_Op made = MPI_OP_NULL;
    MPI_Op_create(&combine_half<T, kMax>, /*commute=*/1, &made);
    return made;
  }();
  return op;
}

MPI_Op mpi_op(ReduceOp op, DType dtype) {
  const bool max = op == ReduceOp::kMax;
  if (dtype == DType::kBFloat16)
    return max ? half_op<bfloat16, true>() : half_op<bfloat16, false>();
  if (dtype == DType::kFloat16) return max ? half_op<float16, true>() : half_op<float16, false>();
  return max ? MPI_MAX : MPI_SUM;
}

/// Whether two workers' pieces combined with `op` give the same bits in either order, so that
/// combining each range as worker 0's piece op worker 1's piece gives the bits of any order
/// Open MPI's all-reduce takes: sums of every numeric dtype (IEEE addition commutes, ±0 and
/// infinities included; 16-bit values add in float32 and round once, as half_op does; integers
/// wrap alike), but for which NaN's payload a sum of two NaNs carries (the first's, on x86), and
/// maxima of integers. A floating maximum does not commute bitwise: max(+0, -0) keeps the first,
/// and whether MPI_MAX keeps a NaN depends on which side it comes from.
bool combines_alike_in_either_order(DType dtype, ReduceOp op) {
  return op != ReduceOp::kMax || !is_floating(dtype);
}

std::string mpi_error(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(code, text, &length);
  return std::string(text, static_cast<size_t>(length));
}

void check_mpi(int code, const char* what) {
  TANDEM_CHECK(code == MPI_SUCCESS, "mpi ", what, " failed: ", mpi_error(code));
}

std::weak_ptr<MpiWorld>& world_slot() {
  static std::weak_ptr<MpiWorld> slot;
  return slot;
}

}  // namespace

struct MpiWorld::Impl {
  MPI_Comm data = MPI_COMM_NULL;     // collectives
  MPI_Comm arrival = MPI_COMM_NULL;  // arrival messages, so their tags never meet data traffic
  uint64_t calls = 0;
  // The arrival message this process sends to every peer: {call number, call signature} and,
  // for a small all-reduce, the data itself. Per peer, the message received from it (room for
  // the largest: a peer making a different call is then told apart by its signature).
  std::vector<char> outgoing;
  std::vector<std::vector<char>> incoming;
  int64_t signature = 0;  // of the call under way

  int64_t received_call(int peer) const { return header_of(peer)[0]; }
  int64_t received_signature(int peer) const { return header_of(peer)[1]; }
  std::array<int64_t, 2> header_of(int peer) const {
    std::array<int64_t, 2> header{};
    std::memcpy(header.data(), incoming[static_cast<size_t>(peer)].data(), sizeof(header));
    return header;
  }
  std::vector<MPI_Request> arrival_requests;
  std::vector<char> pack;              // staging for several tensors of one dtype
  std::vector<char> received;          // the peer's piece of a two-worker reduce_scatter
  std::vector<ProcessIdentity> peers;  // every worker's process, to name one that died

  // A blocking MPI call cannot be abandoned: while one runs, a thread watches the other
  // workers' processes, so that one on this machine that dies during it is named at once (the
  // call itself then waits until mpirun ends the job). One that is stopped (SIGSTOP, a
  // debugger) would hold the call forever, and mpirun does not notice it: once the call has
  // run past the collective timeout and the peer has stayed stopped for kStoppedFor, the
  // thread names it and aborts the job (MPI_Abort), the only way out of the call.
  struct Watch {
    std::mutex mutex;
    std::condition_variable wake;
    bool stop = false;
    bool active = false;  // a blocking call runs
    // Set without the mutex (every call sets `polling`): wait() polls the arrivals and names a
    // gone worker itself; once this worker named one, or raised from an exchange (on its way
    // out: the others end because of it, or of the same cause), the thread names none.
    std::atomic<bool> polling{false};
    std::atomic<bool> gone_named{false};
    std::atomic<bool> raised{false};
    Clock::time_point since;
    std::string label;
    uint64_t call = 0;
    int workers = 0;
    std::chrono::milliseconds timeout{0};  // collective_timeout() when the call began
  } watch;
  /// How long a peer must be seen stopped, after the call's timeout, before the job is aborted:
  /// a stop that ends at once (a debugger's breakpoint, job control) does not end the job.
  static constexpr std::chrono::milliseconds kStoppedFor{500};
  std::thread watcher;
  pid_t watcher_process = 0;  // the process that started it

  void watch_peers(int rank) {
    std::unique_lock<std::mutex> lock(watch.mutex);
    // Whether a gone worker was named: later ones are not (they may have ended because of it,
    // after raising as this worker will).
    bool reported = false;
    auto next_look = Clock::now();  // between exchanges: every kOutsideLook
    // Per peer, since when it has been seen stopped during the call under way (zero: running).
    std::vector<Clock::time_point> stopped_since(peers.size());
    while (!watch.stop) {
      watch.wake.wait_for(lock, std::chrono::milliseconds(20));
      const auto now = Clock::now();
      if (!watch.active) {
        std::fill(stopped_since.begin(), stopped_since.end(), Clock::time_point{});
        if (!reported && now >= next_look && quiet()) {
          next_look = now + kOutsideLook;
          reported = name_gone_outside_calls(lock, rank);
        }
        continue;
      }
      if (now - watch.since < std::chrono::milliseconds(20)) continue;
      if (now - watch.since >= watch.timeout) {
        for (size_t peer = 0; peer < peers.size(); ++peer) {
          if (static_cast<int>(peer) == rank || !process_stopped(peers[peer])) {
            stopped_since[peer] = Clock::time_point{};
            continue;
          }
          if (stopped_since[peer] == Clock::time_point{}) stopped_since[peer] = now;
          if (now - stopped_since[peer] >= kStoppedFor)
            abort_for_stopped(lock, rank, static_cast<int>(peer));
        }
      }
      for (size_t peer = 0; peer < peers.size() && !reported && quiet(); ++peer) {
        if (static_cast<int>(peer) == rank || !process_ended(peers[peer])) continue;
        TANDEM_LOG_ERROR(watch.label, " #", watch.call, " across ", watch.workers,
                         " workers failed on worker ", rank, ": ",
                         gone(peer, " during the exchange"),
                         "; Open MPI cannot abandon the call, mpirun ends the job");
        reported = true;
      }
    }
  }
  /// "worker P (host, pid N) is gone: its process ended<when> (...)", for every such message.
  std::string gone(size_t peer, const char* when) const {
    std::ostringstream out;
    out << "worker " << peer << " (" << peers[peer].host << ", pid " << peers[peer].pid
        << ") is gone: its process ended" << when << " (it exited, crashed or was killed)";
    return out.str();
  }
  /// Whether the watching thread may name a gone worker: wait() is not polling (it names one
  /// itself), and this worker has neither named one nor raised from an exchange.
  bool quiet() const {
    return !watch.polling.load(std::memory_order_relaxed) &&
           !watch.gone_named.load(std::memory_order_relaxed) &&
           !watch.raised.load(std::memory_order_relaxed);
  }
  /// How often the processes are looked at between exchanges (mpirun gives about a second).
  static constexpr std::chrono::milliseconds kOutsideLook{100};
  /// Outside the exchanges (computing, saving a checkpoint), names a worker on this machine
  /// whose process ended: mpirun ends the job within about a second (SIGTERM, then SIGKILL),
  /// often before this worker reaches its next exchange, which would name it. No worker ends
  /// normally before every worker has reached MPI_Finalize (Open MPI's finalize waits for them
  /// all), and the watch stops before this one's; after a finalize of the program's own,
  /// nothing is named.
  bool name_gone_outside_calls(std::unique_lock<std::mutex>& lock, int rank) {
    const int workers = static_cast<int>(peers.size());
    lock.unlock();  // the peers never change; a call may begin meanwhile
    const auto finalized = [] {
      int done = 0;
      MPI_Finalized(&done);  // callable from any thread, at any time
      return done != 0;
    };
    bool named = finalized();
    for (size_t peer = 0; peer < peers.size() && !named; ++peer) {
      if (static_cast<int>(peer) == rank || !process_ended(peers[peer])) continue;
      // Once more, now that it is found: a call may have begun, or MPI been finalised.
      if (!quiet() || finalized()) break;
      TANDEM_LOG_ERROR("mpi: across ", workers, " workers, on worker ", rank, ": ", gone(peer, ""),
                       "; mpirun ends the job");
      named = true;
    }
    lock.lock();
    return named;
  }
  /// Names `peer`, stopped during the blocking call under way, and ends the job. Never returns.
  [[noreturn]] void abort_for_stopped(std::unique_lock<std::mutex>& lock, int rank, int peer) {
    const ProcessIdentity& who = peers[static_cast<size_t>(peer)];
    TANDEM_LOG_ERROR(watch.label, " #", watch.call, " across ", watch.workers, " workers: worker ",
                     peer, " (", who.host, ", pid ", who.pid,
                     ") is stopped (SIGSTOP, a debugger or job control) and the exchange did not "
                     "complete within ",
                     watch.timeout.count() / 1000.0,
                     " s (TANDEM_COLLECTIVE_TIMEOUT); Open MPI cannot abandon the call, worker ",
                     rank, " aborts the job");
    std::fflush(stderr);
    std::fflush(stdout);
    // The lock is released first: an MPI whose abort runs exit handlers reaches finalize(),
    // which takes it. And this process ends within 2 s whatever MPI_Abort does (it is called
    // beside the blocked call, which MPI_THREAD_SERIALIZED does not promise to support).
    lock.unlock();
    std::thread([] {
      std::this_thread::sleep_for(std::chrono::seconds(2));
      std::_Exit(kStoppedPeerExit);
    }).detach();
    MPI_Abort(MPI_COMM_WORLD, kStoppedPeerExit);
    std::_Exit(kStoppedPeerExit);  // MPI_Abort does not return; should it, end this process
  }
  /// The exit status of a worker that aborts the job over a stopped peer.
  static constexpr int kStoppedPeerExit = 3;

  void stop_watching() {
    if (!watcher.joinable()) return;
    // A forked child has no watcher thread, only its handle: nothing to stop there.
    if (::getpid() != watcher_process) {
      watcher.detach();
      return;
    }
    {
      std::lock_guard<std::mutex> lock(watch.mutex);
      watch.stop = true;
    }
    watch.wake.notify_all();
    watcher.join();
  }
};

std::shared_ptr<MpiWorld> MpiWorld::instance() {
  static std::mutex mutex;
  std::lock_guard<std::mutex> lock(mutex);
  if (std::shared_ptr<MpiWorld> world = world_slot().lock()) return world;
  std::shared_ptr<MpiWorld> world(new MpiWorld());
  world_slot() = world;
  static bool registered = false;
  if (!registered) {
    registered = true;
    // Finalise when the program ends, even if a strategy is still alive (a static one, say).
    std::atexit([] {
      if (std::shared_ptr<MpiWorld> alive = world_slot().lock()) alive->finalize();
    });
  }
  return world;
}

void MpiWorld::finalize() {
  impl_->stop_watching();
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  if (broken_) {
    // Pending calls would make MPI_Finalize wait for peers that are gone.
    TANDEM_LOG_WARNING("mpi: not finalising after a failed collective");
    return;
  }
  MPI_Comm_free(&impl_->data);
  MPI_Comm_free(&impl_->arrival);
  MPI_Finalize();
}

MpiWorld::MpiWorld() : impl_(std::make_unique<Impl>()) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) {
    int provided = 0;
    check_mpi(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided), "init");
    TANDEM_CHECK(provided >= MPI_THREAD_SERIALIZED, "mpi: this MPI library offers thread level ",
                 provided, "; Tandem needs MPI_THREAD_SERIALIZED");
  }
  // Errors come back as codes (raised as tandem::Error) instead of aborting the job.
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  check_mpi(MPI_Comm_dup(MPI_COMM_WORLD, &impl_->data), "comm_dup");
  check_mpi(MPI_Comm_dup(MPI_COMM_WORLD, &impl_->arrival), "comm_dup");
  MPI_Comm_set_errhandler(impl_->data, MPI_ERRORS_RETURN);
  MPI_Comm_set_errhandler(impl_->arrival, MPI_ERRORS_RETURN);
  MPI_Comm_rank(impl_->data, &rank_);
  MPI_Comm_size(impl_->data, &size_);
  impl_->incoming.assign(static_cast<size_t>(size_),
                         std::vector<char>(kArrivalHeaderBytes + kEagerBytes, 0));
  // Who every worker is: a worker on this machine that dies is then named within
  // milliseconds (mpirun ends the job soon after), not after the collective timeout.
  const ProcessIdentity me = this_process();
  impl_->peers.resize(static_cast<size_t>(size_));
  check_mpi(MPI_Allgather(&me, sizeof(me), MPI_BYTE, impl_->peers.data(), sizeof(me), MPI_BYTE,
                          impl_->data),
            "allgather of the workers' processes");
  bool neighbours = false;
  for (int peer = 0; peer < size_; ++peer)
    neighbours = neighbours ||
                 (peer != rank_ && impl_->peers[static_cast<size_t>(peer)].machine == me.machine &&
                  me.machine != 0);
  if (neighbours) {
    impl_->watcher_process = ::getpid();
    impl_->watcher = std::thread([this] { impl_->watch_peers(rank_); });
  }
}

MpiWorld::~MpiWorld() {
  impl_->stop_watching();
  finalize();
}

uint64_t MpiWorld::arrive(const char* label, std::initializer_list<int64_t> parameters,
                          const void* payload, size_t bytes) {
  Impl& m = *impl_;
  // After a failed collective, arrival messages of that call may still be pending (on buffers
  // this call would reuse) and the peers are out of step: nothing more can run.
  if (broken_)
    TANDEM_THROW(label, ": an earlier collective across the ", size_,
                 " workers failed; no further collective can run in this job");
  TANDEM_CHECK(bytes <= kEagerBytes, "mpi: an arrival message carries at most ", kEagerBytes,
               " bytes of data, got ", bytes);
  const uint64_t call = ++m.calls;
  m.signature = static_cast<int64_t>(call_signature(label, std::vector<int64_t>(parameters)));
  const std::array<int64_t, 2> header = {static_cast<int64_t>(call), m.signature};
  m.outgoing.resize(kArrivalHeaderBytes + bytes);
  std::memcpy(m.outgoing.data(), header.data(), kArrivalHeaderBytes);
  if (bytes > 0) std::memcpy(m.outgoing.data() + kArrivalHeaderBytes, payload, bytes);
  const int tag = static_cast<int>(call % 30000);
  m.arrival_requests.clear();
  for (int peer = 0; peer < size_; ++peer) {
    if (peer == rank_) continue;
    const auto p = static_cast<size_t>(peer);
    MPI_Request send, receive;
    check_mpi(MPI_Isend(m.outgoing.data(), static_cast<int>(m.outgoing.size()), MPI_BYTE, peer, tag,
                        m.arrival, &send),
              label);
    check_mpi(MPI_Irecv(m.incoming[p].data(), static_cast<int>(m.incoming[p].size()), MPI_BYTE,
                        peer, tag, m.arrival, &receive),
              label);
    m.arrival_requests.push_back(send);
    m.arrival_requests.push_back(receive);
  }
  return call;
}

void MpiWorld::wait(void* request_ptr, uint64_t call, const char* label) {
  Impl& m = *impl_;
  MPI_Request* request = static_cast<MPI_Request*>(request_ptr);
  const auto start = Clock::now();
  const auto deadline = start + collective_timeout();
  bool data_done = request == nullptr;
  bool arrivals_done = m.arrival_requests.empty();
  int spins = 0;
  auto next_look = start;
  // While this polls, the watching thread names no one; once it raised (the job is broken),
  // never again.
  struct Polling {
    Impl::Watch& watch;
    const bool& broken;
    Polling(Impl::Watch& w, const bool& b) : watch(w), broken(b) {
      watch.polling.store(true, std::memory_order_relaxed);
    }
    ~Polling() {
      if (broken) watch.raised.store(true, std::memory_order_relaxed);
      watch.polling.store(false, std::memory_order_relaxed);
    }
    Polling(const Polling&) = delete;
    Polling& operator=(const Polling&) = delete;
  } const polling(m.watch, broken_);
  const auto arrived = [&](int peer) {
    return m.received_call(peer) == static_cast<int64_t>(call);
  };
  const auto not_arrived = [&] {
    std::ostringstream out;
    int count = 0;
    for (int peer = 0; peer < size_; ++peer)
      if (peer != rank_ && !arrived(peer)) out << (count++ ? ", " : "") << peer;
    return count == 0 ? std::string() : (count == 1 ? "worker " : "workers ") + out.str();
  };
  std::vector<bool> named;  // workers named below as gone after they arrived (sized when one is)
  while (!(data_done && arrivals_done)) {
    int flag = 0;
    if (!data_done) {
      const int code = MPI_Test(request, &flag, MPI_STATUS_IGNORE);
      if (code != MPI_SUCCESS) {
        broken_ = true;
        TANDEM_THROW(label, " #", call, " across ", size_, " workers failed on worker ", rank_,
                     ": ", mpi_error(code));
      }
      data_done = flag != 0;
    }
    if (!arrivals_done) {
      const int code = MPI_Testall(static_cast<int>(m.arrival_requests.size()),
                                   m.arrival_requests.data(), &flag, MPI_STATUSES_IGNORE);
      if (code != MPI_SUCCESS) {
        broken_ = true;
        TANDEM_THROW(label, " #", call, " across ", size_, " workers failed on worker ", rank_,
                     ": ", mpi_error(code));
      }
      arrivals_done = flag != 0;
    }
    if (data_done && arrivals_done) break;
    const auto now = Clock::now();
    // A worker on this machine whose process ended can no longer take part. One that ended
    // before it arrived is raised at once. One that arrived first may have ended because of a
    // worker still missing (its own timeout, a little ahead of this one's): while one is missing,
    // it is named and the wait goes on, so that the missing one is what this worker raises.
    if (now - start > std::chrono::milliseconds(20) && now >= next_look) {
      next_look = now + std::chrono::milliseconds(20);
      for (int peer = 0; peer < size_; ++peer) {
        const auto p = static_cast<size_t>(peer);
        if (peer == rank_ || (!named.empty() && named[p]) || !process_ended(m.peers[p])) continue;
        const std::string missing = arrived(peer) ? not_arrived() : std::string();
        if (!missing.empty()) {
          TANDEM_LOG_ERROR(label, " #", call, " across ", size_, " workers, on worker ", rank_,
                           ": ", m.gone(p, " during the exchange"), "; ", missing,
                           " not arrived yet");
          if (named.empty()) named.assign(static_cast<size_t>(size_), false);
          named[p] = true;
          m.watch.gone_named.store(true, std::memory_order_relaxed);
          continue;
        }
        broken_ = true;
        TANDEM_THROW(label, " #", call, " across ", size_, " workers failed on worker ", rank_,
                     ": ",
                     m.gone(p, arrived(peer) ? " during the exchange" : " before it arrived"));
      }
    }
    if (now > deadline) {
      broken_ = true;
      std::ostringstream missing;
      int count = 0;
      for (int peer = 0; peer < size_; ++peer) {
        if (peer == rank_) continue;
        if (m.received_call(peer) != static_cast<int64_t>(call)) {
          missing << (count++ ? ", " : "") << peer;
        }
      }
      std::ostringstream message;
      message << label << " #" << call << " across " << size_ << " workers: ";
      if (count > 0) {
        message << (count == 1 ? "worker " : "workers ") << missing.str()
                << (count == 1 ? " did" : " did") << " not arrive";
      } else {
        message << "every worker arrived but the collective did not complete";
      }
      message << " within " << collective_timeout().count() / 1000.0
              << " s (TANDEM_COLLECTIVE_TIMEOUT); ";
      // A worker on this machine whose process is stopped (SIGSTOP, a debugger) is named as
      // such: it is not dead, and mpirun will not end the job for it.
      int stopped = 0;
      for (int peer = 0; peer < size_; ++peer) {
        const ProcessIdentity& who = m.peers[static_cast<size_t>(peer)];
        if (peer == rank_ || m.received_call(peer) == static_cast<int64_t>(call) ||
            !process_stopped(who))
          continue;
        message << (stopped++ ? "; " : "") << "worker " << peer << " (" << who.host << ", pid "
                << who.pid << ") is stopped (SIGSTOP, a debugger or job control)";
      }
      if (stopped == 0) message << "a worker may have died";
      throw TimeoutError(message.str());
    }
    // Poll hot at first (most arrivals take microseconds); then yield the core between polls,
    // so that other runnable threads (other workers, when processes outnumber cores) go first
    // but the core never idles; sleep only after a second of waiting. Sleeping sooner let the
    // (virtual) CPU idle while a peer finished the previous collective, and the large
    // all-reduce that followed ran up to 20% slower than MPI's own busy polling.
    if (++spins <= 1000) continue;
    if (Clock::now() - start < std::chrono::seconds(1)) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }
  // Every worker arrived, but one named above has ended since: nothing that follows can
  // complete with it.
  for (size_t peer = 0; peer < named.size(); ++peer) {
    if (!named[peer]) continue;
    broken_ = true;
    TANDEM_THROW(label, " #", call, " across ", size_, " workers failed on worker ", rank_, ": ",
                 m.gone(peer, " during the exchange"));
  }
  // Every worker arrived; each must be making the same call (the same collective with the same
  // sizes and dtype), or the blocking MPI calls that follow would pair up wrongly and hang.
  std::vector<int> different;
  for (int peer = 0; peer < size_; ++peer)
    if (peer != rank_ && m.received_signature(peer) != m.signature) different.push_back(peer);
  // No data call was made: MPI itself is fine, and the job may go on after the error.
  if (!different.empty()) raise_different_call(label, call, size_, different, rank_);
}

void MpiWorld::run_blocking(const std::function<int()>& mpi_call, uint64_t call,
                            const char* label) {
  Impl::Watch& watch = impl_->watch;
  if (impl_->watcher.joinable()) {
    std::lock_guard<std::mutex> lock(watch.mutex);
    watch.active = true;
    watch.since = Clock::now();
    watch.label = label;
    watch.call = call;
    watch.workers = size_;
    watch.timeout = collective_timeout();
  }
  struct EndWatch {
    Impl& impl;
    ~EndWatch() {
      if (!impl.watcher.joinable()) return;
      std::lock_guard<std::mutex> lock(impl.watch.mutex);
      impl.watch.active = false;
    }
  };
  int code = MPI_SUCCESS;
  {
    const EndWatch end{*impl_};
    code = mpi_call();
  }
  if (code == MPI_SUCCESS) return;
  broken_ = true;
  impl_->watch.raised.store(true, std::memory_order_relaxed);
  TANDEM_THROW(label, " #", call, " across ", size_, " workers failed on worker ", rank_, ": ",
               mpi_error(code));
}

void MpiWorld::combine_in_worker_order(void* buffer, size_t bytes, DType dtype, ReduceOp op) {
  const Impl& m = *impl_;
  // This worker's piece is `buffer` itself, which the combination overwrites.
  const std::vector<char> mine(static_cast<const char*>(buffer),
                               static_cast<const char*>(buffer) + bytes);
  const auto count = static_cast<int64_t>(bytes / dtype_size(dtype));
  combine_worker_pieces(buffer, count, dtype, op, size_, [&](int worker) -> const void* {
    return worker == rank_ ? mine.data()
                           : m.incoming[static_cast<size_t>(worker)].data() + kArrivalHeaderBytes;
  });
}

void MpiWorld::all_reduce(std::vector<Tensor>& tensors, ReduceOp op, const char* label) {
  all_reduce(tensors, op, label, /*layout=*/0);
}

void MpiWorld::reduce_scatter(Tensor& buffer, std::span<const int64_t> offsets, ReduceOp op,
                              const char* label) {
  check_worker_ranges(buffer, offsets, size_, "mpi", label, /*reduce=*/true);
  // Every worker decides alike (the same size, dtype and op, or the arrival's signatures
  // differ). A small buffer rides on the arrival messages whatever its ranges: one round trip.
  if (two_worker_reduce_scatter(buffer, op)) {
    const size_t w = static_cast<size_t>(rank_);
    Tensor range = buffer.view_as({offsets[w + 1] - offsets[w]},
                                  static_cast<size_t>(offsets[w]) * dtype_size(buffer.dtype()));
    reduce_scatter_two_workers(buffer, range, offsets, op, label);
    return;
  }
  std::vector<Tensor> whole = {buffer};
  all_reduce(whole, op, label, offsets_digest(offsets));
}

bool MpiWorld::two_worker_reduce_scatter(const Tensor& buffer, ReduceOp op) const {
  return size_ == 2 && buffer.nbytes() > kEagerBytes &&
         combines_alike_in_either_order(buffer.dtype(), op);
}

void MpiWorld::reduce_scatter(const Tensor& input, Tensor& output, std::span<const int64_t> offsets,
                              ReduceOp op, const char* label) {
  check_worker_ranges(input, offsets, size_, "mpi", label, /*reduce=*/true);
  if (!two_worker_reduce_scatter(input, op)) {
    WorkerCollectives::reduce_scatter(input, output, offsets, op, label);
    return;
  }
  reduce_scatter_two_workers(input, output, offsets, op, label);
}

void MpiWorld::reduce_scatter_two_workers(const Tensor& input, Tensor& output,
                                          std::span<const int64_t> offsets, ReduceOp op,
                                          const char* label) {
  Impl& m = *impl_;
  const DType dtype = input.dtype();
  const size_t element = dtype_size(dtype);
  const int peer = 1 - rank_;
  const auto first = [&](int worker) { return offsets[static_cast<size_t>(worker)]; };
  const auto length = [&](int worker) { return first(worker + 1) - first(worker); };
  // Before arriving: a worker that raised here would leave its peer in MPI_Sendrecv.
  TANDEM_CHECK(output.defined() && output.dtype() == dtype && output.numel() == length(rank_) &&
                   output.device().is_cpu(),
               "mpi ", label, ": the output must be a CPU tensor of ", length(rank_), " ", dtype,
               " elements, got ",
               output.defined() ? detail::str_cat(output.numel(), " ", output.dtype(),
                                                  " elements on ", output.device())
                                : std::string("an undefined tensor"));
  // all_reduce's signature, so that a worker making another call is named as there.
  const profile::Track track = profile::communicator_track();
  profile::Span waiting(profile::Phase::kCommWait, track);
  const uint64_t call = arrive(label, {static_cast<int64_t>(dtype), input.numel(),
                                       static_cast<int64_t>(op), offsets_digest(offsets)});
  wait(nullptr, call, label);
  waiting.end();
  // MPI counts are ints; the workers compared their offsets' digests, so all refuse together.
  const auto bytes = [&](int worker) { return static_cast<size_t>(length(worker)) * element; };
  if (std::max(bytes(rank_), bytes(peer)) > static_cast<size_t>(std::numeric_limits<int>::max()))
    TANDEM_THROW(label, " #", call, ": a range of ", std::max(bytes(rank_), bytes(peer)),
                 " bytes exceeds MPI's limit of ", std::numeric_limits<int>::max(),
                 " bytes for one reduce-scatter");
  const char* data = static_cast<const char*>(input.raw_data());
  const char* mine = data + static_cast<size_t>(first(rank_)) * element;
  char* out = static_cast<char*>(output.raw_data());
  m.received.resize(bytes(rank_));
  {
    // The whole buffer's bytes, as all_reduce and the other transports' reduce_scatter count
    // them: the time is what the true reduce-scatter saves.
    profile::Span moving(profile::Phase::kCommData, track);
    moving.set_bytes(static_cast<int64_t>(input.nbytes()));
    run_blocking(
        [&] {
          return MPI_Sendrecv(data + static_cast<size_t>(first(peer)) * element,
                              static_cast<int>(bytes(peer)), MPI_BYTE, peer, /*sendtag=*/0,
                              m.received.data(), static_cast<int>(bytes(rank_)), MPI_BYTE, peer,
                              /*recvtag=*/0, m.data, MPI_STATUS_IGNORE);
        },
        call, label);
    // Worker 0's piece op worker 1's piece, as the small all-reduce combines them (the order
    // does not change the bits here, see combines_alike_in_either_order), into the output.
    const ReduceOp combine = op == ReduceOp::kMax ? ReduceOp::kMax : ReduceOp::kSum;
    // Worker 0 adds the received piece into its own (copied to the output first unless that
    // is where it lies); worker 1 adds its own into the received one, then copies it out.
    dispatch_any_numeric(dtype, "reduce_scatter", [&]<typename T>() {
      T* acc = reinterpret_cast<T*>(rank_ == 0 ? out : m.received.data());
      const T* other = reinterpret_cast<const T*>(rank_ == 0 ? m.received.data() : mine);
      if (rank_ == 0 && out != mine && bytes(rank_) > 0) std::memcpy(out, mine, bytes(rank_));
      detail::reduce_in_order(acc, length(rank_), /*num_src=*/2, combine,
                              [&](int64_t) { return other; });
      if (rank_ == 1 && bytes(rank_) > 0) std::memcpy(out, m.received.data(), bytes(rank_));
    });
  }
  if (op == ReduceOp::kMean) divide_elements(output, size_);
}

void MpiWorld::all_gather(Tensor& buffer, std::span<const int64_t> offsets, const char* label) {
  check_worker_ranges(buffer, offsets, size_, "mpi", label, /*reduce=*/false);
  if (size_ == 1) return;
  const uint64_t call = arrive(
      label, {static_cast<int64_t>(buffer.dtype()), buffer.numel(), offsets_digest(offsets)});
  wait(nullptr, call, label);
  // MPI counts are ints; every worker has the same buffer now, so all refuse together.
  if (buffer.nbytes() > static_cast<size_t>(std::numeric_limits<int>::max()))
    TANDEM_THROW(label, " #", call, ": ", buffer.nbytes(), " bytes exceed MPI's limit of ",
                 std::numeric_limits<int>::max(), " bytes for one all-gather");
  const auto element = static_cast<int64_t>(dtype_size(buffer.dtype()));
  std::vector<int> counts(static_cast<size_t>(size_)), displacements(static_cast<size_t>(size_));
  for (size_t w = 0; w < counts.size(); ++w) {
    counts[w] = static_cast<int>((offsets[w + 1] - offsets[w]) * element);
    displacements[w] = static_cast<int>(offsets[w] * element);
  }
  profile::Span moving(profile::Phase::kCommData, profile::communicator_track());
  moving.set_bytes(static_cast<int64_t>(buffer.nbytes()));
  run_blocking(
      [&] {
        return MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buffer.raw_data(), counts.data(),
                              displacements.data(), MPI_BYTE, impl_->data);
      },
      call, label);
}

void MpiWorld::all_reduce(std::vector<Tensor>& tensors, ReduceOp op, const char* label,
                          int64_t layout) {
  if (size_ == 1) return;
  for (const Tensor& t : tensors)
    TANDEM_CHECK(t.defined() && t.device().is_cpu(), "mpi ", label,
                 ": tensors must be defined CPU tensors");
  // One call per dtype: a single tensor in place, several packed into one buffer.
  for_each_dtype_group(tensors, impl_->pack, [&](void* buffer, int64_t count, DType dtype) {
    const size_t element = dtype_size(dtype);
    // Every worker announces itself first (polled, so a missing one is named after the
    // timeout); then the blocking call, Open MPI's tuned algorithms, which its non-blocking
    // collectives do not use.
    const size_t bytes = static_cast<size_t>(count) * element;
    // The timeline: waiting for every worker to arrive, then the data's exchange.
    const profile::Track track = profile::communicator_track();
    profile::Span waiting(profile::Phase::kCommWait, track);
    if (bytes <= kEagerBytes) {
      // Small: the data rides on the arrival messages (one round instead of two), and every
      // worker combines the W pieces in worker order, so all get the same bits.
      const uint64_t call =
          arrive(label, {static_cast<int64_t>(dtype), count, static_cast<int64_t>(op), layout},
                 buffer, bytes);
      wait(nullptr, call, label);
      waiting.end();
      profile::Span moving(profile::Phase::kCommData, track);
      moving.set_bytes(static_cast<int64_t>(bytes));
      combine_in_worker_order(buffer, bytes, dtype, op);
    } else {
      const uint64_t call =
          arrive(label, {static_cast<int64_t>(dtype), count, static_cast<int64_t>(op), layout});
      wait(nullptr, call, label);
      waiting.end();
      profile::Span moving(profile::Phase::kCommData, track);
      moving.set_bytes(static_cast<int64_t>(bytes));
      run_blocking(
          [&] {
            return MPI_Allreduce(MPI_IN_PLACE, buffer, static_cast<int>(count), mpi_type(dtype),
                                 mpi_op(op, dtype), impl_->data);
          },
          call, label);
    }
  });
  if (op == ReduceOp::kMean)
    for (Tensor& t : tensors) divide_elements(t, size_);
}

void MpiWorld::broadcast(std::vector<Tensor>& tensors, int root, const char* label) {
  if (size_ == 1) return;
  for (Tensor& t : tensors) {
    TANDEM_CHECK(t.defined() && t.device().is_cpu(), "mpi ", label,
                 ": tensors must be defined CPU tensors");
    if (t.nbytes() == 0) continue;
    // MPI counts are ints (every worker has the same size, so all refuse together).
    TANDEM_CHECK(t.nbytes() <= static_cast<size_t>(std::numeric_limits<int>::max()), label, ": ",
                 t.nbytes(), " bytes exceed MPI's limit of ", std::numeric_limits<int>::max(),
                 " bytes for one broadcast");
    const uint64_t call = arrive(label, {static_cast<int64_t>(t.nbytes()), root});
    wait(nullptr, call, label);
    run_blocking(
        [&] {
          return MPI_Bcast(t.raw_data(), static_cast<int>(t.nbytes()), MPI_BYTE, root, impl_->data);
        },
        call, label);
  }
}

std::vector<std::vector<char>> MpiWorld::all_gather(const std::vector<char>& mine,
                                                    const char* label) {
  std::vector<std::vector<char>> out(static_cast<size_t>(size_));
  if (size_ == 1) {
    out[0] = mine;
    return out;
  }
  std::vector<int64_t> sizes(static_cast<size_t>(size_), 0);
  const auto size = static_cast<int64_t>(mine.size());
  const uint64_t call = arrive(label, {});
  wait(nullptr, call, label);
  run_blocking(
      [&] {
        return MPI_Allgather(&size, 1, MPI_INT64_T, sizes.data(), 1, MPI_INT64_T, impl_->data);
      },
      call, label);
  // MPI counts are ints: every worker sees the same sizes, so all refuse together.
  int64_t sum = 0;
  for (int64_t s : sizes) sum += s;
  if (sum > std::numeric_limits<int>::max())
    TANDEM_THROW(label, " #", call, ": ", sum, " bytes from ", size_,
                 " workers exceed MPI's limit of ", std::numeric_limits<int>::max(),
                 " bytes for one all-gather");
  std::vector<int> lengths(static_cast<size_t>(size_), 0);
  std::vector<int> offsets(static_cast<size_t>(size_), 0);
  int total = 0;
  for (int k = 0; k < size_; ++k) {
    lengths[static_cast<size_t>(k)] = static_cast<int>(sizes[static_cast<size_t>(k)]);
    offsets[static_cast<size_t>(k)] = total;
    total += lengths[static_cast<size_t>(k)];
  }
  const int length = static_cast<int>(size);
  std::vector<char> all(static_cast<size_t>(std::max(total, 1)));
  run_blocking(
      [&] {
        return MPI_Allgatherv(mine.data(), length, MPI_BYTE, all.data(), lengths.data(),
                              offsets.data(), MPI_BYTE, impl_->data);
      },
      call, label);
  for (int k = 0; k < size_; ++k) {
    const auto i = static_cast<size_t>(k);
    out[i].resize(static_cast<size_t>(lengths[i]));
    if (lengths[i] > 0)
      std::memcpy(out[i].data(), all.data() + offsets[i], static_cast<size_t>(lengths[i]));
  }
  return out;
}

std::vector<std::vector<Tensor>> MpiWorld::all_gather_tensors(const std::vector<Tensor>& mine,
                                                              const char* label) {
  std::vector<std::vector<Tensor>> out;
  for (const std::vector<char>& piece : all_gather(tensors_to_bytes(mine), label))
    out.push_back(tensors_from_bytes(piece, "mpi all_gather"));
  return out;
}

void MpiWorld::barrier(const char* label) {
  if (size_ == 1) return;
  // Every worker's arrival message reached every other: that is the barrier.
  wait(nullptr, arrive(label, {}), label);
}

}  // namespace tandem::collectives
