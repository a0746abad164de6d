// Writing a checkpoint: the root attributes, /model_weights (Keras' legacy h5 layout),
// /optimizer_weights and /training_state, into a temporary file that is synced and renamed into
// place, so that a crash leaves the previous checkpoint or the new one, never a mix.
#include <algorithm>
#include <bit>
#include <cstdint>
#include <ctime>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <typeinfo>

#include "tandem/checkpoint/internal/file_image.h"
#include "tandem/checkpoint/internal/file_io.h"
#include "tandem/checkpoint/internal/gather.h"
#include "tandem/checkpoint/internal/layout.h"
#include "tandem/checkpoint/internal/metric_state.h"
#include "tandem/checkpoint/internal/user_state.h"
#include "tandem/core/build_info.h"
#include "tandem/data/dataset.h"
#include "tandem/data/distributed_dataset.h"
#include "tandem/metrics/metrics.h"
#include "tandem/nn/module.h"
#include "tandem/optim/adam.h"
#include "tandem/optim/loss_scale_optimizer.h"
#include "tandem/optim/optimizer.h"
#include "tandem/optim/schedules.h"
#include "tandem/optim/sgd.h"

namespace tandem {

using detail::FileImage;
using detail::ImageGroup;
using detail::ImageOp;
using detail::is_standard_counter;
using detail::kChecksums;
using detail::keras_name;
using detail::kFormatName;
using detail::kIterationName;
using detail::kKerasVersion;
using detail::kModelWeights;
using detail::kOptimizerWeights;
using detail::kRngAlgorithm;
using detail::kStandardCounters;
using detail::kTrainingState;
using detail::LayerDescription;
using detail::layers_of;
using detail::LayerWeights;
using detail::tracked;
using detail::tracked_loss_scale;
using detail::tracked_one;
using detail::tracked_optimizer;

namespace {

Tensor int64_scalar(int64_t value) {
  return Tensor::from_vector(std::vector<int64_t>{value}, Shape(std::vector<int64_t>{}));
}

std::string utc_text(std::time_t time) {
  std::tm parts{};
  gmtime_r(&time, &parts);
  char text[32];
  std::strftime(text, sizeof(text), "%Y-%m-%dT%H:%M:%SZ", &parts);
  return text;
}

/// Also describes the layers written into `described`, for the model_signature.
void write_model(const detail::ImageGroup& root, const nn::Module* model,
                 const std::map<std::string, Tensor>& on_read,
                 std::vector<LayerDescription>& described) {
  const detail::ImageGroup group = root.create_group(kModelWeights);
  std::vector<std::string> layer_names;
  const std::vector<LayerWeights> layers = model ? layers_of(*model) : std::vector<LayerWeights>{};
  for (const LayerWeights& layer : layers) layer_names.push_back(layer.name);
  // Keras' legacy h5 layout: load_weights finds no layer_names at the root, descends into
  // /model_weights, and matches the layers that have weights by order.
  group.write_attr_fixed("layer_names", layer_names);
  group.write_attr("backend", std::string("tensorflow"));
  group.write_attr("keras_version", std::string(kKerasVersion));
  described.reserve(layers.size());
  for (const LayerWeights& layer : layers) {
    const detail::ImageGroup layer_group = group.create_group(layer.name);
    LayerDescription& description = described.emplace_back();
    description.name = layer.name;
    std::vector<std::string> weight_names;
    for (const Variable& v : layer.weights) {
      description.weights.push_back({v.name(), v.shape(), v.dtype()});
      weight_names.push_back(keras_name(v.name()));
      // Replica 0's copy: after every synchronised update all copies hold the same bits; a
      // variable synchronized on read (batch norm's moving statistics) is saved as the
      // aggregate of every replica's copy, of every worker's (gather_state).
      const auto it = on_read.find(v.name());
      layer_group.write_tensor(keras_name(v.name()),
                               it != on_read.end() ? it->second : v.aggregated());
    }
    layer_group.write_attr_fixed("weight_names", weight_names);
  }
}

/// `elsewhere`: the slots other workers hold (optimizer-state sharding), gathered to the chief.
void write_optimizer(const detail::ImageGroup& root, const optim::Optimizer& optimizer,
                     const std::string& config_json,
                     const std::map<std::string, Tensor>& elsewhere) {
  const detail::ImageGroup group = root.create_group(kOptimizerWeights);
  std::vector<std::string> weight_names = {kIterationName};
  group.write_tensor(kIterationName, int64_scalar(optimizer.iterations()));
  for (const auto& [name, slot] : optimizer.slot_variables()) {
    weight_names.push_back(keras_name(name));
    if (slot.defined()) {
      group.write_tensor(keras_name(name), slot.copy(0));
      continue;
    }
    const auto it = elsewhere.find(name);
    TANDEM_CHECK(
        it != elsewhere.end(), "checkpoint: optimizer slot \"", name,
        "\" is held by another worker (shard_optimizer_state = ", optimizer.shard_optimizer_state(),
        "); save with a CheckpointManager given the strategy ({.strategy = &strategy}), "
        "which every worker calls and which gathers the slots to the chief");
    group.write_tensor(keras_name(name), it->second);
  }
  group.write_attr("optimizer", optimizer.name());
  group.write_attr("config_json", config_json);
  group.write_attr_fixed("weight_names", weight_names);
}

void write_iterator_state(const detail::ImageGroup& group, const data::IteratorState& state) {
  std::vector<std::string> names;
  for (const auto& [name, values] : state.entries()) {
    names.push_back(name);
    group.write_tensor(name,
                       Tensor::from_vector(values, Shape({static_cast<int64_t>(values.size())})));
  }
  // HDF5 lists links by name; the entry order of the state is kept here.
  group.write_attr_fixed("entry_names", names);
}

void write_training_state(const detail::ImageGroup& root,
                          const std::vector<Checkpoint::Entry>& entries, int64_t global_step,
                          const detail::GatheredState& gathered) {
  const detail::ImageGroup group = root.create_group(kTrainingState);
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
  // The program's double and float counters and TrackedState objects.
  detail::write_user_state(group, entries);

  for (const auto& [name, dataset] : tracked<data::DistributedDataset>(entries)) {
    const detail::ImageGroup d = group.require_group("data/" + name);
    d.write_attr("kind", std::string("distributed_dataset"));
    d.write_attr("num_replicas", dataset->num_replicas());
    d.write_attr("epoch", static_cast<int64_t>(dataset->epoch()));
    write_iterator_state(d, dataset->save());
  }
  for (const auto& [name, iterator] : tracked<data::Iterator>(entries)) {
    const detail::ImageGroup d = group.require_group("data/" + name);
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
    // One float64 dataset per state variable, of the variable's shape (Mean's total and count
    // are scalars, as in files written before metrics had general state).
    const metrics::MetricState& state = gathered.metrics.at(name);
    const detail::ImageGroup m = group.require_group("metrics/" + name);
    std::vector<std::string> names, counts;
    for (const metrics::MetricVariable& v : metric->variables()) {
      m.write_tensor(v.name, Tensor::from_vector(state.at(v.name), v.shape));
      names.push_back(v.name);
      if (v.non_negative) counts.push_back(v.name);
    }
    m.write_attr("metric_name", metric->name());
    m.write_attr_fixed(detail::kMetricVariables, names);
    if (!counts.empty()) m.write_attr_fixed(detail::kMetricCounts, counts);
  }

  // Gradient accumulation: micro_step (0 at an update boundary) and, in the middle of an
  // accumulation, each variable's accumulator as the SUM over replicas of the replica-local
  // copies (only that sum is ever all-reduced, so a restore may put it on one replica).
  const detail::ImageGroup accumulation = group.require_group("grad_accum");
  const optim::Optimizer* optimizer = tracked_optimizer(entries);
  const int64_t micro_step = optimizer ? optimizer->micro_step() : 0;
  accumulation.write_tensor("micro_step", int64_scalar(micro_step));
  accumulation.write_attr(
      "gradient_accumulation_steps",
      static_cast<int64_t>(optimizer ? optimizer->gradient_accumulation_steps() : 1));
  if (micro_step > 0)
    for (const auto& [name, sum] : gathered.accumulators)
      accumulation.write_tensor(keras_name(name), sum);

  // The loss scale and its counter (Keras's dynamic_scale and step_counter): replica 0's, as
  // every replica's copies are equal.
  if (const optim::LossScaleOptimizer* lso = tracked_loss_scale(entries)) {
    const detail::ImageGroup loss_scale = group.require_group("loss_scale");
    loss_scale.write_tensor("scale", lso->dynamic_scale_variable().copy(0));
    loss_scale.write_tensor("good_steps", lso->step_counter_variable().copy(0));
    loss_scale.write_attr("dynamic_growth_steps", lso->options().dynamic_growth_steps);
  }
}

}  // namespace

namespace detail {

struct SnapshotCache {
  /// Operations in the last image: the next one reserves as many (no regrowth while copying).
  size_t ops = 0;
  /// The optimizer's config_json and what it was made from (config_of).
  const optim::Optimizer* optimizer = nullptr;
  std::optional<optim::LearningRate> learning_rate;  // keeps its schedule alive
  double rate = 0;
  std::optional<double> global_clipnorm;
  int accumulation_steps = 0;
  std::string config_json;
};

std::shared_ptr<SnapshotCache> make_snapshot_cache() { return std::make_shared<SnapshotCache>(); }

namespace {

/// optimizer.config_json(), remade only when what it is made of may have changed. Kept only for
/// the optimizers whose config is their constructor's options (fixed) and the learning rate,
/// with a constant rate: one and the same schedule object, whose one value is unchanged (so
/// even a schedule the caller shares and assigns anew is seen). Any other kind is asked anew.
const std::string& config_of(const optim::Optimizer& optimizer, SnapshotCache* cache,
                             std::string& fresh) {
  const std::type_info& kind = typeid(optimizer);
  const bool fixed_options =
      kind == typeid(optim::Adam) || kind == typeid(optim::AdamW) || kind == typeid(optim::SGD);
  const optim::LearningRate& learning_rate = optimizer.learning_rate();
  const auto& schedule = learning_rate.schedule();
  const bool constant_rate = typeid(schedule) == typeid(optim::schedules::Constant);
  if (cache == nullptr || !fixed_options || !constant_rate) {
    fresh = optimizer.config_json();
    return fresh;
  }
  const double rate = learning_rate(0);
  const bool same = cache->optimizer == &optimizer && cache->learning_rate &&
                    &cache->learning_rate->schedule() == &schedule &&
                    std::bit_cast<uint64_t>(cache->rate) == std::bit_cast<uint64_t>(rate) &&
                    cache->global_clipnorm == optimizer.global_clipnorm() &&
                    cache->accumulation_steps == optimizer.gradient_accumulation_steps();
  if (!same) {
    cache->optimizer = &optimizer;
    cache->learning_rate = learning_rate;
    cache->rate = rate;
    cache->global_clipnorm = optimizer.global_clipnorm();
    cache->accumulation_steps = optimizer.gradient_accumulation_steps();
    cache->config_json = optimizer.config_json();
  }
  return cache->config_json;
}

}  // namespace

FileImage snapshot_gathered(const Checkpoint& checkpoint, const GatheredState& gathered,
                            SnapshotCache* cache, std::vector<ImageOp> recycled) {
  const std::vector<Checkpoint::Entry>& entries_ = checkpoint.entries();
  const nn::Module* model = tracked_one<nn::Module>(entries_);
  const optim::Optimizer* optimizer = tracked_optimizer(entries_);
  const auto image = std::make_shared<FileImage>();
  // A new op list of this size is a large allocation, which can make the allocator sort its
  // free lists first on this thread: the previous image's list is reused instead.
  image->ops = std::move(recycled);
  image->ops.clear();
  if (cache != nullptr) image->ops.reserve(cache->ops);
  const ImageGroup root(image);
  root.write_attr("tandem_format", std::string(kFormatName));
  root.write_attr("tandem_format_version", kCheckpointFormatVersion);
  root.write_attr("tandem_version", build_info().version);
  // The time is taken now; its text, like the model_signature, is made as the file is written.
  const std::time_t now = std::time(nullptr);
  root.write_attr_later("created_utc", [now] { return utc_text(now); });
  root.write_attr("num_workers", static_cast<int64_t>(gathered.num_workers));
  root.write_attr("num_replicas", gathered.num_replicas);
  std::string backend = "cpu";
  if (model) {
    const std::vector<Variable> weights = model->weights();
    if (!weights.empty() && weights.front().copy(0).device().is_cuda()) backend = "cuda";
  }
  root.write_attr("backend", backend);
  // Checkpoint::model_signature(), of the layers write_model describes.
  const auto described = std::make_shared<std::vector<LayerDescription>>();
  root.write_attr_later("model_signature", [described, has_model = model != nullptr] {
    return has_model ? detail::signature_of(*described) : std::string();
  });
  // Every dataset with data carries Fletcher-32, scalars sit in checksummed object headers
  // (hdf5_file.h); readers note files without this attribute (written before checksums).
  root.write_attr("tandem_checksums", std::string(kChecksums));

  write_model(root, model, gathered.on_read, *described);
  root.save_point("model_weights");
  std::string config_json;
  if (optimizer)
    write_optimizer(root, *optimizer, config_of(*optimizer, cache, config_json), gathered.slots);
  root.save_point("optimizer_weights");
  write_training_state(root, entries_, checkpoint.global_step(), gathered);
  root.save_point("training_state");
  if (cache != nullptr) cache->ops = image->ops.size();
  return std::move(*image);
}

namespace {

/// The non-finite elements of one dataset: counts, and the first one's index and text.
struct NonFiniteScan {
  int64_t nan = 0, inf = 0, first = -1;
  std::string first_text;
};

/// Scans `n` IEEE values of bit type U (exponent mask `exponent`, sign bit `sign`). A block
/// whose largest magnitude (as bits) reaches the all-ones exponent holds NaN or Inf and is
/// scanned element by element; the max over a block vectorizes, so a finite tensor costs one
/// read of its bytes.
template <typename U>
NonFiniteScan scan_non_finite(const void* raw, int64_t n, U exponent, U sign) {
  const U* bits = static_cast<const U*>(raw);
  const U magnitude = static_cast<U>(~sign);
  constexpr int64_t kBlock = 4096;
  NonFiniteScan out;
  for (int64_t start = 0; start < n; start += kBlock) {
    const int64_t end = std::min(n, start + kBlock);
    U largest = 0;
    for (int64_t i = start; i < end; ++i)
      largest = std::max<U>(largest, static_cast<U>(bits[i] & magnitude));
    if (largest < exponent) continue;
    for (int64_t i = start; i < end; ++i) {
      const U m = static_cast<U>(bits[i] & magnitude);
      if (m < exponent) continue;
      (m == exponent ? out.inf : out.nan) += 1;
      if (out.first >= 0) continue;
      out.first = i;
      out.first_text = m != exponent ? "nan" : (bits[i] & sign) != 0 ? "-inf" : "inf";
    }
  }
  return out;
}

NonFiniteScan scan_non_finite(const Tensor& t) {
  const int64_t n = t.numel();
  switch (t.dtype()) {
    case DType::kFloat32:
      return scan_non_finite<uint32_t>(t.raw_data(), n, 0x7f800000u, 0x80000000u);
    case DType::kFloat64:
      return scan_non_finite<uint64_t>(t.raw_data(), n, 0x7ff0000000000000ull,
                                       0x8000000000000000ull);
    case DType::kBFloat16:
      return scan_non_finite<uint16_t>(t.raw_data(), n, 0x7f80, 0x8000);
    case DType::kFloat16:
      return scan_non_finite<uint16_t>(t.raw_data(), n, 0x7c00, 0x8000);
    default:
      return {};  // integers and booleans are always finite
  }
}

}  // namespace

std::string non_finite_state(const FileImage& image) {
  const std::string weights_prefix = std::string(kModelWeights) + "/";
  std::string first;
  std::vector<std::string> others;
  for (const ImageOp& op : image.ops) {
    if (op.kind != ImageOp::Kind::kTensor) continue;
    const bool weight = op.group.starts_with(weights_prefix);
    if (!weight && op.group != kOptimizerWeights) continue;
    const NonFiniteScan scan = scan_non_finite(op.tensor);
    if (scan.first < 0) continue;
    // The dataset "<layer>/kernel:0" or "m/<layer>/kernel:0" is the variable or slot name
    // with Keras' ":0".
    const std::string name =
        op.name.ends_with(":0") ? op.name.substr(0, op.name.size() - 2) : op.name;
    if (!first.empty()) {
      others.push_back(str_cat("\"", name, "\""));
      continue;
    }
    first = str_cat(weight ? "the model weight \"" : "the optimizer slot \"", name, "\" (/",
                    op.group, "/", op.name, ") holds ", scan.nan + scan.inf, " non-finite values (",
                    scan.nan, " NaN, ", scan.inf, " Inf) of ", op.tensor.numel(),
                    ", the first at index ", scan.first, " (", scan.first_text, ")");
  }
  if (first.empty()) return "";
  if (!others.empty()) {
    first += str_cat("; ", others.size(), " more hold non-finite values: ");
    for (size_t i = 0; i < others.size() && i < 4; ++i) first += (i ? ", " : "") + others[i];
    if (others.size() > 4) first += ", ...";
  }
  return first + ". A checkpoint of non-finite weights or optimizer slots would not restore: " +
         "the training diverged (a NaN or Inf loss; lower the learning rate, clip the " +
         "gradients, or use a loss scale with mixed precision)";
}

void write_gathered(const Checkpoint& checkpoint, const std::string& path,
                    const GatheredState& gathered) {
  const FileImage image = snapshot_gathered(checkpoint, gathered);
  const std::string non_finite = non_finite_state(image);
  TANDEM_CHECK(non_finite.empty(), "checkpoint: not writing ", path, ": ", non_finite,
               "; nothing was written");
  write_image(image, path);
}

}  // namespace detail

}  // namespace tandem
