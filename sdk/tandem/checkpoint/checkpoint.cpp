// Checkpoint: writes the tracked objects in the layout of CHECKPOINT_FORMAT.md (version 1) and
// restores them: everything is read and checked into memory first, then applied, so a failed
// restore changes nothing.
#include "tandem/checkpoint/checkpoint.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <unordered_map>

#include "tandem/checkpoint/internal/file_io.h"
#include "tandem/checkpoint/internal/gather.h"
#include "tandem/checkpoint/hdf5_file.h"
#include "tandem/checkpoint/inspect.h"
#include "tandem/core/build_info.h"
#include "tandem/core/logging.h"
#include "tandem/data/dataset.h"
#include "tandem/data/distributed_dataset.h"
#include "tandem/metrics/metrics.h"
#include "tandem/nn/layers.h"
#include "tandem/nn/sequential.h"
#include "tandem/ops/ops.h"
#include "tandem/optim/optimizer.h"

namespace tandem {

namespace {

// ---- names of the layout (CHECKPOINT_FORMAT.md) ----------------------------------------------

constexpr const char* kFormatName = "tandem.checkpoint";
constexpr const char* kModelWeights = "model_weights";
constexpr const char* kOptimizerWeights = "optimizer_weights";
constexpr const char* kTrainingState = "training_state";
constexpr const char* kIterationName = "iteration:0";
constexpr const char* kRngAlgorithm = "philox4x32-10";
/// The root attribute tandem_checksums of files whose datasets carry checksums.
constexpr const char* kChecksums = "fletcher32";
/// Counters (steps, epochs, iterations, samples) are at most 2^53: every such count is exact in
/// a float64 (learning-rate schedules and logs take it as one), and no run gets near it.
constexpr int64_t kMaxCounter = int64_t{1} << 53;
/// The Keras version /model_weights claims: its legacy-h5 loaders accept this layout.
constexpr const char* kKerasVersion = "2.15.0";
/// The standard int64 scalars of /training_state.
constexpr std::array<const char*, 4> kStandardCounters = {"global_step", "epoch", "step_in_epoch",
                                                          "samples_seen"};

bool is_standard_counter(const std::string& name) {
  for (const char* standard : kStandardCounters)
    if (name == standard) return true;
  return false;
}

// ---- the tracked objects -------------------------------------------------------------------

template <typename T>
std::vector<std::pair<std::string, T*>> tracked(const std::vector<Checkpoint::Entry>& entries) {
  std::vector<std::pair<std::string, T*>> out;
  for (const Checkpoint::Entry& e : entries)
    if (T* const* p = std::get_if<T*>(&e.object.pointer())) out.emplace_back(e.name, *p);
  return out;
}

template <typename T>
T* tracked_one(const std::vector<Checkpoint::Entry>& entries) {
  auto all = tracked<T>(entries);
  return all.empty() ? nullptr : all.front().second;
}

int64_t* tracked_counter(const std::vector<Checkpoint::Entry>& entries, const std::string& name) {
  for (const auto& [counter_name, counter] : tracked<int64_t>(entries))
    if (counter_name == name) return counter;
  return nullptr;
}

/// One layer of the model as Keras stores it: its name and its variables in Keras order.
struct LayerWeights {
  std::string name;
  std::vector<Variable> weights;
};

/// The model's layers in Keras' layout: a Sequential's layers (a nested Sequential is one
/// layer holding all of its variables, as in Keras), or the module itself when it has none.
std::vector<LayerWeights> layers_of(const nn::Module& model) {
  TANDEM_CHECK(model.built(), "checkpoint: model \"", model.name(),
               "\" is not built; call model.build(input_shape) (or run it once) before saving ",
               "or restoring it");
  std::vector<nn::Module> children = model.children();
  if (children.empty()) children.push_back(model);
  std::vector<LayerWeights> layers;
  for (const nn::Module& child : children) layers.push_back({child.name(), child.weights()});
  return layers;
}

/// The dropout streams of the model: a Sequential's, or a standalone Dropout's.
nn::ReplicaGenerators* generators_of(const nn::Module& model) {
  if (auto s = std::dynamic_pointer_cast<nn::SequentialImpl>(model.ptr())) return &s->generators();
  if (auto d = std::dynamic_pointer_cast<nn::DropoutImpl>(model.ptr())) return &d->generators();
  return nullptr;
}

std::string keras_name(const std::string& variable_name) { return variable_name + ":0"; }

std::string strip_keras_suffix(const std::string& name) {
  return name.size() > 2 && name.ends_with(":0") ? name.substr(0, name.size() - 2) : name;
}

/// FNV-1a, 64 bits: a stable hash (std::hash may differ between builds).
uint64_t fnv1a(const std::string& text) {
  uint64_t hash = 0xcbf29ce484222325ULL;
  for (unsigned char c : text) {
    hash ^= c;
    hash *= 0x100000001b3ULL;
  }
  return hash;
}

std::string hex64(uint64_t value) {
  static const char* digits = "0123456789abcdef";
  std::string out(16, '0');
  for (int i = 15; i >= 0; --i, value >>= 4) out[static_cast<size_t>(i)] = digits[value & 15];
  return out;
}

std::string signature_of(const std::vector<LayerWeights>& layers) {
  std::string text;
  for (const LayerWeights& layer : layers) {
    text += "layer " + layer.name + "\n";
    for (const Variable& v : layer.weights)
      text += detail::str_cat("  ", v.name(), " ", v.shape(), " ", v.dtype(), "\n");
  }
  return hex64(fnv1a(text));
}

/// Writes `value` into every replica's copy of `variable`, so that all replicas hold the same
/// bits (the restore-side "broadcast" of a mirrored variable).
void assign_all_copies(const Variable& variable, const Tensor& value) {
  for (int r = 0; r < variable.num_copies(); ++r) {
    Tensor copy = variable.copy(r);
    copy.copy_from(value);
  }
}

Tensor int64_scalar(int64_t value) {
  return Tensor::from_vector(std::vector<int64_t>{value}, Shape(std::vector<int64_t>{}));
}

Tensor float64_scalar(double value) {
  return Tensor::from_vector(std::vector<double>{value}, Shape(std::vector<int64_t>{}));
}

std::string utc_now() {
  const std::time_t now = std::time(nullptr);
  std::tm parts{};
  gmtime_r(&now, &parts);
  char text[32];
  std::strftime(text, sizeof(text), "%Y-%m-%dT%H:%M:%SZ", &parts);
  return text;
}

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
  std::map<std::string, int64_t> counters;                   // tracked counter name -> value
  std::map<std::string, LoadedData> data;                    // tracked name -> state
  std::map<std::string, metrics::MetricState> metrics;
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

// ---- what restored values may be -----------------------------------------------------------

/// "<file>:/<group>/<name>": where a value was read, for error messages.
std::string location(const h5::Group& group, const std::string& name) {
  return group.file() + ":" + (group.path() == "/" ? "" : group.path()) + "/" + name;
}

/// Raises naming `where` unless every element of `value` is finite (and >= 0 when
/// `non_negative`): weights, slots and accumulators of a run that trained are never NaN/Inf,
/// and a second moment is a mean of squares.
void check_values(const std::string& where, const Tensor& value, bool non_negative,
                  const char* why_non_negative = "") {
  if (value.dtype() != DType::kFloat32 && value.dtype() != DType::kFloat64) return;
  const std::vector<double> values = value.to_vector<double>();
  for (size_t i = 0; i < values.size(); ++i) {
    TANDEM_CHECK(std::isfinite(values[i]), where, ": value ", values[i], " at index ", i,
                 " is not finite; the checkpoint is damaged");
    TANDEM_CHECK(!non_negative || values[i] >= 0, where, ": value ", values[i], " at index ", i,
                 " is negative; ", why_non_negative);
  }
}

/// Raises naming `where` unless 0 <= value <= kMaxCounter.
void check_counter(const std::string& where, int64_t value) {
  TANDEM_CHECK(value >= 0 && value <= kMaxCounter, where, " is ", value,
               ", outside [0, 2^53]; the checkpoint is damaged");
}

/// The model_signature recomputed from the file's own /model_weights (as signature_of does for
/// a model); "" when the layout cannot be followed.
std::string signature_of_file(const h5::Group& weights) {
  if (!weights.has_attr("layer_names")) return "";
  std::string text;
  for (const std::string& layer : weights.read_attr_strings("layer_names")) {
    text += "layer " + layer + "\n";
    if (!weights.exists(layer)) return "";
    const h5::Group group = weights.open_group(layer);
    if (!group.has_attr("weight_names")) continue;
    for (const std::string& name : group.read_attr_strings("weight_names")) {
      if (!group.exists(name)) return "";
      text += detail::str_cat("  ", strip_keras_suffix(name), " ", group.dataset_shape(name), " ",
                              group.dataset_dtype(name), "\n");
    }
  }
  return hex64(fnv1a(text));
}

/// A file whose model_signature does not describe its own /model_weights was changed after it
/// was written (a flipped bit in a shape): damaged, not "another model".
/// `difference`: what differs from the model restoring it, when there is one (names the
/// variable and both shapes).
void check_own_signature(const h5::Group& root, const std::string& path,
                         const std::string& difference = "") {
  if (!root.has_attr("model_signature") || !root.exists(kModelWeights)) return;
  const std::string stored = root.read_attr_string("model_signature");
  if (stored.empty()) return;
  const std::string own = signature_of_file(root.open_group(kModelWeights));
  TANDEM_CHECK(own == stored, path, ": damaged: its /model_weights (signature ",
               own.empty() ? std::string("unreadable") : own,
               ") does not match its own model_signature attribute ", stored,
               "; a shape, name or dtype was changed after it was written",
               difference.empty() ? std::string() : " (" + difference + ")");
}

[[noreturn]] void mismatch(const std::string& path, const std::string& what) {
  throw CheckpointMismatchError(path + ": " + what);
}

void require_group(const h5::Group& root, const std::string& name, const std::string& path) {
  TANDEM_CHECK(root.exists(name), path, ": incomplete checkpoint: the group /", name,
               " is missing");
}

}  // namespace

// ---- Trackable and Checkpoint --------------------------------------------------------------

std::string_view Trackable::kind() const {
  static constexpr std::array<std::string_view, 6> kNames = {
      "model", "optimizer", "distributed dataset", "dataset iterator", "metric", "counter"};
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
  entries_.push_back({std::move(name), object});
}

int64_t Checkpoint::global_step() const {
  if (const int64_t* counter = tracked_counter(entries_, "global_step")) return *counter;
  if (const optim::Optimizer* optimizer = tracked_one<optim::Optimizer>(entries_))
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
  if (const optim::Optimizer* optimizer = tracked_one<optim::Optimizer>(entries_))
    return optimizer->iterations_variable().num_copies();
  if (const data::DistributedDataset* d = tracked_one<data::DistributedDataset>(entries_))
    return static_cast<int>(d->num_replicas());
  return 1;
}

std::string Checkpoint::model_signature() const {
  const nn::Module* model = tracked_one<nn::Module>(entries_);
  return model ? signature_of(layers_of(*model)) : std::string();
}

// ---- write ---------------------------------------------------------------------------------

namespace {

void write_model(const h5::Group& root, const nn::Module* model) {
  const h5::Group group = root.create_group(kModelWeights);
  std::vector<std::string> layer_names;
  const std::vector<LayerWeights> layers = model ? layers_of(*model) : std::vector<LayerWeights>{};
  for (const LayerWeights& layer : layers) layer_names.push_back(layer.name);
  // Keras' legacy h5 layout: load_weights finds no layer_names at the root, descends into
  // /model_weights, and matches the layers that have weights by order.
  group.write_attr("layer_names", layer_names);
  group.write_attr("backend", std::string("tensorflow"));
  group.write_attr("keras_version", std::string(kKerasVersion));
  for (const LayerWeights& layer : layers) {
    const h5::Group layer_group = group.create_group(layer.name);
    std::vector<std::string> weight_names;
    for (const Variable& v : layer.weights) {
      weight_names.push_back(keras_name(v.name()));
      // Replica 0's copy: after every synchronised update all copies hold the same bits.
      layer_group.write_tensor(keras_name(v.name()), v.copy(0));
    }
    layer_group.write_attr("weight_names", weight_names);
  }
}

void write_optimizer(const h5::Group& root, const optim::Optimizer& optimizer) {
  const h5::Group group = root.create_group(kOptimizerWeights);
  std::vector<std::string> weight_names = {kIterationName};
  group.write_tensor(kIterationName, int64_scalar(optimizer.iterations()));
  for (const auto& [name, slot] : optimizer.slot_variables()) {
    weight_names.push_back(keras_name(name));
    group.write_tensor(keras_name(name), slot.copy(0));
  }
  group.write_attr("optimizer", optimizer.name());
  group.write_attr("config_json", optimizer.config_json());
  group.write_attr("weight_names", weight_names);
}

void write_iterator_state(const h5::Group& group, const data::IteratorState& state) {
  std::vector<std::string> names;
  for (const auto& [name, values] : state.entries()) {
    names.push_back(name);
    group.write_tensor(name,
                       Tensor::from_vector(values, Shape({static_cast<int64_t>(values.size())})));
  }
  // HDF5 lists links by name; the entry order of the state is kept here.
  group.write_attr("entry_names", names);
}

void write_training_state(const h5::Group& root, const std::vector<Checkpoint::Entry>& entries,
                          int64_t global_step, const detail::GatheredState& gathered) {
  const h5::Group group = root.create_group(kTrainingState);
  const data::DistributedDataset* first_data = tracked_one<data::DistributedDataset>(entries);
  std::map<std::string, int64_t> standard = {
      {"global_step", global_step},
      {"epoch", first_data ? static_cast<int64_t>(first_data->epoch()) : 0},
      {"step_in_epoch", 0},
      {"samples_seen", 0}};
  for (const auto& [name, counter] : tracked<int64_t>(entries)) {
    if (is_standard_counter(name))
      standard[name] = *counter;
    else
      group.write_tensor("counters/" + name, int64_scalar(*counter));
  }
  for (const char* name : kStandardCounters) group.write_tensor(name, int64_scalar(standard[name]));

  for (const auto& [name, dataset] : tracked<data::DistributedDataset>(entries)) {
    const h5::Group d = group.require_group("data/" + name);
    d.write_attr("kind", std::string("distributed_dataset"));
    d.write_attr("num_replicas", dataset->num_replicas());
    d.write_attr("epoch", static_cast<int64_t>(dataset->epoch()));
    write_iterator_state(d, dataset->save());
  }
  for (const auto& [name, iterator] : tracked<data::Iterator>(entries)) {
    const h5::Group d = group.require_group("data/" + name);
    d.write_attr("kind", std::string("iterator"));
    d.write_attr("epoch", static_cast<int64_t>(iterator->epoch()));
    write_iterator_state(d, iterator->save());
  }

  if (!gathered.rng_rows.empty()) {
    std::vector<uint64_t> rows;
    for (const std::array<uint64_t, 4>& row : gathered.rng_rows)
      rows.insert(rows.end(), row.begin(), row.end());
    group.write_u64("rng/replica_state", rows,
                    Shape({static_cast<int64_t>(gathered.rng_rows.size()), 4}));
    group.write_attr_of("rng/replica_state", "algorithm", kRngAlgorithm);
  }

  for (const auto& [name, metric] : tracked<metrics::Metric>(entries)) {
    // The per-replica (and per-worker) partial sums were gathered: the stored state is their SUM.
    const metrics::MetricState state = gathered.metrics.at(name);
    const h5::Group m = group.require_group("metrics/" + name);
    m.write_tensor("total", float64_scalar(state.total));
    m.write_tensor("count", float64_scalar(state.count));
    m.write_attr("metric_name", metric->name());
  }

  // Gradient accumulation: micro_step (0 at an update boundary) and, in the middle of an
  // accumulation, each variable's accumulator as the SUM over replicas of the replica-local
  // copies (only that sum is ever all-reduced, so a restore may put it on one replica).
  const h5::Group accumulation = group.require_group("grad_accum");
  const optim::Optimizer* optimizer = tracked_one<optim::Optimizer>(entries);
  const int64_t micro_step = optimizer ? optimizer->micro_step() : 0;
  accumulation.write_tensor("micro_step", int64_scalar(micro_step));
  accumulation.write_attr(
      "gradient_accumulation_steps",
      static_cast<int64_t>(optimizer ? optimizer->gradient_accumulation_steps() : 1));
  if (micro_step > 0)
    for (const auto& [name, sum] : gathered.accumulators)
      accumulation.write_tensor(keras_name(name), sum);
}

/// This process's part of the per-replica state: metric partials summed over its replicas,
/// accumulators summed over its replicas (mid-accumulation only), one dropout-stream row per
/// replica.
detail::GatheredState local_state(const std::vector<Checkpoint::Entry>& entries, int num_replicas) {
  detail::GatheredState out;
  out.num_replicas = num_replicas;
  if (const nn::Module* model = tracked_one<nn::Module>(entries)) {
    if (const nn::ReplicaGenerators* generators = generators_of(*model)) {
      // One row per replica {seed, stream, offset, 0}; a replica that never drew has its
      // fresh stream (seed, 1 + global replica id, 0), exactly what it would be created with.
      const std::vector<std::array<uint64_t, 4>> states = generators->states();
      for (int r = 0; r < num_replicas; ++r)
        out.rng_rows.push_back(
            r < static_cast<int>(states.size())
                ? states[static_cast<size_t>(r)]
                : std::array<uint64_t, 4>{generators->seed(),
                                          static_cast<uint64_t>(process_replica_offset()) + r + 1,
                                          0, 0});
    }
  }
  for (const auto& [name, metric] : tracked<metrics::Metric>(entries))
    out.metrics[name] = metric->local_state();
  const optim::Optimizer* optimizer = tracked_one<optim::Optimizer>(entries);
  if (optimizer && optimizer->micro_step() > 0) {
    for (const auto& [name, accumulator] : optimizer->accumulator_variables()) {
      Tensor sum = accumulator.copy(0).to(Device::cpu());
      for (int r = 1; r < accumulator.num_copies(); ++r)
        sum = ops::add(sum, accumulator.copy(r).to(Device::cpu()));
      out.accumulators.emplace_back(name, sum);
    }
  }
  return out;
}

// A GatheredState as bytes, for the all-gather across workers: counts, then metrics (total,
// count), dropout rows, and accumulators (float32 values) in tracked order, which every worker
// shares (they run the same program).
void put(std::vector<char>& out, const void* data, size_t bytes) {
  const size_t at = out.size();
  out.resize(at + bytes);
  if (bytes > 0) std::memcpy(out.data() + at, data, bytes);
}

std::vector<char> to_bytes(const detail::GatheredState& state,
                           const std::vector<Checkpoint::Entry>& entries) {
  std::vector<char> out;
  const int64_t header[4] = {state.num_replicas, static_cast<int64_t>(state.metrics.size()),
                             static_cast<int64_t>(state.rng_rows.size()),
                             static_cast<int64_t>(state.accumulators.size())};
  put(out, header, sizeof(header));
  for (const auto& [name, metric] : tracked<metrics::Metric>(entries)) {
    const metrics::MetricState m = state.metrics.at(name);
    const double values[2] = {m.total, m.count};
    put(out, values, sizeof(values));
  }
  for (const std::array<uint64_t, 4>& row : state.rng_rows) put(out, row.data(), sizeof(row));
  for (const auto& [name, sum] : state.accumulators) {
    TANDEM_CHECK(sum.dtype() == DType::kFloat32, "checkpoint: the accumulator of \"", name,
                 "\" is ", sum.dtype(), "; float32 expected");
    const int64_t numel = sum.numel();
    put(out, &numel, sizeof(numel));
    put(out, sum.raw_data(), sum.nbytes());
  }
  return out;
}

/// Adds worker `worker`'s bytes into `total` (metrics and accumulators summed, rows appended).
void add_bytes(detail::GatheredState& total, const std::vector<char>& bytes, int worker,
               const std::vector<Checkpoint::Entry>& entries) {
  size_t at = 0;
  auto take = [&](void* dst, size_t n) {
    TANDEM_CHECK(at + n <= bytes.size(), "checkpoint: worker ", worker, " sent a truncated state (",
                 bytes.size(), " bytes)");
    if (n > 0) std::memcpy(dst, bytes.data() + at, n);
    at += n;
  };
  int64_t header[4] = {};
  take(header, sizeof(header));
  TANDEM_CHECK(header[1] == static_cast<int64_t>(total.metrics.size()) &&
                   header[3] == static_cast<int64_t>(total.accumulators.size()),
               "checkpoint: worker ", worker, " tracks ", header[1], " metrics and ", header[3],
               " accumulators, the chief ", total.metrics.size(), " and ",
               total.accumulators.size(), "; every worker must save the same objects");
  for (const auto& [name, metric] : tracked<metrics::Metric>(entries)) {
    double values[2] = {};
    take(values, sizeof(values));
    // A metric of the job adds every worker's partials; one made before the strategy is this
    // process's own, and the chief's value is the one stored.
    if (metric->num_workers() > 1 || worker == 0) {
      total.metrics[name].total += values[0];
      total.metrics[name].count += values[1];
    }
  }
  for (int64_t r = 0; r < header[2]; ++r) {
    std::array<uint64_t, 4> row{};
    take(row.data(), sizeof(row));
    total.rng_rows.push_back(row);
  }
  for (auto& [name, sum] : total.accumulators) {
    int64_t numel = 0;
    take(&numel, sizeof(numel));
    TANDEM_CHECK(numel == sum.numel(), "checkpoint: worker ", worker, "'s accumulator of \"", name,
                 "\" has ", numel, " values, the chief's ", sum.numel());
    Tensor theirs = Tensor::empty(sum.shape(), DType::kFloat32);
    take(theirs.raw_data(), theirs.nbytes());
    sum = ops::add(sum, theirs);
  }
  TANDEM_CHECK(at == bytes.size(), "checkpoint: worker ", worker, " sent ", bytes.size() - at,
               " bytes more than the chief's objects account for; every worker must save the "
               "same objects");
  total.num_replicas += header[0];
}

}  // namespace

namespace detail {

GatheredState gather_state(const Checkpoint& checkpoint, WorkerGroup* workers) {
  GatheredState mine = local_state(checkpoint.entries(), checkpoint.num_replicas());
  if (workers == nullptr || workers->num_workers() == 1) return mine;
  const std::vector<std::vector<char>> all = workers->all_gather(
      to_bytes(mine, checkpoint.entries()), "checkpoint save (every worker saves together)");
  // Every worker's part, in worker (so global replica) order.
  GatheredState total;
  total.num_workers = workers->num_workers();
  total.num_replicas = 0;
  for (const auto& [name, state] : mine.metrics) total.metrics[name] = {};
  for (const auto& [name, sum] : mine.accumulators)
    total.accumulators.emplace_back(name, Tensor::zeros_like(sum));
  for (int w = 0; w < workers->num_workers(); ++w)
    add_bytes(total, all[static_cast<size_t>(w)], w, checkpoint.entries());
  return total;
}

void write_gathered(const Checkpoint& checkpoint, const std::string& path,
                    const GatheredState& gathered) {
  const std::vector<Checkpoint::Entry>& entries_ = checkpoint.entries();
  const nn::Module* model = tracked_one<nn::Module>(entries_);
  const optim::Optimizer* optimizer = tracked_one<optim::Optimizer>(entries_);
  const std::string temp = detail::temp_path_for(path);
  try {
    h5::File file = h5::File::create(temp);  // exclusive create: never reuses a stranger's file
    detail::checkpoint_save_point("temp_created");
    const h5::Group& root = file.root();
    root.write_attr("tandem_format", std::string(kFormatName));
    root.write_attr("tandem_format_version", kCheckpointFormatVersion);
    root.write_attr("tandem_version", build_info().version);
    root.write_attr("created_utc", utc_now());
    root.write_attr("num_workers", static_cast<int64_t>(gathered.num_workers));
    root.write_attr("num_replicas", gathered.num_replicas);
    std::string backend = "cpu";
    if (model) {
      const std::vector<Variable> weights = model->weights();
      if (!weights.empty() && weights.front().copy(0).device().is_cuda()) backend = "cuda";
    }
    root.write_attr("backend", backend);
    root.write_attr("model_signature", checkpoint.model_signature());
    // Every dataset with data carries Fletcher-32, scalars sit in checksummed object headers
    // (hdf5_file.h); readers note files without this attribute (written before checksums).
    root.write_attr("tandem_checksums", std::string(kChecksums));

    write_model(root, model);
    detail::checkpoint_save_point("model_weights");
    if (optimizer) write_optimizer(root, *optimizer);
    detail::checkpoint_save_point("optimizer_weights");
    write_training_state(root, entries_, checkpoint.global_step(), gathered);
    detail::checkpoint_save_point("training_state");
    file.close();
    detail::checkpoint_save_point("temp_closed");
    // The bytes must reach the disk before the rename makes them the checkpoint: otherwise a
    // power loss could leave `path` naming a file whose blocks were never written.
    detail::fsync_file(temp);
    detail::checkpoint_save_point("temp_synced");
    detail::rename_file(temp, path);
    // The rename is a change to the directory: fsync it so that the new name is durable.
    detail::fsync_directory(std::filesystem::path(path).parent_path().string());
    detail::checkpoint_save_point("renamed");
  } catch (...) {
    std::error_code ignored;
    std::filesystem::remove(temp, ignored);
    throw;
  }
}

}  // namespace detail

void Checkpoint::write(const std::string& path) const {
  detail::write_gathered(*this, path, detail::gather_state(*this, nullptr));
}

// ---- restore -------------------------------------------------------------------------------

namespace {

/// Checks what any saved pipeline state must satisfy (the data layer checks the rest when it
/// restores, where a misfit only resets the position): a shuffle buffer ("<depth>_shuffle/
/// buffer") holds distinct elements, each drawn once from its input (source indices, or
/// sequence numbers), so it is part of a permutation; a run of zeros would replay example #0.
/// Only a repeat() in the pipeline can legitimately draw an index twice (across passes).
void check_iterator_state(const h5::Group& group, const data::IteratorState::Entries& entries) {
  bool repeats = false;
  for (const auto& [name, values] : entries)
    repeats = repeats || name.find("_repeat/") != std::string::npos;
  for (const auto& [name, values] : entries) {
    if (!name.ends_with("_shuffle/buffer")) continue;
    std::vector<int64_t> sorted = values;
    std::sort(sorted.begin(), sorted.end());
    for (size_t i = 0; i < sorted.size(); ++i) {
      TANDEM_CHECK(sorted[i] >= 0, location(group, name), ": holds ", sorted[i],
                   "; a shuffle buffer holds element numbers >= 0");
      TANDEM_CHECK(repeats || i == 0 || sorted[i] != sorted[i - 1], location(group, name),
                   ": index ", sorted[i], " appears twice in a shuffle buffer of ", sorted.size(),
                   " entries; it must hold distinct elements (a permutation), the checkpoint is ",
                   "damaged");
    }
  }
}

data::IteratorState read_iterator_state(const h5::Group& group) {
  data::IteratorState::Entries entries;
  for (const std::string& name : group.read_attr_strings("entry_names"))
    entries.emplace_back(name, group.read_tensor(name).to_vector<int64_t>());
  check_iterator_state(group, entries);
  return data::IteratorState(std::move(entries));
}

int64_t read_int64_scalar(const h5::Group& group, const std::string& name) {
  return group.read_scalar_int64(name);
}

void load_model(const h5::Group& root, const nn::Module& model, Loaded& out) {
  const std::string& path = out.path;
  const h5::Group weights = root.open_group(kModelWeights);
  const std::vector<LayerWeights> layers = layers_of(model);
  const std::string expected = signature_of(layers);
  check_own_signature(root, path, first_model_difference(weights, layers));
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
      check_values(location(weights, name), value, /*non_negative=*/false);
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
  out.iteration = read_int64_scalar(group, kIterationName);
  check_counter(location(group, kIterationName), out.iteration);
  // The slots this optimizer has or will create for the model's trainable variables, by name,
  // with the shape each must have.
  std::unordered_map<std::string, Shape> expected;
  for (const auto& [name, slot] : optimizer.slot_variables()) expected[name] = slot.shape();
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
    // "v" is the second moment of Adam and AdamW: an average of squared gradients.
    check_values(location(group, keras), value, /*non_negative=*/name.starts_with("v/"),
                 "the second moment v is an average of squares");
    out.slots.emplace_back(name, std::move(value));
  }
}

void load_training_state(const h5::Group& root, const std::vector<Checkpoint::Entry>& entries,
                         const nn::Module* model, int num_replicas, Loaded& out) {
  const std::string& path = out.path;
  const h5::Group group = root.open_group(kTrainingState);
  if (group.exists("grad_accum/micro_step")) {
    const h5::Group accumulation = group.open_group("grad_accum");
    out.micro_step = read_int64_scalar(accumulation, "micro_step");
    const int64_t saved_steps = accumulation.has_attr("gradient_accumulation_steps")
                                    ? accumulation.read_attr_int64("gradient_accumulation_steps")
                                    : 1;
    if (out.micro_step < 0 || (out.micro_step > 0 && out.micro_step >= saved_steps))
      mismatch(path,
               detail::str_cat("/training_state/grad_accum/micro_step is ", out.micro_step,
                               ", outside [0, gradient_accumulation_steps = ", saved_steps, ")"));
    if (out.micro_step > 0) {
      const optim::Optimizer* optimizer = tracked_one<optim::Optimizer>(entries);
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
        check_values(location(accumulation, where), value, /*non_negative=*/false);
        if (value.shape() != shape)
          mismatch(path,
                   detail::str_cat("the accumulator of variable \"", name, "\" has shape ",
                                   value.shape(), " in the file but ", shape, " in this model"));
        out.accumulators.emplace_back(name, std::move(value));
      }
    }
  }
  for (const auto& [name, counter] : tracked<int64_t>(entries)) {
    const std::string where = is_standard_counter(name) ? name : "counters/" + name;
    if (group.exists(where)) {
      out.counters[name] = read_int64_scalar(group, where);
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
    const Shape shape = group.dataset_shape("rng/replica_state");
    TANDEM_CHECK(shape.rank() == 2 && shape[1] == 4, path,
                 ": /training_state/rng/replica_state has shape ", shape, ", expected [R, 4]");
    const std::optional<std::string> algorithm =
        group.read_attr_string_of("rng/replica_state", "algorithm");
    TANDEM_CHECK(algorithm.value_or(kRngAlgorithm) == kRngAlgorithm, path,
                 ": /training_state/rng/replica_state uses algorithm \"", *algorithm,
                 "\"; this build has ", kRngAlgorithm);
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
    const h5::Group m = group.open_group("metrics/" + name);
    const double total = m.read_scalar_float64("total");
    const double count = m.read_scalar_float64("count");
    TANDEM_CHECK(std::isfinite(total), location(m, "total"), " is ", total,
                 ", not finite; the checkpoint is damaged");
    TANDEM_CHECK(std::isfinite(count) && count >= 0, location(m, "count"), " is ", count,
                 ", not a finite count >= 0; the checkpoint is damaged");
    out.metrics[name] = {total, count};
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
  optim::Optimizer* optimizer = tracked_one<optim::Optimizer>(entries_);
  const int replicas = num_replicas();

  // 1. Read and check everything.
  Loaded loaded;
  loaded.path = path;
  {
    h5::File file = h5::File::open(path);
    const h5::Group& root = file.root();
    TANDEM_CHECK(
        root.has_attr("tandem_format") && root.read_attr_string("tandem_format") == kFormatName,
        path, ": not a Tandem checkpoint (no tandem_format=\"", kFormatName,
        "\" attribute at the root)");
    TANDEM_CHECK(root.has_attr("tandem_format_version"), path,
                 ": not a Tandem checkpoint (no tandem_format_version attribute)");
    const int64_t version = root.read_attr_int64("tandem_format_version");
    if (version > kCheckpointFormatVersion)
      mismatch(path, detail::str_cat("written in checkpoint format version ", version,
                                     ", but this build of Tandem reads versions up to ",
                                     kCheckpointFormatVersion, "; restore it with a newer Tandem"));
    TANDEM_CHECK(version >= 1, path, ": invalid tandem_format_version ", version);
    if (!root.has_attr("tandem_checksums"))
      TANDEM_LOG_WARNING(path,
                         ": written before checkpoints carried checksums (no checksums); its ",
                         "data is restored unverified");
    require_group(root, kTrainingState, path);
    if (model) require_group(root, kModelWeights, path);
    if (optimizer) require_group(root, kOptimizerWeights, path);
    if (model) load_model(root, *model, loaded);
    if (optimizer) load_optimizer(root, *optimizer, model, loaded);
    load_training_state(root, entries_, model, replicas, loaded);
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
  if (model && loaded.rng) {
    if (nn::ReplicaGenerators* generators = generators_of(*model))
      generators->set_states(*loaded.rng);
  }
  if (optimizer) {
    ensure_slots(*optimizer, model, loaded.slots);
    std::unordered_map<std::string, Variable> slots;
    for (const auto& [name, slot] : optimizer->slot_variables()) slots.emplace(name, slot);
    std::set<std::string> restored;
    for (const auto& [name, value] : loaded.slots) {
      const auto it = slots.find(name);
      TANDEM_CHECK(it != slots.end(), path, ": optimizer slot \"", name,
                   "\" could not be created (is the model tracked by the checkpoint?)");
      assign_all_copies(it->second, value);
      restored.insert(name);
    }
    // Slots the file does not have start from zero, as they would have at that step.
    for (const auto& [name, slot] : slots) {
      if (restored.contains(name)) continue;
      if (loaded.iteration > 0)
        TANDEM_LOG_WARNING(path, ": optimizer slot \"", name, "\" is not in the checkpoint; it ",
                           "restarts from zero");
      assign_all_copies(slot, Tensor::zeros_like(slot.copy(0)));
    }
    optimizer->set_iterations(loaded.iteration);
    restore_accumulation(*optimizer, model, loaded);
  }
  for (const auto& [name, counter] : tracked<int64_t>(entries_)) {
    const auto it = loaded.counters.find(name);
    if (it != loaded.counters.end()) *counter = it->second;
  }
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

namespace {

/// Reads every dataset below `group` (so HDF5 verifies each checksum) and checks the values
/// that cannot be valid, as a restore does (`slots`: optimizer slots, "v/..." >= 0).
void verify_datasets(const h5::Group& group, bool slots, const std::string& prefix = "") {
  for (const std::string& child : group.children()) {
    // `name`: the path below the group verify_datasets started from ("v/dense/kernel:0").
    const std::string name = prefix.empty() ? child : prefix + "/" + child;
    if (group.is_dataset(child)) {
      const Tensor value = group.read_tensor(child);
      check_values(location(group, child), value,
                   /*non_negative=*/slots && name.starts_with("v/"),
                   "the second moment v is an average of squares");
    } else {
      verify_datasets(group.open_group(child), slots, name);
    }
  }
}

}  // namespace

std::string verify_checkpoint(const std::string& path) {
  try {
    h5::File file = h5::File::open(path);
    const h5::Group& root = file.root();
    TANDEM_CHECK(
        root.has_attr("tandem_format") && root.read_attr_string("tandem_format") == kFormatName,
        path, ": not a Tandem checkpoint (no tandem_format=\"", kFormatName,
        "\" attribute at the root)");
    const int64_t version = root.read_attr_int64("tandem_format_version");
    TANDEM_CHECK(version >= 1 && version <= kCheckpointFormatVersion, path,
                 ": checkpoint format version ", version, "; this build reads versions 1 to ",
                 kCheckpointFormatVersion);
    for (const char* group : {kModelWeights, kTrainingState}) require_group(root, group, path);
    check_own_signature(root, path);
    verify_datasets(root.open_group(kModelWeights), /*slots=*/false);
    if (root.exists(kOptimizerWeights)) {
      const h5::Group optimizer = root.open_group(kOptimizerWeights);
      check_counter(location(optimizer, kIterationName),
                    read_int64_scalar(optimizer, kIterationName));
      verify_datasets(optimizer, /*slots=*/true);
    }
    const h5::Group state = root.open_group(kTrainingState);
    for (const char* name : kStandardCounters)
      if (state.exists(name)) check_counter(location(state, name), read_int64_scalar(state, name));
    if (state.exists("metrics")) {
      const h5::Group metrics = state.open_group("metrics");
      for (const std::string& name : metrics.children()) {
        const h5::Group m = metrics.open_group(name);
        const double total = m.read_scalar_float64("total");
        const double count = m.read_scalar_float64("count");
        TANDEM_CHECK(std::isfinite(total), location(m, "total"), " is ", total,
                     ", not finite; the checkpoint is damaged");
        TANDEM_CHECK(std::isfinite(count) && count >= 0, location(m, "count"), " is ", count,
                     ", not a finite count >= 0; the checkpoint is damaged");
      }
    }
    if (state.exists("data")) {
      const h5::Group data = state.open_group("data");
      for (const std::string& name : data.children()) read_iterator_state(data.open_group(name));
    }
    if (state.exists("grad_accum")) verify_datasets(state.open_group("grad_accum"), false);
    if (state.exists("rng/replica_state")) state.read_u64("rng/replica_state");
    return "";
  } catch (const std::exception& e) {
    return e.what();
  }
}

}  // namespace tandem
