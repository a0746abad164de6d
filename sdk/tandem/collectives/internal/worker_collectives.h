// WorkerCollectives: the processes (workers) of a multi-worker job as a strategy reduces across
// them, whatever carries the bytes (MpiWorld under mpirun or srun, GlooWorld for workers started
// from TF_CONFIG).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "tandem/collectives/reduce_op.h"
#include "tandem/tensor/tensor.h"

namespace tandem::collectives {

/// Collectives over the job's workers, on CPU tensors. Every worker makes the same calls in
/// the same order, from one thread at a time; `label` names the call in errors.
class WorkerCollectives {
 public:
  virtual ~WorkerCollectives() = default;

  /// This worker's index in [0, size()); 0 is the chief.
  virtual int rank() const = 0;
  virtual int size() const = 0;
  /// The transport: "mpi", "gloo".
  virtual std::string name() const = 0;
  /// True when a thread waiting on a collective sleeps in the kernel until its data arrives
  /// (Gloo: its TCP transport waits on its sockets); false when it polls (Open MPI).
  virtual bool waits_without_polling() const { return false; }
  /// Whether reduce_scatter of sums moves only each worker's share (Communicator's namesake).
  virtual bool reduce_scatters_for_real() const { return false; }

  /// In place: every worker's tensors reduced element-wise, the same result everywhere (kMean
  /// divides the sum by size()).
  virtual void all_reduce(std::vector<Tensor>& tensors, ReduceOp op, const char* label) = 0;
  /// Worker `root`'s tensors into every worker's tensors (same shapes everywhere).
  virtual void broadcast(std::vector<Tensor>& tensors, int root, const char* label) = 0;
  /// Every worker's bytes, in worker order (pieces may differ in length).
  virtual std::vector<std::vector<char>> all_gather(const std::vector<char>& mine,
                                                    const char* label) = 0;
  /// Every worker's tensors, in worker order (shapes may differ between workers).
  virtual std::vector<std::vector<Tensor>> all_gather_tensors(const std::vector<Tensor>& mine,
                                                              const char* label) = 0;
  /// Flat reduce-scatter in place (Note [flat ranges] in communicator.h): `buffer` is a 1-D
  /// CPU tensor of N elements, and `offsets` (size() + 1 entries from 0 to N, the same on every
  /// worker) gives worker w the range [offsets[w], offsets[w + 1]). On return this worker's
  /// range holds the reduction over the workers, bitwise what all_reduce({buffer}) gives there;
  /// the rest of `buffer` is unspecified.
  virtual void reduce_scatter(Tensor& buffer, std::span<const int64_t> offsets, ReduceOp op,
                              const char* label) = 0;
  /// The same, out of place: `input` (the whole buffer) is left as it is and `output` (1-D, of
  /// this worker's range's length) receives this worker's range of the reduction. By default a
  /// copy of `input` is reduced in place.
  virtual void reduce_scatter(const Tensor& input, Tensor& output, std::span<const int64_t> offsets,
                              ReduceOp op, const char* label) {
    Tensor buffer = input.clone();
    reduce_scatter(buffer, offsets, op, label);
    const auto w = static_cast<size_t>(rank());
    output.copy_from(buffer.view_as({offsets[w + 1] - offsets[w]},
                                    static_cast<size_t>(offsets[w]) * dtype_size(buffer.dtype())));
  }
  /// Flat all-gather in place: worker w's range [offsets[w], offsets[w + 1]) of its 1-D CPU
  /// `buffer` is copied into the same range of every worker's buffer.
  virtual void all_gather(Tensor& buffer, std::span<const int64_t> offsets, const char* label) = 0;
  /// Returns once every worker has called it.
  virtual void barrier(const char* label) = 0;
};

}  // namespace tandem::collectives
