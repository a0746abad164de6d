// GradientTape: records the ops run on the calling thread while it lives, then computes
// gradients by walking the record backwards (reverse-mode automatic differentiation).
// Each replica thread has its own tapes; a tape never sees another thread's ops.
#pragma once

#include <functional>
#include <initializer_list>
#include <memory>
#include <string_view>
#include <vector>

#include "tandem/autograd/variable.h"
#include "tandem/tensor/tensor.h"

namespace tandem {

namespace autograd {

/// Computes the gradients of an op's inputs from the gradients of its outputs. An entry of
/// grad_outputs is undefined when nothing downstream depends on that output; the function
/// returns one tensor per input, undefined for inputs that get no gradient.
using BackwardFn = std::function<std::vector<Tensor>(const std::vector<Tensor>& grad_outputs)>;

/// True when a tape on this thread is recording and tracks one of `inputs` (cheap when not).
bool needs_recording(std::initializer_list<const Tensor*> inputs);
bool needs_recording(const std::vector<Tensor>& inputs);
/// Records an op on every tape of this thread that tracks one of its inputs.
void record(std::string_view op, std::vector<Tensor> inputs, std::vector<Tensor> outputs,
            BackwardFn backward);
/// Lets every active tape that watches accessed variables watch `value`.
void watch_on_active_tapes(const Tensor& value);

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

}  // namespace autograd

class GradientTape {
 public:
  struct Options {
    /// A persistent tape allows several gradient() calls; otherwise the record is freed after
    /// the first.
    bool persistent = false;
    /// Trainable variables read while the tape is active are watched automatically.
    bool watch_accessed_variables = true;
  };

  GradientTape();
  explicit GradientTape(Options options);
  ~GradientTape();
  GradientTape(const GradientTape&) = delete;
  GradientTape& operator=(const GradientTape&) = delete;

  /// Tracks a plain tensor, so gradients with respect to it can be asked for.
  void watch(const Tensor& tensor);
  void watch(const Variable& variable);

  /// d(sum of target's elements)/d(variable), one per variable, in order. A variable the
  /// target does not depend on gets an undefined Tensor (check .defined()), as TensorFlow
  /// returns None.
  std::vector<Tensor> gradient(const Tensor& target, const std::vector<Variable>& variables);
  /// The same with respect to watched tensors (or tensors computed under the tape).
  std::vector<Tensor> gradient(const Tensor& target, const std::vector<Tensor>& sources);
  Tensor gradient(const Tensor& target, const Tensor& source);

  struct Record;  // implementation detail

 private:
  std::unique_ptr<Record> record_;
  Options options_;
  bool used_ = false;
};

}  // namespace tandem
