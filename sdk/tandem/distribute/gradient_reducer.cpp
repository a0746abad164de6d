// GradientReducer: the layout of one replica's gradient buckets, packing them during the
// backward pass, and the communication thread that reduces them (internal/gradient_reducer.h).
#include "tandem/distribute/internal/gradient_reducer.h"

#include <algorithm>
#include <map>
#include <utility>

#include "tandem/core/logging.h"
#include "tandem/core/spans.h"
#include "tandem/core/threading.h"
#include "tandem/distribute/replica_context.h"
#include "tandem/ops/ops.h"

namespace tandem::detail {

namespace {

/// True when both lists hold the same tensors (by identity) in the same places.
bool same_tensors(const std::vector<Tensor>& a, const std::vector<Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i].id() != b[i].id()) return false;
  return true;
}

/// Like same_tensors, where `a` is defined: accumulators against those the buckets were packed
/// with (an accumulator whose variable got no gradient this step is left out of `a`).
bool same_where_defined(const std::vector<Tensor>& a, const std::vector<Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i].defined() && (!b[i].defined() || a[i].id() != b[i].id())) return false;
  return true;
}

/// FNV-1a over 64-bit words: the layout's fingerprint, compared across replicas.
struct Fingerprint {
  uint64_t value = 1469598103934665603ULL;
  void add(uint64_t word) {
    for (int i = 0; i < 8; ++i) {
      value ^= (word >> (8 * i)) & 0xff;
      value *= 1099511628211ULL;
    }
  }
};

}  // namespace

GradientReducer::GradientReducer(collectives::Communicator& communicator, int local_replica,
                                 int replica)
    : communicator_(communicator), local_replica_(local_replica), replica_(replica) {}

GradientReducer::~GradientReducer() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  work_cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void GradientReducer::configure(int64_t first_bucket_bytes, int64_t bucket_bytes,
                                DType float32_wire) {
  if (first_bucket_bytes == first_bucket_bytes_ && bucket_bytes == bucket_bytes_ &&
      float32_wire == float32_wire_)
    return;
  first_bucket_bytes_ = first_bucket_bytes;
  bucket_bytes_ = bucket_bytes;
  float32_wire_ = float32_wire;
  layout_.reset();
  layout_refused_ = false;
}

// ---- the backward pass
// ---------------------------------------------------------------------------

bool GradientReducer::begin(const std::vector<Tensor>& sources) {
  // Off: no buckets asked for, nobody to reduce with, or a tape used in cross-replica context
  // (a merge_call function runs on replica 0's thread alone).
  if (bucket_bytes_ <= 0 || communicator_.size() == 1 || current_replica_context() == nullptr)
    return false;
  // What the optimizer said of this micro-step holds for this backward pass only.
  const Next next = std::exchange(next_, Next::kAny);
  std::vector<Tensor> accumulators = std::exchange(next_accumulators_, {});
  if (in_flight_) {
    // Another backward pass before the last one's buckets were used: those are dropped.
    if (std::exception_ptr error = wait_all()) {
      reset_step();
      std::rethrow_exception(error);
    }
    reset_step();
  }
  if (layout_ && same_tensors(sources, layout_->sources)) {
    if (standing_by_) return false;
    // Gradient accumulation: nothing goes out before the last micro-step, which packs each
    // accumulator + gradient (the sum its apply_gradients makes, computed by the same op).
    if (next == Next::kNothing) return false;
    if (next == Next::kAccumulated && accumulators.size() != sources.size()) return false;
    packed_accumulators_ = std::move(accumulators);
    packing_ = true;
    next_launch_ = 0;
    return true;
  }
  if (layout_ || layout_refused_) return false;
  // No layout yet: remember the order this pass makes its gradients final in.
  last_sources_ = sources;
  last_order_.clear();
  last_gradients_.clear();
  return true;
}

void GradientReducer::ready(size_t index, const Tensor& gradient) {
  if (!packing_) {
    last_order_.push_back(index);
    return;
  }
  const Slot& slot = layout_->slots[index];
  if (slot.bucket < 0) {
    if (gradient.defined())
      fail(str_cat("source ", index, " (shape ", slot.shape,
                   ") has a gradient now but had none in the step that laid the buckets out"));
    return;
  }
  if (!gradient.defined())
    fail(str_cat("source ", index, " (shape ", slot.shape,
                 ") has no gradient now but had one in the step that laid the buckets out"));
  TANDEM_CHECK(gradient.shape() == slot.shape && gradient.dtype() == slot.dtype,
               "gradient buckets (replica ", replica_, "): the gradient of source ", index, " is ",
               gradient.dtype(), " ", gradient.shape(), " but its bucket slot is ", slot.dtype, " ",
               slot.shape);
  Bucket& bucket = layout_->buckets[static_cast<size_t>(slot.bucket)];
  Tensor packed = bucket.buffer.view_as(slot.shape, slot.offset_bytes);
  const bool compressed = bucket.dtype != slot.dtype;
  const autograd::NoRecordGuard no_record;
  if (packed_accumulators_.empty()) {
    packed.copy_from(compressed ? ops::cast(gradient, bucket.dtype) : gradient);
  } else {
    const Tensor& accumulator = packed_accumulators_[index];
    TANDEM_CHECK(accumulator.defined() && accumulator.shape() == slot.shape &&
                     accumulator.dtype() == slot.dtype,
                 "gradient buckets (replica ", replica_, "): the accumulator of source ", index,
                 " does not match its bucket slot (", slot.dtype, " ", slot.shape, ")");
    if (compressed) {
      // The sum in float32 (as apply_gradients would make it), rounded once into the bucket.
      packed.copy_from(ops::cast(ops::add(accumulator, gradient), bucket.dtype));
    } else {
      packed.copy_from(accumulator);
      ops::add_(packed, gradient);
    }
  }
  ++bucket.filled;
  // Buckets start in order, so that every replica makes the same collective calls.
  while (next_launch_ < layout_->buckets.size() &&
         layout_->buckets[next_launch_].filled == layout_->buckets[next_launch_].members)
    launch(next_launch_++);
}

void GradientReducer::end(const std::vector<Tensor>& gradients) {
  if (packing_) {
    packing_ = false;
    in_flight_ = true;
    packed_ = gradients;
    return;
  }
  last_gradients_ = gradients;
}

void GradientReducer::fail(const std::string& message) {
  packing_ = false;
  TANDEM_THROW("gradient buckets (replica ", replica_, "): ", message,
               ". With gradient buckets the variables that get a gradient must be the same at "
               "every step; for a model whose used variables change, turn buckets off "
               "(strategy.set_communication_options({.bytes_per_pack = 0}))");
}

// ---- the layout
// ----------------------------------------------------------------------------------

void GradientReducer::learn(const std::vector<Tensor>& gradients) {
  const bool from_tape = !layout_ && !layout_refused_ && bucket_bytes_ > 0 &&
                         !last_gradients_.empty() && same_tensors(gradients, last_gradients_) &&
                         last_order_.size() == last_sources_.size();
  if (!from_tape) return;
  Layout layout;
  layout.sources = last_sources_;
  layout.slots.resize(last_sources_.size());
  std::map<DType, size_t> open;  // per dtype, the bucket still being filled
  std::vector<int64_t> bytes;    // per bucket
  std::vector<Device> devices;   // per bucket
  for (size_t index : last_order_) {
    const Tensor& g = gradients[index];
    Slot& slot = layout.slots[index];
    if (!g.defined()) {
      if (last_sources_[index].defined()) slot.shape = last_sources_[index].shape();
      continue;
    }
    slot.shape = g.shape();
    slot.dtype = g.dtype();
    const DType wire = wire_dtype(g.dtype());
    auto it = open.find(wire);
    if (it == open.end()) {
      it = open.emplace(wire, layout.buckets.size()).first;
      layout.buckets.push_back({});
      layout.buckets.back().dtype = wire;
      bytes.push_back(0);
      devices.push_back(g.device());
    }
    Bucket& bucket = layout.buckets[it->second];
    slot.bucket = static_cast<int>(it->second);
    slot.offset_bytes = static_cast<size_t>(bucket.numel) * dtype_size(wire);
    bucket.numel += g.numel();
    ++bucket.members;
    // A bucket closes once it holds its size (as DDP's): a gradient larger than a bucket
    // fills one alone or with what came before it, and small ones never trail alone.
    bytes[it->second] += g.numel() * static_cast<int64_t>(dtype_size(wire));
    if (bytes[it->second] >= (it->second == 0 ? first_bucket_bytes_ : bucket_bytes_))
      open.erase(it);
  }
  if (layout.buckets.empty()) return;
  // Every replica must have made the same layout (same order of readiness, shapes, dtypes):
  // the largest and smallest fingerprint over the replicas are this one's, or buckets stay off
  // everywhere (every replica sees the same two figures and decides alike).
  Fingerprint f;
  for (const Slot& s : layout.slots) {
    f.add(static_cast<uint64_t>(s.bucket + 1));
    f.add(s.offset_bytes);
    f.add(static_cast<uint64_t>(s.dtype));
  }
  for (const Bucket& b : layout.buckets) {
    f.add(static_cast<uint64_t>(b.numel));
    f.add(static_cast<uint64_t>(b.dtype));
  }
  const int64_t mine = static_cast<int64_t>(f.value >> 2);
  // On the gradients' device: NCCL reduces device memory only.
  std::vector<Tensor> extremes{
      Tensor::from_vector(std::vector<int64_t>{mine, -mine}).to(devices.front())};
  communicator_.all_reduce(extremes, ReduceOp::kMax)->wait();
  const std::vector<int64_t> seen = extremes[0].to_vector<int64_t>();
  if (seen[0] != mine || -seen[1] != mine) {
    TANDEM_LOG_WARNING("gradient buckets (replica ", replica_,
                       "): the replicas' backward passes produce their gradients in different "
                       "orders, so gradients are reduced after the backward pass instead");
    layout_refused_ = true;
    return;
  }
  for (size_t b = 0; b < layout.buckets.size(); ++b)
    layout.buckets[b].buffer =
        Tensor::empty(Shape({layout.buckets[b].numel}), layout.buckets[b].dtype, devices[b]);
  layout_ = std::move(layout);
  last_sources_.clear();
  last_order_.clear();
  last_gradients_.clear();
}

// ---- buckets in flight
// ---------------------------------------------------------------------------

void GradientReducer::launch(size_t index) {
  Bucket& bucket = layout_->buckets[index];
  bucket.launched = true;
  if (communicator_.queues_on_device() || !bucket.buffer.device().is_cpu()) {
    // NCCL: queued on the communication stream after the copies above; returns at once. GPU
    // replicas sharing a GPU (in-process over the device) reduce on the replica's own thread,
    // whose stream the copies were queued on.
    std::vector<Tensor> tensors{bucket.buffer};
    communicator_.all_reduce(tensors, ReduceOp::kSum)->wait();
    std::lock_guard<std::mutex> lock(mutex_);
    bucket.done = true;
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    queue_.push_back(index);
    if (!thread_.joinable()) thread_ = std::thread([this] { communication_thread(); });
  }
  work_cv_.notify_one();
}

void GradientReducer::communication_thread() {
  // Its collectives appear on the replica's communicator track; sums flush subnormals as the
  // replica threads do, so the results are those of the unbucketed all-reduce.
  profile::set_current_track({profile::TrackKind::kReplica, local_replica_});
  profile::set_current_thread_overlaps(true);
  set_compute_threads(1);
  const ScopedFloatMode float_mode;
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    work_cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
    if (stop_) return;
    const size_t index = queue_.front();
    queue_.erase(queue_.begin());
    // The layout does not change while a bucket is in flight (every change waits first).
    Bucket& bucket = layout_->buckets[index];
    lock.unlock();
    std::exception_ptr error;
    try {
      std::vector<Tensor> tensors{bucket.buffer};
      communicator_.all_reduce(tensors, ReduceOp::kSum)->wait();
    } catch (...) {
      error = std::current_exception();
    }
    lock.lock();
    bucket.done = true;
    bucket.error = error;
    done_cv_.notify_all();
  }
}

std::exception_ptr GradientReducer::wait_all() {
  if (!layout_ || !layout_->buckets.front().launched) return nullptr;
  // The time the replica is blocked on buckets: the communication the backward pass did not
  // hide (on the replica's own track; the collectives themselves are on its communicator's).
  const profile::Span exposed(profile::Phase::kCommWait);
  std::unique_lock<std::mutex> lock(mutex_);
  std::exception_ptr first;
  for (Bucket& b : layout_->buckets) {
    if (!b.launched) continue;
    done_cv_.wait(lock, [&] { return b.done; });
    if (b.error && !first) first = b.error;
  }
  return first;
}

void GradientReducer::reset_step() {
  in_flight_ = false;
  packing_ = false;
  next_launch_ = 0;
  packed_.clear();
  packed_accumulators_.clear();
  if (!layout_) return;
  std::lock_guard<std::mutex> lock(mutex_);
  for (Bucket& b : layout_->buckets) {
    b.filled = 0;
    b.launched = false;
    b.done = false;
    b.error = nullptr;
  }
}

void GradientReducer::expect_micro_step(bool last, const std::vector<Tensor>& accumulators) {
  next_ = last ? Next::kAccumulated : Next::kNothing;
  next_accumulators_ = last ? accumulators : std::vector<Tensor>{};
}

bool GradientReducer::take(const std::vector<Tensor>& gradients,
                           const std::vector<Tensor>* accumulated, std::vector<Tensor>& reduced) {
  if (!in_flight_) return false;
  std::exception_ptr error = wait_all();
  if (error) {
    reset_step();
    std::rethrow_exception(error);
  }
  const bool from_tape = same_tensors(gradients, packed_);
  if (from_tape &&
      ((accumulated != nullptr) != !packed_accumulators_.empty() ||
       (accumulated != nullptr && !same_where_defined(*accumulated, packed_accumulators_)))) {
    // The buckets were packed for another micro-step of gradient accumulation (the first
    // backward pass after the optimizer was made or restored, before it said which micro-step
    // comes): every replica drops them alike and reduces after the backward pass.
    reset_step();
    return false;
  }
  if (!from_tape) {
    // The gradients were changed between the tape and apply_gradients: the buckets hold the
    // tape's, so they cannot serve; every replica (running the same program) turns them off.
    TANDEM_LOG_WARNING("gradient buckets (replica ", replica_,
                       "): apply_gradients was given other tensors than the gradients the tape "
                       "returned, so buckets are turned off and gradients are reduced after the "
                       "backward pass");
    reset_step();
    layout_.reset();
    layout_refused_ = true;
    return false;
  }
  reduced.assign(gradients.size(), Tensor());
  const autograd::NoRecordGuard no_record;
  for (size_t i = 0; i < gradients.size(); ++i) {
    const Slot& slot = layout_->slots[i];
    if (slot.bucket < 0) continue;
    const Bucket& bucket = layout_->buckets[static_cast<size_t>(slot.bucket)];
    reduced[i] = bucket.buffer.view_as(slot.shape, slot.offset_bytes);
    // Compressed: widened back to the gradient's float32 (exact).
    if (bucket.dtype != slot.dtype) reduced[i] = ops::cast(reduced[i], slot.dtype);
  }
  ++bucketed_steps_;
  reset_step();
  return true;
}

void GradientReducer::wait_in_flight() {
  if (!in_flight_ && next_launch_ == 0) return;
  if (std::exception_ptr error = wait_all()) {
    reset_step();
    std::rethrow_exception(error);
  }
}

void GradientReducer::finish_run(bool raise) {
  std::exception_ptr error = wait_all();
  reset_step();
  last_sources_.clear();
  last_order_.clear();
  last_gradients_.clear();
  // After a failed run every replica forgets its layout, so all of them make the next one
  // together.
  if (!raise) layout_.reset();
  if (raise && error) std::rethrow_exception(error);
}

void GradientReducer::stand_by() {
  standing_by_ = true;
  if (!in_flight_) return;
  const std::exception_ptr error = wait_all();
  reset_step();
  if (error) std::rethrow_exception(error);
}

void GradientReducer::forget_layout() {
  reset_step();
  last_sources_.clear();
  last_order_.clear();
  last_gradients_.clear();
  std::lock_guard<std::mutex> lock(mutex_);
  layout_.reset();
}

}  // namespace tandem::detail
