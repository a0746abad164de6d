// The checkpoint layout's shared helpers (internal/layout.h): the tracked objects, the model's
// layers and signature as Keras stores them, and the checks of values read back from a file.
#include "tandem/checkpoint/internal/layout.h"

#include <algorithm>
#include <cmath>
#include <memory>

#include "tandem/nn/layers.h"
#include "tandem/nn/sequential.h"

namespace tandem::detail {

bool is_standard_counter(const std::string& name) {
  for (const char* standard : kStandardCounters)
    if (name == standard) return true;
  return false;
}

int64_t* tracked_counter(const std::vector<Checkpoint::Entry>& entries, const std::string& name) {
  for (const auto& [counter_name, counter] : tracked<int64_t>(entries))
    if (counter_name == name) return counter;
  return nullptr;
}

std::vector<LayerWeights> layers_of(const nn::Module& model) {
  TANDEM_CHECK(model.built(), "checkpoint: model \"", model.name(),
               "\" is not built; call model.build(input_shape) (or run it once) before saving ",
               "or restoring it");
  std::vector<nn::Module> children = model.children();
  if (children.empty()) children.push_back(model);
  std::vector<LayerWeights> layers;
  for (const nn::Module& child : children) {
    // Keras's legacy order (_legacy_weights): the layer's trainable weights, then the others.
    // It differs from weights() only in a layer of layers (a block's batch norms' moving
    // statistics come after every trainable weight of the block), which Keras's load_weights
    // assigns by position.
    std::vector<Variable> weights = child.weights();
    std::stable_partition(weights.begin(), weights.end(),
                          [](const Variable& v) { return v.trainable(); });
    layers.push_back({child.name(), std::move(weights)});
  }
  return layers;
}

nn::ReplicaGenerators* generators_of(const nn::Module& model) {
  if (auto s = std::dynamic_pointer_cast<nn::SequentialImpl>(model.ptr())) return &s->generators();
  if (auto d = std::dynamic_pointer_cast<nn::DropoutImpl>(model.ptr())) return &d->generators();
  return nullptr;
}

void assign_all_copies(const Variable& variable, const Tensor& value) {
  variable.assign_all(value);
}

std::string keras_name(const std::string& variable_name) { return variable_name + ":0"; }

std::string strip_keras_suffix(const std::string& name) {
  return name.size() > 2 && name.ends_with(":0") ? name.substr(0, name.size() - 2) : name;
}

namespace {

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

}  // namespace

std::string signature_of(const std::vector<LayerWeights>& layers) {
  std::vector<LayerDescription> described;
  described.reserve(layers.size());
  for (const LayerWeights& layer : layers) {
    LayerDescription& d = described.emplace_back();
    d.name = layer.name;
    for (const Variable& v : layer.weights) d.weights.push_back({v.name(), v.shape(), v.dtype()});
  }
  return signature_of(described);
}

std::string signature_of(const std::vector<LayerDescription>& layers) {
  std::string text;
  for (const LayerDescription& layer : layers) {
    text += "layer " + layer.name + "\n";
    for (const LayerDescription::Weight& w : layer.weights)
      text += str_cat("  ", w.name, " ", w.shape, " ", w.dtype, "\n");
  }
  return hex64(fnv1a(text));
}

std::string location(const h5::Group& group, const std::string& name) {
  return group.file() + ":" + (group.path() == "/" ? "" : group.path()) + "/" + name;
}

namespace {

/// check_values over `n` elements of type T, in place (every restore and every save's read-back
/// scans each weight and slot: no copy).
template <typename T>
void check_values_of(const std::string& where, const T* values, size_t n, bool non_negative,
                     const char* why_non_negative) {
  bool bad = false;
  for (size_t i = 0; i < n; ++i)
    bad |= !std::isfinite(values[i]) || (non_negative && values[i] < 0);
  if (!bad) return;
  for (size_t i = 0; i < n; ++i) {
    TANDEM_CHECK(std::isfinite(values[i]), where, ": value ", values[i], " at index ", i,
                 " is not finite; the checkpoint is damaged");
    TANDEM_CHECK(!non_negative || values[i] >= 0, where, ": value ", values[i], " at index ", i,
                 " is negative; ", why_non_negative);
  }
}

}  // namespace

void check_values(const std::string& where, const Tensor& value, bool non_negative,
                  const char* why_non_negative) {
  const size_t n = static_cast<size_t>(value.numel());
  if (value.dtype() == DType::kFloat32)
    check_values_of(where, static_cast<const float*>(value.raw_data()), n, non_negative,
                    why_non_negative);
  else if (value.dtype() == DType::kFloat64)
    check_values_of(where, static_cast<const double*>(value.raw_data()), n, non_negative,
                    why_non_negative);
}

void check_counter(const std::string& where, int64_t value) {
  TANDEM_CHECK(value >= 0 && value <= kMaxCounter, where, " is ", value,
               ", outside [0, 2^53]; the checkpoint is damaged");
}

namespace {

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
      text += str_cat("  ", strip_keras_suffix(name), " ", group.dataset_shape(name), " ",
                      group.dataset_dtype(name), "\n");
    }
  }
  return hex64(fnv1a(text));
}

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

}  // namespace

void check_own_signature(const h5::Group& root, const std::string& path,
                         const std::string& difference) {
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

h5::File open_checkpoint(const std::string& path) {
  h5::File file = h5::File::open(path, h5::Origin::kTandem);
  if (file.root().has_attr("tandem_checksums")) return file;
  // Only a file of an older Tandem (the HDF5 1.8 format or older) may lack them: every file in
  // the format Tandem writes now declares them.
  // (A file without tandem_format is no Tandem checkpoint at all: the caller says so.)
  TANDEM_CHECK(!file.root().has_attr("tandem_format") || file.superblock_version() < 3, path,
               ": declares no checksums (no tandem_checksums attribute at the root), yet it is in "
               "the HDF5 1.10 format, in which every Tandem checkpoint declares them; the file "
               "was altered");
  file.set_origin(h5::Origin::kForeign);
  return file;
}

void require_group(const h5::Group& root, const std::string& name, const std::string& path) {
  TANDEM_CHECK(root.exists(name), path, ": incomplete checkpoint: the group /", name,
               " is missing");
}

data::IteratorState read_iterator_state(const h5::Group& group) {
  data::IteratorState::Entries entries;
  for (const std::string& name : group.read_attr_strings("entry_names"))
    entries.emplace_back(name, group.read_tensor(name).to_vector<int64_t>());
  check_iterator_state(group, entries);
  return data::IteratorState(std::move(entries));
}

}  // namespace tandem::detail
