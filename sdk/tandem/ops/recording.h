// The recording interface between ops and gradient tapes: ops record each node they run on the
// recorders active on the calling thread; autograd's GradientTape is such a recorder and
// registers itself. Ops never see the tape, only this interface.
#pragma once

#include <functional>
#include <initializer_list>
#include <string_view>
#include <vector>

#include "tandem/tensor/tensor.h"

namespace tandem::ops {

/// Computes the gradients of an op's inputs from the gradients of its outputs. An entry of
/// grad_outputs is undefined when nothing downstream depends on that output; the function
/// returns one tensor per input, undefined for inputs that get no gradient.
using BackwardFn = std::function<std::vector<Tensor>(const std::vector<Tensor>& grad_outputs)>;

/// Something that records ops run on its thread (a gradient tape). Registered recorders form a
/// per-thread list; a recorder never sees another thread's ops.
class Recorder {
 public:
  virtual ~Recorder() = default;
  /// True when gradients may flow to `tensor` (watched, or produced by a recorded op).
  virtual bool tracks(const Tensor& tensor) const = 0;
  /// Stores an op that reads at least one tracked input; its outputs become tracked.
  virtual void add_node(std::string_view op, const std::vector<Tensor>& inputs,
                        const std::vector<Tensor>& outputs, const BackwardFn& backward) = 0;
  /// A trainable variable's value was read (see watch_on_active_recorders).
  virtual void on_variable_read(const Tensor& value) = 0;
};

/// Makes `recorder` active on the calling thread until unregister_recorder.
void register_recorder(Recorder* recorder);
/// Ends `recorder`'s registration on the calling thread.
void unregister_recorder(Recorder* recorder);

/// True when a recorder on this thread is recording and tracks one of `inputs` (cheap when not).
bool needs_recording(std::initializer_list<const Tensor*> inputs);
/// The same for a vector of inputs.
bool needs_recording(const std::vector<Tensor>& inputs);
/// Records an op on every recorder of this thread that tracks one of its inputs.
void record(std::string_view op, std::vector<Tensor> inputs, std::vector<Tensor> outputs,
            BackwardFn backward);
/// Tells every active recorder that `value`, a trainable variable's value, was read (tapes that
/// watch accessed variables watch it).
void watch_on_active_recorders(const Tensor& value);

/// While alive, nothing is recorded on this thread (used while computing gradients).
class NoRecordGuard {
 public:
  NoRecordGuard();
  ~NoRecordGuard();
  NoRecordGuard(const NoRecordGuard&) = delete;
  NoRecordGuard& operator=(const NoRecordGuard&) = delete;

 private:
  bool previous_;
};

}  // namespace tandem::ops
