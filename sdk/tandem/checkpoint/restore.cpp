// Checkpoint::restore: everything is read and checked into memory first, then applied, so a
// failed restore changes nothing.
#include <algorithm>
#include <array>
#include <cmath>
#include <map>
#include <optional>
#include <set>
#include <unordered_map>

#include "tandem/checkpoint/internal/layout.h"
#include "tandem/checkpoint/internal/metric_state.h"
#include "tandem/checkpoint/internal/user_state.h"
#include "tandem/core/logging.h"
#include "tandem/core/workers.h"
#include "tandem/data/dataset.h"
#include "tandem/data/distributed_dataset.h"
#include "tandem/metrics/metrics.h"
#include "tandem/nn/module.h"
#include "tandem/nn/replica_state.h"
#include "tandem/optim/loss_scale_optimizer.h"
#include "tandem/optim/optimizer.h"

namespace tandem {

using detail::assign_all_copies;
using detail::check_counter;
using detail::generators_of;
using detail::is_standard_counter;
using detail::keras_name;
using detail::kIterationName;
using detail::kModelWeights;
using detail::kOptimizerWeights;
using detail::kTrainingState;
using detail::layers_of;
using detail::LayerWeights;
using detail::location;
using detail::mismatch;
using detail::read_iterator_state;
using detail::read_metric_state;
using detail::signature_of;
using detail::strip_keras_suffix;
using detail::tracked;
using detail::tracked_loss_scale;
using detail::tracked_one;
using detail::tracked_optimizer;

namespace {

// ---- what a restore reads before it changes anything --------------------------------------

struct LoadedData {
  std::string kind;
  int64_t num_replicas = 0;
  int64_t epoch = 0;
  data::IteratorState state;
};

struct Loaded {
  std::string path;
  std::vector<std::pair<Variable, Tensor>> model_values;
  std::optional<std::vector<std::array<uint64_t, 4>>> rng;
  int64_t iteration = 0;
  std::vector<std::pair<std::string, Tensor>> slots;  // slot variable name -> value
  int64_t micro_step = 0;
  std::vector<std::pair<std::string, Tensor>> accumulators;  // variable name -> summed value
  std::optional<std::pair<double, int64_t>> loss_scale;      // scale, good_steps
  std::map<std::string, int64_t> counters;                   // tracked counter name -> value
  std::map<std::string, LoadedData> data;                    // tracked name -> state
  std::map<std::string, metrics::MetricState> metrics;
  detail::LoadedUserState user;  // double and float counters, TrackedState objects
};

/// Names the first variable in which the file's /model_weights and the model differ, with both
/// shapes; "" when they agree.
std::string first_model_difference(const h5::Group& weights,
                                   const std::vector<LayerWeights>& layers) {
  struct Stored {
    Shape shape;
    DType dtype;
  };
  std::map<std::string, Stored> file_variables;
  std::vector<std::string> file_order;
  std::vector<std::string> file_layers = weights.has_attr("layer_names")
                                             ? weights.read_attr_strings("layer_names")
                                             : std::vector<std::string>{};
  for (const std::string& layer : file_layers) {
    if (!weights.exists(layer)) continue;
    const h5::Group group = weights.open_group(layer);
    if (!group.has_attr("weight_names")) continue;
    for (const std::string& name : group.read_attr_strings("weight_names")) {
      if (!group.exists(name)) continue;
      file_variables[strip_keras_suffix(name)] = {group.dataset_shape(name),
                                                  group.dataset_dtype(name)};
      file_order.push_back(strip_keras_suffix(name));
    }
  }
  std::set<std::string> model_names;
  for (const LayerWeights& layer : layers) {
    for (const Variable& v : layer.weights) {
      model_names.insert(v.name());
      const auto it = file_variables.find(v.name());
      if (it == file_variables.end())
        return detail::str_cat("variable \"", v.name(), "\" (shape ", v.shape(),
                               " in this model) is missing from the file");
      if (it->second.shape != v.shape())
        return detail::str_cat("variable \"", v.name(), "\" has shape ", it->second.shape,
                               " in the file but ", v.shape(), " in this model");
      if (it->second.dtype != v.dtype())
        return detail::str_cat("variable \"", v.name(), "\" is ", it->second.dtype,
                               " in the file but ", v.dtype(), " in this model (shape ", v.shape(),
                               " in both)");
    }
  }
  for (const std::string& name : file_order) {
    if (!model_names.contains(name))
      return detail::str_cat("the file has variable \"", name, "\" (shape ",
                             file_variables[name].shape, ") that this model lacks");
  }
  std::vector<std::string> model_layers;
  for (const LayerWeights& layer : layers) model_layers.push_back(layer.name);
  for (size_t i = 0; i < std::max(file_layers.size(), model_layers.size()); ++i) {
    const std::string in_file = i < file_layers.size() ? file_layers[i] : "(none)";
    const std::string in_model = i < model_layers.size() ? model_layers[i] : "(none)";
    if (in_file != in_model)
      return detail::str_cat("layer ", i, " is \"", in_file, "\" in the file but \"", in_model,
                             "\" in this model");
  }
  return "";
}

void load_model(const h5::Group& root, const nn::Module& model, Loaded& out) {
  const std::string& path = out.path;
  const h5::Group weights = root.open_group(kModelWeights);
  const std::vector<LayerWeights> layers = layers_of(model);
  const std::string expected = signature_of(layers);
  const std::string stored =
      root.has_attr("model_signature") ? root.read_attr_string("model_signature") : "";
  if (stored != expected) {
    const std::string difference = first_model_difference(weights, layers);
    mismatch(path, "checkpoint of another model: " +
                       (difference.empty() ? "the layer or variable names differ" : difference) +
                       " (model_signature " + stored + " in the file, " + expected +
                       " for this model)");
  }
  for (const LayerWeights& layer : layers) {
    for (const Variable& v : layer.weights) {
      const std::string name = layer.name + "/" + keras_name(v.name());
      if (!weights.exists(name)) mismatch(path, first_model_difference(weights, layers));
      Tensor value = weights.read_tensor(name);
      if (value.shape() != v.shape() || value.dtype() != v.dtype())
        mismatch(path, detail::str_cat("variable \"", v.name(), "\" has shape ", value.shape(),
                                       " (", value.dtype(), ") in the file but ", v.shape(), " (",
                                       v.dtype(), ") in this model"));
      out.model_values.emplace_back(v, std::move(value));
    }
  }
}

void load_optimizer(const h5::Group& root, const optim::Optimizer& optimizer,
                    const nn::Module* model, Loaded& out) {
  const std::string& path = out.path;
  const h5::Group group = root.open_group(kOptimizerWeights);
  const std::string stored = group.read_attr_string("optimizer");
  if (stored != optimizer.name())
    mismatch(path, "the checkpoint's optimizer is \"" + stored + "\" but this run's is \"" +
                       optimizer.name() + "\"");
  out.iteration = group.read_scalar_int64(kIterationName);
  check_counter(location(group, kIterationName), out.iteration);
  // The slots this optimizer has or will create for the model's trainable variables, by name,
  // with the shape each must have.
  std::unordered_map<std::string, Shape> expected;
  for (const optim::Optimizer::SlotPlacement& p : optimizer.slot_placements())
    expected[p.name] = p.variable.copy(0).shape();  // a slot has its variable's shape
  if (model) {
    for (const Variable& v : model->trainable_variables())
      for (const std::string& kind : optimizer.slot_names())
        expected[kind + "/" + v.name()] = v.shape();
  }
  for (const std::string& keras : group.read_attr_strings("weight_names")) {
    if (keras == kIterationName) continue;
    const std::string name = strip_keras_suffix(keras);
    const auto it = expected.find(name);
    if (it == expected.end())
      mismatch(path, "optimizer slot \"" + name + "\" belongs to no variable of this model");
    Tensor value = group.read_tensor(keras);
    if (value.shape() != it->second)
      mismatch(path, detail::str_cat("optimizer slot \"", name, "\" has shape ", value.shape(),
                                     " in the file but ", it->second, " in this model"));
    out.slots.emplace_back(name, std::move(value));
  }
}

void load_training_state(const h5::Group& root, const std::vector<Checkpoint::Entry>& entries,
                         const nn::Module* model, int num_replicas, Loaded& out) {
  const std::string& path = out.path;
  const h5::Group group = root.open_group(kTrainingState);
  if (group.exists("grad_accum/micro_step")) {
    const h5::Group accumulation = group.open_group("grad_accum");
    out.micro_step = accumulation.read_scalar_int64("micro_step");
    const int64_t saved_steps = accumulation.has_attr("gradient_accumulation_steps")
                                    ? accumulation.read_attr_int64("gradient_accumulation_steps")
                                    : 1;
    if (out.micro_step > 0) {
      const optim::Optimizer* optimizer = tracked_optimizer(entries);
      const int steps = optimizer ? optimizer->gradient_accumulation_steps() : 1;
      if (steps != saved_steps)
        mismatch(path, detail::str_cat("saved in the middle of gradient accumulation (micro_step ",
                                       out.micro_step, " of ", saved_steps,
                                       "), but this run's optimizer accumulates ", steps,
                                       " steps; resume with gradient_accumulation_steps = ",
                                       saved_steps, " or from a checkpoint at an update boundary"));
      std::unordered_map<std::string, Shape> expected;
      if (model)
        for (const Variable& v : model->trainable_variables()) expected[v.name()] = v.shape();
      for (const auto& [name, accumulator] : optimizer->accumulator_variables())
        expected[name] = accumulator.shape();
      for (const auto& [name, shape] : expected) {
        // A variable that never had a gradient has no stored accumulator: it stays zero.
        const std::string where = keras_name(name);
        if (!accumulation.exists(where)) continue;
        Tensor value = accumulation.read_tensor(where);
        if (value.shape() != shape)
          mismatch(path,
                   detail::str_cat("the accumulator of variable \"", name, "\" has shape ",
                                   value.shape(), " in the file but ", shape, " in this model"));
        out.accumulators.emplace_back(name, std::move(value));
      }
    }
  }
  if (const optim::LossScaleOptimizer* lso = tracked_loss_scale(entries)) {
    if (group.exists("loss_scale/scale")) {
      const h5::Group loss_scale = group.open_group("loss_scale");
      // A finite positive float32 scale and good_steps >= 0 (validated).
      const double value = loss_scale.read_tensor("scale").item<double>();
      const int64_t good_steps = loss_scale.read_scalar_int64("good_steps");
      TANDEM_CHECK(good_steps < lso->options().dynamic_growth_steps,
                   location(loss_scale, "good_steps"), " is ", good_steps, ", outside [0, ",
                   lso->options().dynamic_growth_steps, ") (this run's dynamic_growth_steps)");
      out.loss_scale = std::make_pair(value, good_steps);
    } else {
      TANDEM_LOG_INFO(path, ": no loss scale in the checkpoint (written without one); the loss ",
                      "scale keeps its value, ", lso->loss_scale());
    }
  }
  for (const auto& [name, counter] : tracked<int64_t>(entries)) {
    const std::string where = is_standard_counter(name) ? name : "counters/" + name;
    if (group.exists(where)) {
      if (group.dataset_dtype(where) != DType::kInt64)
        mismatch(path, detail::str_cat(location(group, where), " is a ", group.dataset_dtype(where),
                                       " counter but \"", name,
                                       "\" is tracked as an int64 one (int64_t*)"));
      out.counters[name] = group.read_scalar_int64(where);
      // The standard counters count steps, epochs and samples; a tracked counter of another
      // name is the program's own and may hold anything.
      if (is_standard_counter(name)) check_counter(location(group, where), out.counters[name]);
    } else {
      TANDEM_LOG_WARNING(path, ": counter \"", name, "\" is not in the checkpoint; it keeps its ",
                         "value ", *counter);
    }
  }
  for (const auto& [name, dataset] : tracked<data::DistributedDataset>(entries)) {
    if (!group.exists("data/" + name)) {
      TANDEM_LOG_WARNING(path, ": data \"", name, "\" is not in the checkpoint; it keeps its ",
                         "position");
      continue;
    }
    const h5::Group d = group.open_group("data/" + name);
    out.data[name] = {d.read_attr_string("kind"),
                      d.has_attr("num_replicas") ? d.read_attr_int64("num_replicas") : 0,
                      d.read_attr_int64("epoch"), read_iterator_state(d)};
  }
  for (const auto& [name, iterator] : tracked<data::Iterator>(entries)) {
    if (!group.exists("data/" + name)) {
      TANDEM_LOG_WARNING(path, ": iterator \"", name, "\" is not in the checkpoint; it keeps ",
                         "its position");
      continue;
    }
    const h5::Group d = group.open_group("data/" + name);
    out.data[name] = {d.read_attr_string("kind"), 0, d.read_attr_int64("epoch"),
                      read_iterator_state(d)};
  }
  if (model && generators_of(*model) != nullptr && group.exists("rng/replica_state")) {
    const Shape shape = group.dataset_shape("rng/replica_state");  // [R, 4] (validated)
    const std::vector<uint64_t> values = group.read_u64("rng/replica_state");
    std::vector<std::array<uint64_t, 4>> rows(static_cast<size_t>(shape[0]));
    for (size_t i = 0; i < rows.size(); ++i)
      for (size_t k = 0; k < 4; ++k) rows[i][k] = values[i * 4 + k];
    // A row per replica of the job, on stream 1 + its global id: each of this process's
    // replicas takes the row of its own stream (so a job of another shape still gives every
    // replica its own stream); a replica without one starts its stream fresh.
    const std::shared_ptr<WorkerGroup> workers = worker_group();
    const int num_workers = workers ? workers->num_workers() : 1;
    if (static_cast<int>(rows.size()) != num_workers * num_replicas)
      TANDEM_LOG_INFO(path, ": dropout streams saved for ", rows.size(), " replicas, restoring ",
                      "into ", num_workers * num_replicas,
                      "; replicas without a saved stream start fresh");
    const uint64_t seed = rows.empty() ? 0 : rows[0][0];
    std::vector<std::array<uint64_t, 4>> mine;
    for (int r = 0; r < num_replicas; ++r) {
      const uint64_t stream = static_cast<uint64_t>(process_replica_offset()) + r + 1;
      std::array<uint64_t, 4> row = {seed, stream, 0, 0};
      for (const std::array<uint64_t, 4>& saved : rows)
        if (saved[1] == stream) row = saved;
      mine.push_back(row);
    }
    rows = std::move(mine);
    out.rng = std::move(rows);
  }
  for (const auto& [name, metric] : tracked<metrics::Metric>(entries)) {
    if (!group.exists("metrics/" + name)) {
      TANDEM_LOG_WARNING(path, ": metric \"", name, "\" is not in the checkpoint; it keeps its ",
                         "state");
      continue;
    }
    out.metrics[name] = read_metric_state(group.open_group("metrics/" + name), *metric, path);
  }
}

/// Creates the optimizer's slots for the model (mirrored like the model's variables) when a
/// restore needs them before the first update has created them.
void ensure_slots(optim::Optimizer& optimizer, const nn::Module* model,
                  const std::vector<std::pair<std::string, Tensor>>& slots) {
  std::set<std::string> existing;
  for (const auto& [name, slot] : optimizer.slot_variables()) existing.insert(name);
  bool missing = false;
  for (const auto& [name, value] : slots) missing = missing || !existing.contains(name);
  if (!missing || model == nullptr) return;
  const std::vector<Variable> variables = model->trainable_variables();
  optimizer.build(variables);
  // Outside strategy.scope() build() makes single-copy slots; give each slot as many copies
  // as its variable has, on the same devices, so that every replica finds its own.
  for (const Variable& v : variables) {
    for (const std::string& kind : optimizer.slot_names()) {
      // A sharded slot has one copy, on its owner's device (none on another worker's).
      if (optimizer.owner_of(v) >= 0) continue;
      const Variable slot = optimizer.slot(v, kind);
      if (slot.num_copies() == v.num_copies()) continue;
      std::vector<Tensor> copies;
      for (int r = 0; r < v.num_copies(); ++r) copies.push_back(Tensor::zeros_like(v.copy(r)));
      slot.set_copies(std::move(copies));
    }
  }
}

/// Continues a gradient accumulation saved mid-way: the chief's replica (copy 0; of worker 0
/// in a multi-worker job) takes each summed accumulator and the other replicas start from zero,
/// which all-reduces to the same sum. A checkpoint taken at an update boundary zeroes every
/// accumulator.
void restore_accumulation(optim::Optimizer& optimizer, const nn::Module* model,
                          const Loaded& loaded) {
  if (optimizer.gradient_accumulation_steps() == 1) return;
  std::unordered_map<std::string, Variable> model_variables;
  if (model) {
    const std::vector<Variable> variables = model->trainable_variables();
    if (!loaded.accumulators.empty()) optimizer.build(variables);
    for (const Variable& v : variables) model_variables.emplace(v.name(), v);
  }
  std::unordered_map<std::string, Variable> accumulators;
  for (const auto& [name, accumulator] : optimizer.accumulator_variables()) {
    // Outside strategy.scope() build() makes single-copy accumulators; give each as many
    // copies as its variable has, so that every replica finds its own.
    const auto variable = model_variables.find(name);
    if (variable != model_variables.end() &&
        accumulator.num_copies() != variable->second.num_copies()) {
      std::vector<Tensor> copies;
      for (int r = 0; r < variable->second.num_copies(); ++r)
        copies.push_back(Tensor::zeros_like(variable->second.copy(r)));
      accumulator.set_copies(std::move(copies));
    }
    accumulators.emplace(name, accumulator);
  }
  for (const auto& [name, accumulator] : accumulators)
    for (int r = 0; r < accumulator.num_copies(); ++r) {
      Tensor copy = accumulator.copy(r);
      copy.fill_(0.0);
    }
  for (const auto& [name, value] : loaded.accumulators) {
    const auto it = accumulators.find(name);
    TANDEM_CHECK(it != accumulators.end(), loaded.path, ": the accumulator of variable \"", name,
                 "\" could not be created (is the model tracked by the checkpoint?)");
    // In a multi-worker job only the chief's replica 0 takes the sum (of every worker).
    const std::shared_ptr<WorkerGroup> workers = worker_group();
    if (workers && workers->worker_index() != 0) continue;
    Tensor chief = it->second.copy(0);
    chief.copy_from(value);
  }
  optimizer.set_micro_step(loaded.micro_step);
}

}  // namespace

void Checkpoint::restore(const std::string& path) const {
  TANDEM_CHECK(current_replica_binding().num_replicas <= 1, "Checkpoint::restore(", path,
               "): called inside strategy.run; restore from the main thread, outside run");
  const nn::Module* model = tracked_one<nn::Module>(entries_);
  optim::Optimizer* optimizer = tracked_optimizer(entries_);
  const int replicas = num_replicas();

  // 1. Read and check everything.
  Loaded loaded;
  loaded.path = path;
  {
    h5::File file = detail::open_checkpoint(path);
    const h5::Group& root = file.root();
    detail::validate_checkpoint(root, path, [&] {
      return model ? first_model_difference(root.open_group(kModelWeights), layers_of(*model))
                   : std::string();
    });
    if (!root.has_attr("tandem_checksums"))
      TANDEM_LOG_WARNING(path,
                         ": written before checkpoints carried checksums (no checksums); its ",
                         "data is restored unverified");
    if (optimizer && !root.exists(kOptimizerWeights))
      mismatch(path, "the checkpoint holds no optimizer state (no /" +
                         std::string(kOptimizerWeights) + ") but this run tracks optimizer \"" +
                         optimizer->name() + "\"");
    if (model) load_model(root, *model, loaded);
    if (optimizer) load_optimizer(root, *optimizer, model, loaded);
    load_training_state(root, entries_, model, replicas, loaded);
    loaded.user = detail::load_user_state(root.open_group(kTrainingState), entries_, path);
  }

  // 2. Apply. The chief (this thread) read the file; every replica's copy gets the same bits.
  // Plain iterators go first: their restore is the only step that can still refuse.
  for (const auto& [name, iterator] : tracked<data::Iterator>(entries_)) {
    const auto it = loaded.data.find(name);
    if (it == loaded.data.end()) continue;
    try {
      iterator->restore(it->second.state);
    } catch (const std::exception& e) {
      mismatch(path,
               "the saved position of iterator \"" + name + "\" does not fit it: " + e.what());
    }
  }
  for (const auto& [variable, value] : loaded.model_values) assign_all_copies(variable, value);
  if (loaded.loss_scale)
    tracked_loss_scale(entries_)->set_state(loaded.loss_scale->first, loaded.loss_scale->second);
  if (model && loaded.rng) {
    if (nn::ReplicaGenerators* generators = generators_of(*model))
      generators->set_states(*loaded.rng);
  }
  if (optimizer) {
    ensure_slots(*optimizer, model, loaded.slots);
    // Each slot by name, with its variable's shape (a sharded slot's parts are set where they
    // are held: each worker, each replica keeps its own).
    std::map<std::string, Shape> shapes;
    std::map<std::string, DType> dtypes;
    for (const optim::Optimizer::SlotPlacement& p : optimizer->slot_placements()) {
      shapes.emplace(p.name, p.variable.copy(0).shape());
      dtypes.emplace(p.name, p.variable.copy(0).dtype());
    }
    std::set<std::string> restored;
    for (const auto& [name, value] : loaded.slots) {
      TANDEM_CHECK(optimizer->load_slot(name, value), path, ": optimizer slot \"", name,
                   "\" could not be created (is the model tracked by the checkpoint?)");
      restored.insert(name);
    }
    // Slots the file does not have start from zero, as they would have at that step.
    for (const auto& [name, shape] : shapes) {
      if (restored.contains(name)) continue;
      if (loaded.iteration > 0)
        TANDEM_LOG_WARNING(path, ": optimizer slot \"", name, "\" is not in the checkpoint; it ",
                           "restarts from zero");
      optimizer->load_slot(name, Tensor::zeros(shape, dtypes.at(name)));
    }
    optimizer->set_iterations(loaded.iteration);
    restore_accumulation(*optimizer, model, loaded);
  }
  for (const auto& [name, counter] : tracked<int64_t>(entries_)) {
    const auto it = loaded.counters.find(name);
    if (it != loaded.counters.end()) *counter = it->second;
  }
  detail::apply_user_state(loaded.user, entries_);
  for (const auto& [name, metric] : tracked<metrics::Metric>(entries_)) {
    const auto it = loaded.metrics.find(name);
    if (it != loaded.metrics.end()) metric->set_combined_state(it->second);
  }
  for (const auto& [name, dataset] : tracked<data::DistributedDataset>(entries_)) {
    const auto it = loaded.data.find(name);
    if (it == loaded.data.end()) continue;
    const LoadedData& saved = it->second;
    if (saved.num_replicas != dataset->num_replicas())
      TANDEM_LOG_INFO(path, ": data \"", name, "\" was saved with ", saved.num_replicas,
                      " replicas and is restored into ", dataset->num_replicas());
    try {
      dataset->restore(saved.state);
    } catch (const std::exception& e) {
      TANDEM_LOG_WARNING(path, ": the saved position of data \"", name, "\" cannot be used (",
                         e.what(), "); it restarts at the beginning of epoch ", saved.epoch);
      dataset->set_epoch(static_cast<uint64_t>(saved.epoch));
    }
  }
}

}  // namespace tandem
