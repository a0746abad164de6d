// A recorder for tests: keeps the name and backward function of every op recorded on its thread
// while it lives, so a test can see which nodes an op or a layer records and call their
// backward functions directly.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "tandem/ops/recording.h"
#include "tandem/tensor/tensor.h"

namespace tandem::testing {

/// Tracks the tensors it is given, the variables read while it lives and the outputs of the ops
/// it records.
class NodeRecorder : public ops::Recorder {
 public:
  explicit NodeRecorder(std::vector<Tensor> tracked) : tracked_(std::move(tracked)) {
    ops::register_recorder(this);
  }
  ~NodeRecorder() override { ops::unregister_recorder(this); }
  bool tracks(const Tensor& t) const override {
    for (const Tensor& u : tracked_)
      if (t.defined() && u.id() == t.id()) return true;
    return false;
  }
  void add_node(std::string_view op, const std::vector<Tensor>&,
                const std::vector<Tensor>& outputs, const ops::BackwardFn& backward) override {
    ops_.emplace_back(op);
    backwards_.push_back(backward);
    for (const Tensor& out : outputs) tracked_.push_back(out);
  }
  void on_variable_read(const Tensor& value) override { tracked_.push_back(value); }

  const std::vector<std::string>& ops() const { return ops_; }
  const ops::BackwardFn& backward(size_t i) const { return backwards_.at(i); }

 private:
  std::vector<Tensor> tracked_;
  std::vector<std::string> ops_;
  std::vector<ops::BackwardFn> backwards_;
};

}  // namespace tandem::testing
