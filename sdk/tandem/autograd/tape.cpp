// The tape's record and the backward walk. A tape registers its record as an ops::Recorder
// (ops/recording.h); ops record on it when it tracks one of their inputs (watched, or produced by
// a recorded op).
#include "tandem/autograd/tape.h"

#include <limits>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>

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

namespace {
thread_local GradientListener* t_listener = nullptr;
}  // namespace

GradientListener* set_gradient_listener(GradientListener* listener) {
  return std::exchange(t_listener, listener);
}

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
    // In place from the third contribution on; 16-bit gradients (add_ takes none) through
    // ops::add, which sums in float32 and rounds once, as add_ would.
    if (sum.owned && !is_half(sum.value.dtype())) {
      ops::add_(sum.value, grad);
    } else {
      sum.value = ops::add(sum.value, grad);
      sum.owned = true;
    }
  };

  // With a listener: each source's gradient is final once the walk has passed the first node
  // that reads it (nodes are visited last to first). final_at[k]: the sources final after node
  // k; sources no node reads are final at the end.
  autograd::GradientListener* listener = autograd::t_listener;
  const bool tell = listener != nullptr && listener->begin(sources);
  std::vector<std::vector<size_t>> final_at;
  std::vector<size_t> final_at_end;
  auto gradient_of = [&](const Tensor& s) {
    auto it = s.defined() ? grads.find(s.id()) : grads.end();
    return it == grads.end() ? Tensor() : it->second.value;
  };
  if (tell) {
    std::unordered_map<const TensorImpl*, size_t> first_use;
    for (const Tensor& s : sources)
      if (s.defined()) first_use.emplace(s.id(), std::numeric_limits<size_t>::max());
    for (size_t k = 0; k < record_->nodes.size(); ++k)
      for (const Tensor& in : record_->nodes[k].inputs) {
        auto it = in.defined() ? first_use.find(in.id()) : first_use.end();
        if (it != first_use.end() && k < it->second) it->second = k;
      }
    final_at.resize(record_->nodes.size());
    for (size_t i = 0; i < sources.size(); ++i) {
      const Tensor& s = sources[i];
      const size_t k = s.defined() ? first_use.at(s.id()) : std::numeric_limits<size_t>::max();
      (k < final_at.size() ? final_at[k] : final_at_end).push_back(i);
    }
  }

  for (auto node = record_->nodes.rbegin(); node != record_->nodes.rend(); ++node) {
    if (tell) {
      // Sources first read by the node visited last are final now (tell before this node).
      const size_t visited = static_cast<size_t>(record_->nodes.rend() - node);
      if (visited < final_at.size())
        for (size_t i : final_at[visited]) listener->ready(i, gradient_of(sources[i]));
    }
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

  if (tell) {
    if (!final_at.empty())
      for (size_t i : final_at[0]) listener->ready(i, gradient_of(sources[i]));
    for (size_t i : final_at_end) listener->ready(i, gradient_of(sources[i]));
  }
  std::vector<Tensor> result;
  result.reserve(sources.size());
  for (const Tensor& s : sources) result.push_back(gradient_of(s));
  if (tell) listener->end(result);
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
