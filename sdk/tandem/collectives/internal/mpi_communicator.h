// Collectives across processes with Open MPI: MpiWorld (the job's processes; CPU buffers, one
// MPI call per dtype bucket, non-blocking calls polled against TANDEM_COLLECTIVE_TIMEOUT with an
// arrival check that names missing workers). Built only with MPI.
#pragma once

#include <functional>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "tandem/collectives/communicator.h"
#include "tandem/collectives/in_process.h"
#include "tandem/collectives/internal/worker_collectives.h"
#include "tandem/tensor/tensor.h"

namespace tandem::collectives {

/// The processes of the job. Before each collective every process sends a small arrival
/// message to every other and polls for theirs until TANDEM_COLLECTIVE_TIMEOUT (naming the
/// workers that did not arrive); then the blocking MPI call runs. MPI is initialised on first use
/// (MPI_THREAD_SERIALIZED: one thread at a time calls MPI, which the strategies guarantee) and
/// finalised at exit; errors are returned, not fatal, and raised as tandem::Error naming the call.
class MpiWorld final : public WorkerCollectives {
 public:
  /// The process-wide instance (initialises MPI the first time).
  static std::shared_ptr<MpiWorld> instance();
  ~MpiWorld() override;
  MpiWorld(const MpiWorld&) = delete;
  MpiWorld& operator=(const MpiWorld&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  /// In place, across processes, CPU tensors: one MPI_Allreduce per dtype (tensors of a dtype
  /// are packed into one buffer unless there is only one), waited for with a timeout. kMean
  /// divides the sum by size().
  void all_reduce(std::vector<Tensor>& tensors, ReduceOp op, const char* label) override;
  /// Two workers (reduce_scatter_two_workers).
  bool reduce_scatters_for_real() const override { return size_ <= 2; }
  /// Two workers, for a buffer larger than an arrival message and an op whose two pieces
  /// combine to the same bits in either order (sums of every numeric dtype, maxima of
  /// integers), reduce-scatter for real (reduce_scatter_two_workers): each sends the other its
  /// range, half the bytes of an all-reduce; the rest of `buffer` keeps this worker's input.
  /// Otherwise Open MPI chooses its all-reduce algorithm, and so the order in which each
  /// element's pieces are combined, from the message size and the process count, which no
  /// reduce-scatter can promise to follow: all_reduce of the whole buffer (the same call, the
  /// same bits), of which this worker keeps its range (the whole buffer holds the result).
  void reduce_scatter(Tensor& buffer, std::span<const int64_t> offsets, ReduceOp op,
                      const char* label) override;
  /// Out of place: the two-worker reduce-scatter above reads `input` and writes `output`;
  /// otherwise the default (a copy reduced in place).
  void reduce_scatter(const Tensor& input, Tensor& output, std::span<const int64_t> offsets,
                      ReduceOp op, const char* label) override;
  /// One MPI_Allgatherv in place, the ranges as byte counts and displacements.
  void all_gather(Tensor& buffer, std::span<const int64_t> offsets, const char* label) override;
  /// Process `root`'s tensors into every process's tensors (same shapes everywhere).
  void broadcast(std::vector<Tensor>& tensors, int root, const char* label) override;
  /// Every process's bytes, in rank order (pieces may differ in length).
  std::vector<std::vector<char>> all_gather(const std::vector<char>& mine,
                                            const char* label) override;
  /// Every process's CPU tensors, in rank order (shapes may differ between processes).
  std::vector<std::vector<Tensor>> all_gather_tensors(const std::vector<Tensor>& mine,
                                                      const char* label) override;
  void barrier(const char* label) override;
  std::string name() const override { return "mpi"; }

  /// True after a collective failed or timed out: MPI is then not finalised at exit (a pending
  /// call would hang there); the process should exit non-zero.
  bool broken() const { return broken_; }
  /// Frees the communicators and calls MPI_Finalize (once; skipped when broken()). Runs at exit.
  void finalize();

  struct Impl;  // MPI handles (mpi_communicator.cpp)

 private:
  MpiWorld();
  /// Posts this call's arrival messages to every peer and returns its number. They carry the
  /// call's signature (`label` and `parameters`: sizes, dtype, op, root, hashed) and
  /// `payload`, up to 4080 bytes of data (a small all-reduce's).
  uint64_t arrive(const char* label, std::initializer_list<int64_t> parameters,
                  const void* payload = nullptr, size_t bytes = 0);
  /// all_reduce, whose call signature also holds `layout` (0, or the digest of a flat
  /// reduce_scatter's offsets).
  void all_reduce(std::vector<Tensor>& tensors, ReduceOp op, const char* label, int64_t layout);
  /// After the arrivals of a small all-reduce whose data they carried: `buffer` becomes every
  /// worker's piece combined (kSum or kMax) in worker order.
  void combine_in_worker_order(void* buffer, size_t bytes, DType dtype, ReduceOp op);
  /// reduce_scatter of two workers: after the arrivals (the same signature as all_reduce's),
  /// one MPI_Sendrecv gives the peer this worker's copy of the peer's range and brings the
  /// peer's copy of this worker's range, which is then combined as worker 0's piece op worker
  /// 1's piece (kMean dividing by 2 after the sum).
  /// `input` is the whole buffer; `output` this worker's range of it (in place: a view of
  /// `input`'s range).
  void reduce_scatter_two_workers(const Tensor& input, Tensor& output,
                                  std::span<const int64_t> offsets, ReduceOp op, const char* label);
  /// Whether reduce_scatter_two_workers serves this call (every worker decides alike).
  bool two_worker_reduce_scatter(const Tensor& buffer, ReduceOp op) const;
  /// Waits for `request` and for the arrivals of call `call`; raises naming the missing workers
  /// after the timeout, the workers whose call differs from this one, or the MPI error.
  void wait(void* request, uint64_t call, const char* label);
  /// Runs a blocking MPI call (watching the peers' processes meanwhile, see Impl::Watch) and
  /// raises naming the call when it returns an error code.
  void run_blocking(const std::function<int()>& mpi_call, uint64_t call, const char* label);

  std::unique_ptr<Impl> impl_;
  int rank_ = 0;
  int size_ = 1;
  bool broken_ = false;
};

}  // namespace tandem::collectives
