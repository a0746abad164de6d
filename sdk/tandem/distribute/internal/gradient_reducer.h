// GradientReducer: one replica's gradient buckets. While GradientTape::gradient walks backwards
// it hands each trainable variable's final gradient to the reducer (autograd::GradientListener),
// which copies it into its bucket; a full bucket's all-reduce starts at once and runs while the
// backward pass goes on. optimizer.apply_gradients(ctx, ...) then waits for the buckets and
// takes the reduced values (ReplicaContext::sum_across_replicas). With gradient accumulation
// the optimizer says after each micro-step whether the next is the last before an update
// (expect_micro_step): only that backward pass packs, accumulator + gradient, and its
// apply_gradients takes the sums (ReplicaContext::sum_accumulated).
//
// The layout (which gradient goes into which bucket, at which offset) is made from the first
// step that sums the tape's own gradients: buckets are filled in the order that step's backward
// produced its gradients, one dtype per bucket, each closed once it holds its size (the first
// bucket's small). Every replica checks
// with one collective that the others made the same layout; from the next step on, buckets are
// reduced during the backward pass, in bucket order (every replica launches bucket k before
// k + 1). Each element is still the sum of the same replicas' values in the same order, so the
// result is bitwise the one of the unbucketed all-reduce. With gradient compression a float32
// gradient is rounded into a 16-bit bucket as it is packed and widened back when taken.
//
// Where the all-reduce runs: a backend that moves host data on the calling thread (in-process,
// MPI) gets a communication thread per replica that runs the buckets' collectives in order; a
// backend that queues on the device (NCCL) is called on the replica's thread and returns at
// once, and so are GPU replicas sharing a GPU (their collectives use the replica's stream).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "tandem/autograd/tape.h"
#include "tandem/collectives/communicator.h"
#include "tandem/tensor/tensor.h"

namespace tandem::detail {

/// Driven by its ReplicaContext alone (the tape's listener, the optimizer's sums, the strategy's
/// settings and the end of each task all go through the context).
class GradientReducer final {
 public:
  /// `communicator`: this replica's endpoint over every replica in sync; `local_replica` names
  /// its timeline track (the communication thread's collectives appear on its communicator
  /// track); `replica` names it in errors.
  GradientReducer(collectives::Communicator& communicator, int local_replica, int replica);
  ~GradientReducer();
  GradientReducer(const GradientReducer&) = delete;
  GradientReducer& operator=(const GradientReducer&) = delete;

  /// Bucket sizes in bytes (0: no buckets) and the type float32 gradients travel in (float32:
  /// uncompressed). A change drops the layout; the next step makes a new one. Call between
  /// runs.
  void configure(int64_t first_bucket_bytes, int64_t bucket_bytes, DType float32_wire);
  /// The type a gradient of `dtype` travels in.
  DType wire_dtype(DType dtype) const { return dtype == DType::kFloat32 ? float32_wire_ : dtype; }

  // The backward pass (ReplicaContext as the thread's autograd::GradientListener), on the
  // replica's thread.
  bool begin(const std::vector<Tensor>& sources);
  void ready(size_t index, const Tensor& gradient);
  void end(const std::vector<Tensor>& gradients);

  /// The SUM over the replicas of `gradients` (GradientSync::sum_across_replicas), or with
  /// gradient accumulation of accumulator + gradient, `*accumulated` being the accumulators
  /// before this micro-step (GradientSync::sum_accumulated): the buckets' results when they
  /// hold what the last backward pass packed (the addition made there), else `batched`'s one
  /// batched all-reduce of `gradients` or of the accumulators (which adds the gradients first).
  template <typename Batched>
  std::vector<Tensor> sum(const std::vector<Tensor>& gradients,
                          const std::vector<Tensor>* accumulated, Batched&& batched) {
    standing_by_ = false;
    std::vector<Tensor> reduced;
    if (take(gradients, accumulated, reduced)) return reduced;
    reduced = batched(accumulated != nullptr ? *accumulated : gradients);
    learn(gradients);
    return reduced;
  }
  /// Gradient accumulation (GradientSync::expect_micro_step): the next backward pass packs
  /// nothing (`last` false) or accumulator + gradient (`last`; one accumulator per source).
  void expect_micro_step(bool last, const std::vector<Tensor>& accumulators);

  /// The gradients are summed otherwise (optimizer-state sharding reduce-scatters them after
  /// the backward pass): buckets in flight are waited for and dropped, and backward passes pack
  /// nothing until the next sum() (the layout is kept for it; without one, they still note
  /// the order their gradients come in, so that the next sum() can lay the buckets out).
  void stand_by();
  /// Waits until no bucket is in flight (their results are kept for sum()). Every other
  /// collective of the replica calls it first, so collectives keep one order on every replica.
  void wait_in_flight();
  /// The end of this replica's task in a run: buckets still in flight are waited for and
  /// dropped. `raise`: raise what they raised (the task succeeded); otherwise the group was
  /// aborted and they are only waited for.
  void finish_run(bool raise);
  /// Forgets the layout between runs, so that the next step lays the buckets out again: after
  /// a run in which any replica failed, every replica calls it (the ones whose own step
  /// completed too), and all of them lay out together.
  void forget_layout();

  /// Buckets of the layout in use (0 while there is none): for tests and the timeline.
  size_t num_buckets() const { return layout_ ? layout_->buckets.size() : 0; }
  /// Steps whose gradients came from the buckets so far.
  uint64_t bucketed_steps() const { return bucketed_steps_; }

 private:
  struct Slot {
    int bucket = -1;  // -1: the source had no gradient when the layout was made
    size_t offset_bytes = 0;
    Shape shape;
    DType dtype = DType::kFloat32;  // the gradient's (its bucket's may be the 16-bit wire type)
  };
  struct Bucket {
    DType dtype = DType::kFloat32;  // what travels
    int64_t numel = 0;
    size_t members = 0;  // sources packed into it
    Tensor buffer;       // flat, on the replica's device
    // Per step:
    size_t filled = 0;
    bool launched = false;
    bool done = false;
    std::exception_ptr error;
  };
  struct Layout {
    std::vector<Tensor> sources;  // the variables' tensors, in the tape's order
    std::vector<Slot> slots;      // per source
    std::vector<Bucket> buckets;
  };

  /// True (and `reduced` filled) when the buckets in flight hold `gradients` (with
  /// `accumulated`: those accumulators plus `gradients`).
  bool take(const std::vector<Tensor>& gradients, const std::vector<Tensor>* accumulated,
            std::vector<Tensor>& reduced);
  /// After a batched sum of the last backward pass's gradients: makes the layout.
  void learn(const std::vector<Tensor>& gradients);
  /// Starts bucket `index`'s all-reduce.
  void launch(size_t index);
  /// Waits for every launched bucket; returns the first error.
  std::exception_ptr wait_all();
  /// Forgets the in-flight step (buckets reset for the next one).
  void reset_step();
  [[noreturn]] void fail(const std::string& message);
  void communication_thread();

  collectives::Communicator& communicator_;
  const int local_replica_;
  const int replica_;
  int64_t first_bucket_bytes_ = 0;
  int64_t bucket_bytes_ = 0;
  DType float32_wire_ = DType::kFloat32;

  std::optional<Layout> layout_;
  bool layout_refused_ = false;  // the replicas made different layouts: buckets stay off
  bool standing_by_ = false;     // stand_by() until the next sum()
  // The last backward pass (learning): its sources, the order its gradients became final, and
  // what it returned.
  std::vector<Tensor> last_sources_;
  std::vector<size_t> last_order_;
  std::vector<Tensor> last_gradients_;
  // This step: packing during a backward pass, then buckets in flight until sum() or the run's
  // end.
  bool packing_ = false;
  bool in_flight_ = false;
  size_t next_launch_ = 0;
  std::vector<Tensor> packed_;  // the gradients the backward pass returned
  // Gradient accumulation: what the next backward pass packs (anything when not told), and the
  // accumulators added to the gradients this backward pass packs (empty: none).
  enum class Next { kAny, kNothing, kAccumulated };
  Next next_ = Next::kAny;
  std::vector<Tensor> next_accumulators_;
  std::vector<Tensor> packed_accumulators_;
  uint64_t bucketed_steps_ = 0;

  // The communication thread (backends that move data on the calling thread).
  std::mutex mutex_;
  std::condition_variable work_cv_;
  std::condition_variable done_cv_;
  std::vector<size_t> queue_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace tandem::detail
