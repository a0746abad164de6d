// Checkpoint: the tracked objects, and writing them in the layout of docs/checkpoint-format.md
// (version 1). The layout's names and helpers: layout.cpp; the file written: write.cpp; the
// state gathered across workers: gather.cpp; restoring: restore.cpp; verifying: verify.cpp.
#include "tandem/checkpoint/checkpoint.h"

#include <array>

#include "tandem/checkpoint/internal/gather.h"
#include "tandem/checkpoint/internal/layout.h"
#include "tandem/data/distributed_dataset.h"
#include "tandem/nn/module.h"
#include "tandem/optim/loss_scale_optimizer.h"
#include "tandem/optim/optimizer.h"

namespace tandem {

using detail::layers_of;
using detail::signature_of;
using detail::tracked_counter;
using detail::tracked_one;
using detail::tracked_optimizer;

// ---- Trackable and Checkpoint --------------------------------------------------------------

std::string_view Trackable::kind() const {
  static constexpr std::array<std::string_view, 9> kNames = {
      "model",   "optimizer",       "distributed dataset", "dataset iterator", "metric",
      "counter", "float64 counter", "float32 counter",     "user state"};
  static_assert(kNames.size() == std::variant_size_v<Pointer>);
  return kNames[pointer_.index()];
}

Checkpoint::Checkpoint(std::initializer_list<Entry> entries) {
  for (const Entry& e : entries) add(e.name, e.object);
}

void Checkpoint::add(std::string name, Trackable object) {
  TANDEM_CHECK(!name.empty(), "Checkpoint: an object (", object.kind(), ") has an empty name");
  TANDEM_CHECK(name.find('/') == std::string::npos, "Checkpoint: name \"", name,
               "\" contains '/'; names are HDF5 group names");
  const bool is_null = std::visit([](auto* p) { return p == nullptr; }, object.pointer());
  TANDEM_CHECK(!is_null, "Checkpoint: \"", name, "\" is a null ", object.kind(), " pointer");
  for (const Entry& e : entries_) {
    TANDEM_CHECK(e.name != name, "Checkpoint: the name \"", name, "\" is used twice");
    const bool one_only = object.pointer().index() <= 1;  // model, optimizer
    TANDEM_CHECK(!one_only || e.object.pointer().index() != object.pointer().index(),
                 "Checkpoint: \"", name, "\" is a second ", object.kind(), " (\"", e.name,
                 "\" is the first); a checkpoint holds one model and one optimizer, as the ",
                 "Keras layout has one /model_weights");
  }
  const bool floating = std::holds_alternative<double*>(object.pointer()) ||
                        std::holds_alternative<float*>(object.pointer());
  TANDEM_CHECK(!floating || !detail::is_standard_counter(name), "Checkpoint: \"", name, "\" is a ",
               object.kind(),
               ", but the standard counter of that name is int64: ", "track an int64_t");
  entries_.push_back({std::move(name), object});
}

int64_t Checkpoint::global_step() const {
  if (const int64_t* counter = tracked_counter(entries_, "global_step")) return *counter;
  if (const optim::Optimizer* optimizer = tracked_optimizer(entries_))
    return optimizer->iterations();
  return 0;
}

int Checkpoint::num_replicas() const {
  if (const nn::Module* model = tracked_one<nn::Module>(entries_)) {
    if (model->built()) {
      const std::vector<Variable> weights = model->weights();
      if (!weights.empty()) return weights.front().num_copies();
    }
  }
  if (const optim::Optimizer* optimizer = tracked_optimizer(entries_))
    return optimizer->iterations_variable().num_copies();
  if (const data::DistributedDataset* d = tracked_one<data::DistributedDataset>(entries_))
    return static_cast<int>(d->num_replicas());
  return 1;
}

std::string Checkpoint::model_signature() const {
  const nn::Module* model = tracked_one<nn::Module>(entries_);
  return model ? signature_of(layers_of(*model)) : std::string();
}

void Checkpoint::write(const std::string& path) const {
  detail::write_gathered(*this, path, detail::gather_state(*this, nullptr));
}

}  // namespace tandem
