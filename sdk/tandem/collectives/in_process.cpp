// The InProcess backend's group and endpoints: each collective checks this rank's arguments,
// then runs through the rendezvous (in_process_rendezvous.cpp) with its data phase (the
// reduction kernels are in in_process_kernels.cpp).
#include "tandem/collectives/in_process.h"

#include <algorithm>
#include <optional>

#include "tandem/collectives/internal/flat_ranges.h"
#include "tandem/collectives/internal/in_process_state.h"

namespace tandem::collectives {

namespace {

using in_process::abort_locked;
using in_process::AbortCause;
using in_process::all_gather_ranges_phase;
using in_process::Call;
using in_process::copy_on;
using in_process::describe_tensor;
using in_process::Kind;
using in_process::reduce_scatter_ranges_phase;
using in_process::reduce_slice_on;
using in_process::run_call;
using in_process::State;

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

// ---- InProcessRendezvous
// ----------------------------------------------------------------------------

InProcessRendezvous::InProcessRendezvous(int size)
    : size_(size), state_(std::make_unique<State>(size)) {}
InProcessRendezvous::~InProcessRendezvous() = default;

std::shared_ptr<InProcessRendezvous> InProcessRendezvous::create(int size) {
  TANDEM_CHECK(size >= 1, "InProcessRendezvous::create: a group needs at least one rank, got ",
               size);
  std::shared_ptr<InProcessRendezvous> group(new InProcessRendezvous(size));
  for (int r = 0; r < size; ++r)
    group->communicators_.push_back(
        std::unique_ptr<InProcessCommunicator>(new InProcessCommunicator(group.get(), r)));
  return group;
}

InProcessCommunicator& InProcessRendezvous::communicator(int rank) {
  TANDEM_CHECK(rank >= 0 && rank < size_, "InProcessRendezvous::communicator: rank ", rank,
               " is outside [0, ", size_, ")");
  return *communicators_[rank];
}

void InProcessRendezvous::abort(const std::string& reason) {
  std::lock_guard<std::mutex> lock(state_->mutex);
  uint64_t open_call = 0;
  for (uint64_t e : state_->entered) open_call = std::max(open_call, e);
  abort_locked(*state_, AbortCause::kExternal, open_call, reason);
}

void InProcessRendezvous::depart(int rank) {
  std::lock_guard<std::mutex> lock(state_->mutex);
  state_->departed[rank] = 1;
  state_->cv.notify_all();  // waiters re-check whether this rank can still arrive
}

void InProcessRendezvous::reset() {
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

uint64_t InProcessRendezvous::calls_entered(int rank) const {
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

std::shared_ptr<Work> InProcessCommunicator::reduce_scatter_ranges_impl(
    const Tensor& input, Tensor& output, std::span<const int64_t> offsets, ReduceOp op) {
  local_error_ = flat_ranges_problem(input, offsets, size(), "the input", /*reduce=*/true);
  if (local_error_.empty()) {
    const auto r = static_cast<size_t>(rank_);
    if (!output.defined())
      output = Tensor::empty({offsets[r + 1] - offsets[r]}, input.dtype(), input.device());
    local_error_ = flat_output_problem(input, output, offsets, rank_);
  }
  if (size() == 1) {
    TANDEM_CHECK(local_error_.empty(), "reduce_scatter: ", local_error_);
    output.copy_from(input);
    return completed_work();
  }
  Call call;
  call.kind = Kind::kReduceScatterRanges;
  call.label = "reduce_scatter";
  call.op = op;
  call.input = &input;
  call.output = &output;
  call.offsets = offsets;
  call.local_error = &local_error_;
  call.device = input.defined() ? input.device() : Device::cpu();
  State& s = *group_->state_;
  run_call(s, rank_, call, [&] { reduce_scatter_ranges_phase(s, rank_, op); });
  return completed_work();
}

std::shared_ptr<Work> InProcessCommunicator::all_gather_ranges_impl(
    Tensor& buffer, std::span<const int64_t> offsets) {
  local_error_ = flat_ranges_problem(buffer, offsets, size(), "the buffer", /*reduce=*/false);
  if (size() == 1) {
    TANDEM_CHECK(local_error_.empty(), "all_gather: ", local_error_);
    return completed_work();
  }
  Call call;
  call.kind = Kind::kAllGatherRanges;
  call.label = "all_gather";
  call.input = &buffer;
  call.offsets = offsets;
  call.local_error = &local_error_;
  call.device = buffer.defined() ? buffer.device() : Device::cpu();
  State& s = *group_->state_;
  run_call(s, rank_, call, [&] { all_gather_ranges_phase(s, rank_); });
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
