// collectives::Communicator: the interface every collective backend implements (modelled on
// PyTorch c10d's Backend), the Work handle collectives return, per-communicator call counters
// and the collective timeout (TANDEM_COLLECTIVE_TIMEOUT).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tandem/collectives/reduce_op.h"
#include "tandem/core/error.h"
#include "tandem/tensor/tensor.h"

namespace tandem::collectives {

/// A collective in flight. Backends that finish a collective before returning (InProcess) hand
/// back a completed Work, whose wait() returns at once; asynchronous backends (NCCL) block in
/// wait() and raise there what the collective raised.
class Work {
 public:
  virtual ~Work() = default;
  /// Blocks until the collective has finished; raises what the collective raised.
  virtual void wait() {}
  /// True once wait() would not block.
  virtual bool is_completed() const { return true; }
};

/// The one completed Work, shared by every synchronous call (returning it allocates nothing).
std::shared_ptr<Work> completed_work();

/// Calls made through one communicator since it was created (never reset; read them while the
/// rank is idle, e.g. after strategy.run returned). A batched all_reduce counts once.
struct CollectiveStats {
  /// all_reduce calls (a batched call counts once).
  uint64_t all_reduce = 0;
  /// all_gather calls (per-rank outputs and flat ranges alike).
  uint64_t all_gather = 0;
  /// broadcast calls.
  uint64_t broadcast = 0;
  /// reduce_scatter calls (even rows and flat ranges alike).
  uint64_t reduce_scatter = 0;
  /// barrier calls.
  uint64_t barrier = 0;
  uint64_t bytes_all_reduced = 0;  ///< bytes of this rank's tensors passed to all_reduce
  /// Time this rank spent inside all_reduce calls, waiting for its peers included, as the
  /// backend's own spans measure it (profile::collective_ns; 0 for a backend that queues the
  /// collective on the device and returns, NCCL).
  double all_reduce_seconds = 0.0;
  /// Every collective call of any kind.
  uint64_t total() const { return all_reduce + all_gather + broadcast + reduce_scatter + barrier; }
};

/// Raised by a collective that was abandoned because of something outside it: a peer replica
/// raised an exception, or the group was aborted after a timeout or a mismatch. The message
/// names the collective and the cause; the cause itself is raised where it happened.
class AbortedError : public Error {
 public:
  /// `message` names the collective and the cause.
  explicit AbortedError(const std::string& message) : Error(message) {}
};

/// The longest a collective waits for its peers: TANDEM_COLLECTIVE_TIMEOUT seconds (default 300;
/// fractions allowed), unless set_collective_timeout overrides it.
std::chrono::milliseconds collective_timeout();
/// Overrides the timeout for collectives that start waiting afterwards (tests use 1-2 s);
/// returns the previous value.
std::chrono::milliseconds set_collective_timeout(std::chrono::milliseconds timeout);

/// One rank's endpoint of a group of ranks that run collectives together. Every rank must make
/// the same calls in the same order with matching arguments; a mismatch, or a peer that never
/// arrives, raises on every waiting rank (after at most collective_timeout()), never hangs.
/// Unsupported calls raise "backend X does not support Y".
class Communicator {
 public:
  virtual ~Communicator() = default;

  /// This endpoint's rank in [0, size()).
  virtual int rank() const = 0;
  /// The number of ranks in the group.
  virtual int size() const = 0;
  /// The backend: "in_process", "nccl", "mpi".
  virtual std::string name() const = 0;
  /// True when a collective only queues its work on the device (NCCL: on the communication
  /// stream, ordered after the work already queued on the replica's stream) and returns at
  /// once; false when the calling thread moves the data and the collective has completed when
  /// the call returns.
  virtual bool queues_on_device() const { return false; }
  /// True when a host thread waiting on a collective sleeps until the data arrives instead of
  /// polling or spinning, so that a communication thread beside the compute leaves it the core
  /// (workers over Gloo, one replica each). CPU strategies start with gradient buckets on only
  /// then.
  virtual bool waits_without_polling() const { return false; }
  /// Whether the flat reduce_scatter of sums moves only each rank's share (a true
  /// reduce-scatter, in the all-reduce's order), rather than running the whole all-reduce and
  /// keeping the range (Note [flat ranges]).
  virtual bool reduce_scatters_for_real() const { return false; }

  /// Reduces every tensor of `tensors` across ranks, in place, in ONE batched call. The list may
  /// mix shapes and numeric dtypes; every rank passes the same shapes and dtypes in the same order.
  std::shared_ptr<Work> all_reduce(std::vector<Tensor>& tensors, ReduceOp op = ReduceOp::kSum);
  /// Out of place: outputs[i] = the reduction of inputs[i] across ranks; `outputs` must hold
  /// defined tensors of the inputs' shapes and dtypes (e.g. Tensor::empty_like). Inputs are
  /// not modified.
  std::shared_ptr<Work> all_reduce(const std::vector<Tensor>& inputs, std::vector<Tensor>& outputs,
                                   ReduceOp op = ReduceOp::kSum);
  /// outputs is resized to size(); outputs[k] becomes a new tensor holding rank k's `input`.
  /// Inputs may differ in shape (e.g. the first dimension of a split batch); dtype and rank
  /// must agree.
  std::shared_ptr<Work> all_gather(std::vector<Tensor>& outputs, const Tensor& input);
  /// Copies rank `root`'s tensors into the other ranks' tensors (same shapes and dtypes).
  std::shared_ptr<Work> broadcast(std::vector<Tensor>& tensors, int root = 0);
  /// `input` is [size() * k, ...] on every rank; `output` receives rows [rank*k, (rank+1)*k) of
  /// the reduction of the inputs. An undefined `output` is allocated.
  std::shared_ptr<Work> reduce_scatter(Tensor& output, const Tensor& input,
                                       ReduceOp op = ReduceOp::kSum);

  // Note [flat ranges]: a gradient bucket or a packed group of parameters is one flat buffer
  // of N elements, and rank r owns the contiguous range [offsets[r], offsets[r + 1]) of it.
  // `offsets` has size() + 1 entries, offsets[0] = 0, offsets[size()] = N, nondecreasing (a
  // range may be empty), and every rank passes the same offsets. reduce_scatter gives each
  // rank its range of the reduction with the same operations, in the same order, per element
  // as all_reduce on that communicator, so a reduce_scatter followed by an all_gather of the
  // ranges equals one all_reduce bit for bit. In-process replicas and workers that share
  // memory reduce-scatter for real (each element combined once, written only to its owner),
  // and so do two MPI workers for sums and integer maxima (two pieces combine to the same bits
  // in either order); where a transport's all-reduce order cannot be reproduced range by range
  // (Open MPI's algorithms beyond that, Gloo's, NCCL), reduce_scatter runs that all-reduce on
  // the whole buffer and keeps the range: bitwise, without the bandwidth saving.

  /// Flat reduce-scatter (Note [flat ranges]): `input` is the whole 1-D buffer of N elements
  /// on every rank; `output` receives this rank's range [offsets[rank()], offsets[rank() + 1])
  /// of the reduction, bitwise what all_reduce of the same inputs gives there. An undefined
  /// `output` is allocated (1-D, on the input's device).
  std::shared_ptr<Work> reduce_scatter(const Tensor& input, Tensor& output,
                                       std::span<const int64_t> offsets,
                                       ReduceOp op = ReduceOp::kSum);
  /// Flat all-gather, in place (Note [flat ranges]): `buffer` is a 1-D buffer of N elements on
  /// every rank (any dtype); range [offsets[r], offsets[r + 1]) of rank r's buffer is copied
  /// into the same range of every rank's buffer, so that every rank ends with the whole buffer.
  std::shared_ptr<Work> all_gather(Tensor& buffer, std::span<const int64_t> offsets);

  /// Returns once every rank has called barrier().
  std::shared_ptr<Work> barrier();

  /// Calls made through this communicator so far.
  CollectiveStats stats() const;

 protected:
  // Backends override what they support; the defaults raise "backend X does not support Y".
  ///@{

  /// What the public call of the same name runs once it has counted the call (stats()); a
  /// backend overrides the ones it supports (the defaults raise "backend X does not support
  /// Y").
  virtual std::shared_ptr<Work> all_reduce_impl(const std::vector<Tensor>& inputs,
                                                const std::vector<Tensor>& outputs, ReduceOp op);
  virtual std::shared_ptr<Work> all_gather_impl(std::vector<Tensor>& outputs, const Tensor& input);
  virtual std::shared_ptr<Work> broadcast_impl(std::vector<Tensor>& tensors, int root);
  virtual std::shared_ptr<Work> reduce_scatter_impl(Tensor& output, const Tensor& input,
                                                    ReduceOp op);
  virtual std::shared_ptr<Work> reduce_scatter_ranges_impl(const Tensor& input, Tensor& output,
                                                           std::span<const int64_t> offsets,
                                                           ReduceOp op);
  virtual std::shared_ptr<Work> all_gather_ranges_impl(Tensor& buffer,
                                                       std::span<const int64_t> offsets);
  virtual std::shared_ptr<Work> barrier_impl();
  ///@}

  /// Raises "backend <name()> does not support <operation>".
  [[noreturn]] void throw_unsupported(std::string_view operation) const;

 private:
  // Counters are written by the rank's own thread; atomics so another thread may read them.
  std::atomic<uint64_t> all_reduce_calls_{0};
  std::atomic<uint64_t> all_gather_calls_{0};
  std::atomic<uint64_t> broadcast_calls_{0};
  std::atomic<uint64_t> reduce_scatter_calls_{0};
  std::atomic<uint64_t> barrier_calls_{0};
  std::atomic<uint64_t> bytes_all_reduced_{0};
  std::atomic<uint64_t> all_reduce_nanoseconds_{0};
};

}  // namespace tandem::collectives
