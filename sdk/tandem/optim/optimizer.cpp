// Optimizer: argument checks, clipping, learning rate, slot creation and the update counter
// around each optimizer's update_step.
#include "tandem/optim/optimizer.h"

#include "tandem/autograd/tape.h"
#include "tandem/core/error.h"
#include "tandem/core/logging.h"
#include "tandem/optim/clip.h"
#include "tandem/optim/json_number.h"

namespace tandem::optim {

Optimizer::Optimizer(std::string name, LearningRate learning_rate,
                     std::optional<double> global_clipnorm, std::vector<std::string> slot_names)
    : name_(std::move(name)),
      learning_rate_(std::move(learning_rate)),
      global_clipnorm_(global_clipnorm),
      slot_names_(std::move(slot_names)),
      iterations_(make_variable("iteration", Tensor::scalar(0, DType::kInt64),
                                /*trainable=*/false)) {
  TANDEM_CHECK(!global_clipnorm_ || *global_clipnorm_ > 0.0, name_,
               ": global_clipnorm must be positive, got ", global_clipnorm_.value_or(0.0));
}

int64_t Optimizer::iterations() const { return iterations_.value_untracked().item<int64_t>(); }

void Optimizer::set_iterations(int64_t iterations) {
  TANDEM_CHECK(iterations >= 0, name_, ": iterations must be >= 0, got ", iterations);
  const Tensor value = Tensor::scalar(static_cast<double>(iterations), DType::kInt64);
  for (int r = 0; r < iterations_.num_copies(); ++r) {
    Tensor copy = iterations_.copy(r);
    copy.copy_from(value);
  }
}

double Optimizer::current_learning_rate() const { return learning_rate_(iterations()); }

Optimizer::Entry& Optimizer::entry_for(const Variable& variable) {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto it = index_.find(variable.id());
  if (it != index_.end()) return *entries_[it->second];
  auto entry = std::make_unique<Entry>();
  entry->variable = variable;
  const Tensor& value = variable.value_untracked();
  for (const std::string& slot : slot_names_) {
    entry->slots.push_back(make_variable(slot + "/" + variable.name(), Tensor::zeros_like(value),
                                         /*trainable=*/false));
  }
  index_.emplace(variable.id(), entries_.size());
  entries_.push_back(std::move(entry));
  return *entries_.back();
}

void Optimizer::build(const std::vector<Variable>& variables) {
  for (const Variable& v : variables) {
    TANDEM_CHECK(v.defined(), name_, ".build: an undefined variable");
    entry_for(v);
  }
}

void Optimizer::apply_gradients(const std::vector<Tensor>& gradients,
                                const std::vector<Variable>& variables) {
  TANDEM_CHECK(gradients.size() == variables.size(), name_, ".apply_gradients: ", gradients.size(),
               " gradients for ", variables.size(),
               " variables; pass one gradient per variable, in order");
  autograd::NoRecordGuard no_record;  // updates are never differentiated
  bool any_defined = false;
  for (size_t i = 0; i < variables.size(); ++i) {
    const Variable& var = variables[i];
    TANDEM_CHECK(var.defined(), name_, ".apply_gradients: variable ", i, " is undefined");
    const Tensor& g = gradients[i];
    if (!g.defined()) {
      std::lock_guard<std::mutex> lock(mutex_);
      if (warned_.insert(var.id()).second) {
        TANDEM_LOG_WARNING(name_, ": no gradient for variable \"", var.name(),
                           "\" (the loss does not depend on it); it is left unchanged");
      }
      continue;
    }
    any_defined = true;
    const Tensor& value = var.value_untracked();
    TANDEM_CHECK(g.shape() == value.shape(), name_,
                 ".apply_gradients: the gradient for variable \"", var.name(), "\" has shape ",
                 g.shape(), " but the variable has shape ", value.shape());
    TANDEM_CHECK(g.dtype() == value.dtype(), name_,
                 ".apply_gradients: the gradient for variable \"", var.name(), "\" is ", g.dtype(),
                 " but the variable is ", value.dtype());
  }
  if (!variables.empty()) {
    TANDEM_CHECK(any_defined, name_, ".apply_gradients: no gradient is defined for any of the ",
                 variables.size(), " variables (first: \"", variables[0].name(),
                 "\"); was the loss computed under the GradientTape from these variables?");
  }

  std::vector<Tensor> grads = gradients;
  if (global_clipnorm_) grads = clip_by_global_norm(grads, *global_clipnorm_).gradients;

  const int64_t done = iterations();
  const double rate = learning_rate_(done);
  for (size_t i = 0; i < variables.size(); ++i) {
    if (!grads[i].defined()) continue;
    Entry& entry = entry_for(variables[i]);
    Tensor value = variables[i].value_untracked();
    std::vector<Tensor> slots;
    slots.reserve(entry.slots.size());
    for (const Variable& s : entry.slots) slots.push_back(s.value_untracked());
    // Keras casts the (float32) learning rate to the variable's dtype.
    const double lr =
        value.dtype() == DType::kFloat32 ? static_cast<double>(static_cast<float>(rate)) : rate;
    update_step(grads[i], value, slots, lr, done + 1);
  }
  iterations_.assign(Tensor::scalar(static_cast<double>(done + 1), DType::kInt64));
}

std::vector<std::pair<std::string, Variable>> Optimizer::slot_variables() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<std::pair<std::string, Variable>> out;
  for (const auto& entry : entries_) {
    for (const Variable& s : entry->slots) out.emplace_back(s.name(), s);
  }
  return out;
}

Variable Optimizer::slot(const Variable& variable, const std::string& slot_name) const {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto it = index_.find(variable.id());
  TANDEM_CHECK(it != index_.end(), name_, ": variable \"", variable.name(),
               "\" has no slots yet (build the optimizer or apply a gradient first)");
  for (size_t k = 0; k < slot_names_.size(); ++k) {
    if (slot_names_[k] == slot_name) return entries_[it->second]->slots[k];
  }
  std::string names;
  for (const std::string& s : slot_names_) {
    if (!names.empty()) names += ", ";
    names += s;
  }
  TANDEM_THROW(name_, ": no slot \"", slot_name,
               "\" (this optimizer's slots: ", names.empty() ? std::string("none") : names, ")");
}

std::string Optimizer::base_config_json() const {
  const std::string clip = global_clipnorm_ ? detail::json_number(*global_clipnorm_) : "null";
  return "\"name\": \"" + name_ + "\", \"learning_rate\": " + learning_rate_.schedule().to_json() +
         ", \"global_clipnorm\": " + clip;
}

std::string Optimizer::config_json() const {
  std::string out = "{";
  out += base_config_json();
  out += "}";
  return out;
}

}  // namespace tandem::optim
