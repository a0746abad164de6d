// Gradient accumulation: each replica's accumulators, the micro-step counter, and the update
// from the mean of the micro-steps' gradients.
#include "tandem/autograd/tape.h"
#include "tandem/core/error.h"
#include "tandem/ops/ops.h"
#include "tandem/optim/optimizer.h"

namespace tandem::optim {

int64_t Optimizer::accumulate(const std::vector<Tensor>& gradients,
                              const std::vector<Variable>& variables,
                              std::vector<Tensor>& accumulated) {
  autograd::NoRecordGuard no_record;
  accumulated.assign(variables.size(), Tensor());
  for (size_t i = 0; i < variables.size(); ++i) {
    if (!gradients[i].defined()) continue;
    Tensor acc = entry_for(variables[i]).accumulator.value_untracked();
    ops::add_(acc, gradients[i]);
    accumulated[i] = acc;
  }
  const int64_t done = micro_step() + 1;
  if (done < accumulation_steps_)
    micro_step_.assign(Tensor::scalar(static_cast<double>(done), DType::kInt64));
  return done;
}

bool Optimizer::finish_accumulation(std::vector<Tensor> combined,
                                    const std::vector<Variable>& variables) {
  autograd::NoRecordGuard no_record;
  // The mean over micro-steps, divided as Keras does: (sum of N gradients) / N.
  for (Tensor& g : combined) {
    if (!g.defined()) continue;
    g = ops::div(g,
                 Tensor::scalar(static_cast<double>(accumulation_steps_), g.dtype(), g.device()));
  }
  const bool updated = apply_update(combined, variables);
  reset_accumulators();
  return updated;
}

void Optimizer::reset_accumulators() {
  // Every accumulator of this replica, also of variables without a gradient this time.
  std::vector<Variable> to_reset;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const auto& entry : entries_) to_reset.push_back(entry->accumulator);
  }
  for (const Variable& acc : to_reset) {
    Tensor value = acc.value_untracked();
    value.fill_(0.0);
  }
  micro_step_.assign(Tensor::scalar(0, DType::kInt64));
}

std::vector<std::pair<std::string, Variable>> Optimizer::accumulator_variables() const {
  if (inner_ != nullptr) return inner_->accumulator_variables();
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<std::pair<std::string, Variable>> out;
  if (accumulation_steps_ == 1) return out;
  for (const auto& entry : entries_) out.emplace_back(entry->variable.name(), entry->accumulator);
  return out;
}

}  // namespace tandem::optim
