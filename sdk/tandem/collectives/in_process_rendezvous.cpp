// The in_process rendezvous: call numbers, the argument check across ranks, the timeout /
// departure / abort paths, and the opening and closing rendezvous around each data phase.
#include <algorithm>
#include <cstring>
#include <sstream>

#include "tandem/collectives/communicator.h"
#include "tandem/collectives/internal/flat_ranges.h"
#include "tandem/collectives/internal/in_process_state.h"
#include "tandem/collectives/internal/replica_list.h"
#include "tandem/core/spans.h"

namespace tandem::collectives::in_process {

namespace {

using detail::replica_list;

// ---- messages --------------------------------------------------------------------------------

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
    case Kind::kReduceScatterRanges:
      out << "(" << c.op << ") of " << describe_tensor(*c.input) << " at offsets "
          << describe_offsets(c.offsets);
      break;
    case Kind::kAllGatherRanges:
      out << " of " << describe_tensor(*c.input) << " at offsets " << describe_offsets(c.offsets);
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
    case Kind::kReduceScatterRanges:
    case Kind::kAllGatherRanges:
      // Local checks passed on both: defined 1-D buffers and valid offsets.
      return a.op == b.op && a.input->dtype() == b.input->dtype() &&
             a.input->numel() == b.input->numel() && std::ranges::equal(a.offsets, b.offsets);
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

}  // namespace

std::string describe_tensor(const Tensor& t) {
  if (!t.defined()) return "undefined";
  return detail::str_cat(t.dtype(), t.shape());
}

void abort_locked(State& s, AbortCause cause, uint64_t call, std::string reason) {
  if (s.aborted) return;
  s.aborted = true;
  s.abort_cause = cause;
  s.abort_call = call;
  s.abort_reason = std::move(reason);
  s.cv.notify_all();
}

namespace {

/// Raises what a rank at `call` raises once the group is aborted.
[[noreturn]] void throw_aborted(const State& s, const char* label, uint64_t call) {
  if (call == s.abort_call && s.abort_cause == AbortCause::kTimeout)
    throw TimeoutError(s.abort_reason);
  if (call == s.abort_call && s.abort_cause == AbortCause::kDeparture) throw Error(s.abort_reason);
  throw AbortedError(detail::str_cat(label, " #", call, " abandoned: ", s.abort_reason));
}

/// Spins briefly for `counter` to reach `target` (see spin_wait); false: block, and let `wait`
/// report how long that took.
bool spin_until(const State& s, detail::BlockedWait& wait, const std::atomic<uint64_t>& counter,
                uint64_t target) {
  return wait.spin([&] { return counter.load(std::memory_order_acquire) >= target; }, s.spin);
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

/// Bytes of this rank's tensors that `call` moves (for the timeline).
int64_t payload_bytes(const Call& call) {
  int64_t bytes = 0;
  if (call.inputs != nullptr)
    for (const Tensor& t : *call.inputs)
      bytes += t.defined() ? static_cast<int64_t>(t.nbytes()) : 0;
  if (call.input != nullptr && call.input->defined())
    bytes += static_cast<int64_t>(call.input->nbytes());
  return bytes;
}

}  // namespace

void run_call(State& s, int rank, const Call& call, DataPhase data_phase) {
  uint64_t number = 0;
  const bool on_gpu = moves_data(call.kind) && call.device.is_cuda();
  // The timeline's two parts of a collective: waiting at the rendezvous for the slower ranks,
  // and the data phase (each rank reduces its share).
  const profile::Track track = profile::communicator_track();
  profile::Span waiting(profile::Phase::kCommWait, track);
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
      detail::BlockedWait wait(s.commit_budget);
      spin_until(s, wait, s.committed, number);
      lock.lock();
      wait_for_commit(s, lock, number, call.label);
    }
    if (!s.verdict.empty()) throw Error(s.verdict);
  }
  waiting.end();
  if (!moves_data(call.kind)) return;

  std::exception_ptr error;
  profile::Span moving(profile::Phase::kCommData, track);
  if (profile::enabled()) moving.set_bytes(payload_bytes(call));
  try {
    if (on_gpu)
      for (int k = 0; k < s.size; ++k)
        if (k != rank) s.ready[static_cast<size_t>(k)].wait();
    data_phase();
    if (on_gpu) s.done[static_cast<size_t>(rank)].record(call.device);
  } catch (...) {
    error = std::current_exception();
  }
  moving.end();
  {
    // The closing rendezvous waits for the ranks still in their data phase.
    profile::Span closing(profile::Phase::kCommWait, track);
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
      detail::BlockedWait wait(s.complete_budget);
      if (!spin_until(s, wait, s.completed, number)) {
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

}  // namespace tandem::collectives::in_process
