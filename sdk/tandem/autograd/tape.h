// GradientTape: records the ops run on the calling thread while it lives, then computes
// gradients by walking the record backwards (reverse-mode automatic differentiation).
// Each replica thread has its own tapes; a tape never sees another thread's ops.
#pragma once

#include <memory>
#include <vector>

#include "tandem/autograd/variable.h"
#include "tandem/ops/recording.h"
#include "tandem/tensor/tensor.h"

namespace tandem {

namespace autograd {

// The recording primitives belong to ops (ops/recording.h); these are their autograd names.
using ops::BackwardFn;
using ops::needs_recording;
using ops::NoRecordGuard;
using ops::record;
/// Lets every active tape that watches accessed variables watch `value`.
void watch_on_active_tapes(const Tensor& value);

/// Told of each source's final gradient while GradientTape::gradient walks the record backwards:
/// as soon as no node still to be visited can add to it (the reverse order of the sources' first
/// use), not after the whole walk. What a gradient reducer needs to start communicating while
/// the backward pass goes on. One listener per thread (set_gradient_listener); it is told of
/// every gradient() call made on that thread.
class GradientListener {
 public:
  /// A gradient() call begins. Returns whether to be told of each gradient (ready()).
  virtual bool begin(const std::vector<Tensor>& sources) = 0;
  /// sources[index]'s gradient is final (undefined: the target does not depend on it). Each
  /// index is told once per call, in the order gradients become final.
  virtual void ready(size_t index, const Tensor& gradient) = 0;
  /// The call returns `gradients` (one per source, the tensors ready() was given). Not called
  /// when the walk raised.
  virtual void end(const std::vector<Tensor>& gradients) = 0;

 protected:
  ~GradientListener() = default;
};

/// Sets the calling thread's listener (nullptr: none); returns the previous one.
GradientListener* set_gradient_listener(GradientListener* listener);

}  // namespace autograd

/// Records the ops run on the calling thread while it lives, then computes gradients
/// (tf.GradientTape): make one in the step, compute the loss, then tape.gradient(loss,
/// model.trainable_variables()). Each replica thread records its own.
class GradientTape {
 public:
  /// How the tape records; the defaults are TensorFlow's.
  struct Options {
    /// A persistent tape allows several gradient() calls; otherwise the record is freed after
    /// the first.
    bool persistent = false;
    /// Trainable variables read while the tape is active are watched automatically.
    bool watch_accessed_variables = true;
  };

  /// A non-persistent tape that watches the trainable variables read under it.
  GradientTape();
  /// A tape with `options`: `GradientTape({.persistent = true})`.
  explicit GradientTape(Options options);
  ~GradientTape();
  GradientTape(const GradientTape&) = delete;
  GradientTape& operator=(const GradientTape&) = delete;

  /// Tracks a plain tensor, so gradients with respect to it can be asked for.
  void watch(const Tensor& tensor);
  /// Watches a variable (needed for a non-trainable one, or with watch_accessed_variables off).
  void watch(const Variable& variable);

  /// d(sum of target's elements)/d(variable), one per variable, in order. A variable the
  /// target does not depend on gets an undefined Tensor (check .defined()), as TensorFlow
  /// returns None.
  std::vector<Tensor> gradient(const Tensor& target, const std::vector<Variable>& variables);
  /// The same with respect to watched tensors (or tensors computed under the tape).
  std::vector<Tensor> gradient(const Tensor& target, const std::vector<Tensor>& sources);
  /// The same for one source.
  Tensor gradient(const Tensor& target, const Tensor& source);

  struct Record;  // implementation detail

 private:
  std::unique_ptr<Record> record_;
  Options options_;
  bool used_ = false;
};

}  // namespace tandem
