// The tape's record and the backward walk. A tape registers its record as an ops::Recorder
// (ops/recording.h); ops record on it when it tracks one of their inputs (watched, or produced by
// a recorded op).
#include "tandem/autograd/tape.h"

#include <string>
#include <unordered_map>
#include <unordered_set>

#include "tandem/ops/ops.h"

namespace tandem {

/// The tape's record: the tensors it tracks and the nodes ops recorded on it.
struct GradientTape::Record final : ops::Recorder {
  struct Node {
    std::string_view op;
    std::vector<Tensor> inputs;
    std::vector<Tensor> outputs;
    autograd::BackwardFn backward;
  };
  bool watch_accessed_variables = true;
  std::unordered_set<const TensorImpl*> tracked;
  std::vector<Tensor> watched;  // keeps watched tensors alive so their ids stay unique
  std::vector<Node> nodes;

  void watch(const Tensor& t) {
    if (tracked.insert(t.id()).second) watched.push_back(t);
  }
  bool tracks(const Tensor& t) const override { return t.defined() && tracked.count(t.id()) != 0; }
  void add_node(std::string_view op, const std::vector<Tensor>& inputs,
                const std::vector<Tensor>& outputs, const autograd::BackwardFn& backward) override {
    for (const Tensor& out : outputs) tracked.insert(out.id());
    nodes.push_back({op, inputs, outputs, backward});
  }
  void on_variable_read(const Tensor& value) override {
    if (watch_accessed_variables) watch(value);
  }
};

namespace autograd {

void watch_on_active_tapes(const Tensor& value) { ops::watch_on_active_recorders(value); }

}  // namespace autograd

GradientTape::GradientTape() : GradientTape(Options{}) {}

GradientTape::GradientTape(Options options)
    : record_(std::make_unique<Record>()), options_(options) {
  record_->watch_accessed_variables = options.watch_accessed_variables;
  ops::register_recorder(record_.get());
}

GradientTape::~GradientTape() { ops::unregister_recorder(record_.get()); }

void GradientTape::watch(const Tensor& tensor) {
  TANDEM_CHECK(tensor.defined(), "GradientTape::watch: the tensor is undefined");
  record_->watch(tensor);
}

void GradientTape::watch(const Variable& variable) { watch(variable.value_untracked()); }

std::vector<Tensor> GradientTape::gradient(const Tensor& target,
                                           const std::vector<Variable>& variables) {
  std::vector<Tensor> sources;
  sources.reserve(variables.size());
  for (const Variable& v : variables) sources.push_back(v.value_untracked());
  return gradient(target, sources);
}

Tensor GradientTape::gradient(const Tensor& target, const Tensor& source) {
  return gradient(target, std::vector<Tensor>{source})[0];
}

std::vector<Tensor> GradientTape::gradient(const Tensor& target,
                                           const std::vector<Tensor>& sources) {
  TANDEM_CHECK(!used_ || options_.persistent,
               "GradientTape::gradient: a non-persistent tape can compute gradients once; "
               "construct it with {.persistent = true} to call gradient() several times");
  TANDEM_CHECK(target.defined(), "GradientTape::gradient: the target is undefined");
  used_ = true;
  autograd::NoRecordGuard no_record;  // the backward pass itself is not recorded

  // A tensor's gradient so far. The first contribution is kept as the backward returned it, and
  // may be shared (a backward may pass its output gradient on, to several inputs); the second
  // is added into a new buffer the tape owns, and later ones are added into that in place.
  struct Gradient {
    Tensor value;
    bool owned = false;
  };
  std::unordered_map<const TensorImpl*, Gradient> grads;
  if (record_->tracks(target)) grads[target.id()] = {Tensor::ones_like(target)};

  auto accumulate = [&](const Tensor& input, const Tensor& grad) {
    if (!grad.defined() || !record_->tracks(input)) return;
    TANDEM_CHECK(grad.shape() == input.shape(), "gradient of shape ", grad.shape(),
                 " does not match its input of shape ", input.shape());
    auto [it, inserted] = grads.try_emplace(input.id(), Gradient{grad});
    if (inserted) return;
    Gradient& sum = it->second;
    if (sum.owned) {
      ops::add_(sum.value, grad);
    } else {
      sum.value = ops::add(sum.value, grad);
      sum.owned = true;
    }
  };

  for (auto node = record_->nodes.rbegin(); node != record_->nodes.rend(); ++node) {
    std::vector<Tensor> grad_outputs;
    grad_outputs.reserve(node->outputs.size());
    bool any = false;
    for (const Tensor& out : node->outputs) {
      auto it = grads.find(out.id());
      grad_outputs.push_back(it == grads.end() ? Tensor() : it->second.value);
      any = any || it != grads.end();
    }
    if (!any) continue;
    std::vector<Tensor> grad_inputs = node->backward(grad_outputs);
    TANDEM_CHECK(grad_inputs.size() == node->inputs.size(), "backward of ", node->op, " returned ",
                 grad_inputs.size(), " gradients for ", node->inputs.size(), " inputs");
    for (size_t i = 0; i < grad_inputs.size(); ++i) accumulate(node->inputs[i], grad_inputs[i]);
  }

  std::vector<Tensor> result;
  result.reserve(sources.size());
  for (const Tensor& s : sources) {
    auto it = s.defined() ? grads.find(s.id()) : grads.end();
    result.push_back(it == grads.end() ? Tensor() : it->second.value);
  }
  if (!options_.persistent) {
    // Free the intermediates as soon as the one allowed call is done, and stop tracking:
    // freed tensors' addresses may be reused by unrelated tensors.
    record_->nodes.clear();
    record_->watched.clear();
    record_->tracked.clear();
  }
  return result;
}

}  // namespace tandem
