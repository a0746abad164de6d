// load_weights: reads the weight files Keras writes (Keras 3 .weights.h5, legacy h5 weights,
// legacy h5 full model) into a Tandem model, matching layers the way Keras's loaders do.
#include "tandem/checkpoint/keras_weights.h"

#include <algorithm>
#include <map>
#include <optional>
#include <set>
#include <utility>
#include <vector>

#include "tandem/checkpoint/checkpoint.h"
#include "tandem/checkpoint/internal/layout.h"
#include "tandem/io/internal/hdf5_file.h"
#include "tandem/nn/module.h"
#include "tandem/nn/sequential.h"
#include "tandem/ops/ops.h"

namespace tandem {

namespace {

/// One layer of the model that has weights.
struct ModelLayer {
  size_t index = 0;  ///< its position among the model's layers (a nested model's, for its own)
  std::string name;  ///< its Tandem name
  std::string key;   ///< the path Keras 3 gives it in a .weights.h5 file ("dense_1")
  std::vector<Variable> weights;
};

/// One layer of the file that has weights: its Keras name and where its values are.
struct FileLayer {
  std::string name;
  std::string group;                  ///< the layer's group, from the file's root
  std::vector<std::string> datasets;  ///< below `group`, in the file's order
};

/// How the file stores its weights.
enum class KerasLayout { kKeras3, kLegacyWeights, kLegacyModel };

std::string prefix(const std::string& path) { return "load_weights(\"" + path + "\"): "; }

/// Raises CheckpointMismatchError: the file is a Keras weights file, of another model.
[[noreturn]] void refuse(const std::string& path, const std::string& what) {
  throw CheckpointMismatchError(prefix(path) + what);
}

/// "kernel" of "dense_1/kernel".
std::string short_name(const Variable& v) {
  const size_t slash = v.name().rfind('/');
  return slash == std::string::npos ? v.name() : v.name().substr(slash + 1);
}

std::string quoted_list(const std::vector<std::string>& names) {
  std::string out;
  for (const std::string& name : names) {
    if (!out.empty()) out.append(", ");
    out.append("\"").append(name).append("\"");
  }
  return out;
}

/// The model's layers that have weights, in order (a model that is a single layer is its own
/// one layer). `key` follows Keras 3's naming: a Sequential's entries by their snake-case class
/// name (Tandem's default_name), then "_1", "_2", ... for later layers of the same class; a
/// block's (a layer of layers) by their names, as Keras keys a custom layer's sub-layers by the
/// attributes holding them. `nested`: a layer that holds layers gives its own layers, keyed
/// below it ("sequential/layers/dense", "residual_block/conv1", as Keras 3 stores them);
/// otherwise it is one layer whose weights are all of theirs (as Keras's legacy files list them).
void collect_layers(const nn::Module& model, bool nested, const std::string& prefix, int depth,
                    size_t top, std::vector<ModelLayer>& out) {
  TANDEM_CHECK(depth <= 16, "load_weights: models nest deeper than 16 levels");
  std::vector<nn::Module> children = model.children();
  if (children.empty() && depth == 0) children.push_back(model);
  const bool by_class =
      depth == 0 || std::dynamic_pointer_cast<nn::SequentialImpl>(model.ptr()) != nullptr;
  std::map<std::string, int> seen;
  for (size_t i = 0; i < children.size(); ++i) {
    const nn::Module& child = children[i];
    const std::string& base = child.impl().default_name();
    const int count = seen[base]++;
    const std::string key = prefix + (!by_class    ? model.impl().keras_child_key(child)
                                      : count == 0 ? base
                                                   : base + "_" + std::to_string(count));
    // `index`: the position of the layer, or of the nested model holding it, in the model.
    const size_t index = depth == 0 ? i : top;
    if (nested && !child.children().empty()) {
      const bool sequential = std::dynamic_pointer_cast<nn::SequentialImpl>(child.ptr()) != nullptr;
      collect_layers(child, nested, key + (sequential ? "/layers/" : "/"), depth + 1, index, out);
      continue;
    }
    std::vector<Variable> weights = child.weights();
    if (weights.empty()) continue;
    out.push_back({index, child.name(), key, std::move(weights)});
  }
}

std::vector<ModelLayer> model_layers(const nn::Module& model, bool nested) {
  std::vector<ModelLayer> out;
  collect_layers(model, nested, "", 0, 0, out);
  return out;
}

/// A list attribute Keras writes, which it splits into `name`0, `name`1, ... when it would not
/// fit an object header; std::nullopt when there is neither.
std::optional<std::vector<std::string>> read_names(const h5::Group& group,
                                                   const std::string& name) {
  if (group.has_attr(name)) return group.read_attr_strings(name);
  if (!group.has_attr(name + "0")) return std::nullopt;
  std::vector<std::string> out;
  for (int chunk = 0; group.has_attr(name + std::to_string(chunk)); ++chunk)
    for (std::string& part : group.read_attr_strings(name + std::to_string(chunk)))
      out.push_back(std::move(part));
  return out;
}

/// The layers with weights of a legacy file, in the order of its layer_names (Keras's
/// load_weights_from_hdf5_group skips the layers whose weight_names are empty).
std::vector<FileLayer> legacy_layers(const h5::Group& weights, const std::string& path) {
  std::vector<FileLayer> out;
  const std::vector<std::string> names =
      read_names(weights, "layer_names").value_or(std::vector<std::string>{});
  for (const std::string& name : names) {
    TANDEM_CHECK(weights.exists(name), prefix(path), "layer \"", name,
                 "\" is listed in layer_names but ", weights.path(), " has no group of that name");
    const h5::Group group = weights.open_group(name);
    std::vector<std::string> datasets =
        read_names(group, "weight_names").value_or(std::vector<std::string>{});
    if (datasets.empty()) continue;
    for (const std::string& dataset : datasets)
      TANDEM_CHECK(group.is_dataset(dataset), prefix(path), "weight \"", dataset, "\" of layer \"",
                   name, "\" is listed in weight_names but is not a dataset of ", group.path());
    out.push_back({name, group.path(), std::move(datasets)});
  }
  return out;
}

/// The datasets vars/0, vars/1, ... of a Keras 3 layer group ("layers/dense"); empty when it has
/// no vars.
std::vector<std::string> keras3_vars(const h5::Group& root, const std::string& layer) {
  std::vector<std::string> out;
  const std::string vars = layer + "/vars";
  if (!root.exists(vars)) return out;
  for (size_t i = 0; root.is_dataset(vars + "/" + std::to_string(i)); ++i)
    out.push_back("vars/" + std::to_string(i));
  return out;
}

/// The Keras 3 layers with weights below `group` ("layers"), in the file's order, by their path
/// below it ("dense", "sequential/layers/dense", "residual_block/conv1"): every group holding
/// a non-empty "vars" is a layer; the walk goes through every other group (a nested model's
/// "layers", a custom layer's sub-layers). Bounded: a cycle of groups or nesting deeper than
/// 16 levels raises.
void keras3_layers(const h5::Group& root, const std::string& group, const std::string& prefix,
                   int depth, std::set<std::string>& seen, std::vector<std::string>& out) {
  TANDEM_CHECK(depth <= 16, root.file(), ": /", group, ": layers nest deeper than 16 levels");
  TANDEM_CHECK(seen.insert(root.object_id(group)).second, root.file(), ": /", group,
               " is reached again through a cycle of links; the file is damaged");
  for (const std::string& name : root.open_group(group).children()) {
    const std::string path = group + "/" + name;
    if (name == "vars" || root.is_dataset(path)) continue;
    if (!keras3_vars(root, path).empty()) out.push_back(prefix + name);
    keras3_layers(root, path, prefix + name + "/", depth + 1, seen, out);
  }
}

/// The file's layers matched to `layers`, one for one, in the model's order: in a legacy file
/// by order, in a Keras 3 file by Keras's path. Raises when the number of layers with weights
/// differs, or a layer has no counterpart.
std::vector<FileLayer> match_layers(const h5::Group& root, KerasLayout layout,
                                    const std::vector<ModelLayer>& layers,
                                    const std::string& path) {
  std::vector<std::string> model_names;
  for (const ModelLayer& layer : layers) model_names.push_back(layer.name);
  auto count_mismatch = [&](const std::vector<std::string>& file_names) {
    refuse(path, detail::str_cat("the file has ", file_names.size(), " layers with weights (",
                                 quoted_list(file_names), "), the model has ", layers.size(), " (",
                                 quoted_list(model_names), ")"));
  };
  if (layout != KerasLayout::kKeras3) {
    std::vector<FileLayer> file = layout == KerasLayout::kLegacyModel
                                      ? legacy_layers(root.open_group(detail::kModelWeights), path)
                                      : legacy_layers(root, path);
    if (file.size() != layers.size()) {
      std::vector<std::string> file_names;
      for (const FileLayer& layer : file) file_names.push_back(layer.name);
      count_mismatch(file_names);
    }
    return file;
  }
  // Keras 3 names each entry of the model's layer list by its class and rank in that class, and
  // a nested model's entries below its own.
  std::vector<std::string> file_names;
  std::set<std::string> seen;
  keras3_layers(root, "layers", "", 0, seen, file_names);
  if (file_names.size() != layers.size()) count_mismatch(file_names);
  std::vector<FileLayer> file;
  for (const ModelLayer& layer : layers) {
    std::vector<std::string> datasets = keras3_vars(root, "layers/" + layer.key);
    if (datasets.empty())
      refuse(path, detail::str_cat("layer ", layer.index, " (Tandem \"", layer.name,
                                   "\"): Keras stores it at /layers/", layer.key,
                                   "/vars, which the file lacks (its layers",
                                   " with weights: ", quoted_list(file_names), ")"));
    file.push_back({layer.key, "/layers/" + layer.key, std::move(datasets)});
  }
  return file;
}

KerasLayout detect_layout(const h5::Group& root, const std::string& path) {
  // As Keras's legacy loader: the root's layer_names, else /model_weights; then Keras 3.
  if (read_names(root, "layer_names")) return KerasLayout::kLegacyWeights;
  if (root.exists(detail::kModelWeights) && !root.is_dataset(detail::kModelWeights) &&
      read_names(root.open_group(detail::kModelWeights), "layer_names"))
    return KerasLayout::kLegacyModel;
  if (root.exists("layers") && !root.is_dataset("layers")) return KerasLayout::kKeras3;
  const std::vector<std::string> children = root.children();
  const std::string held =
      children.empty() ? std::string("nothing") : detail::str_cat("[", quoted_list(children), "]");
  TANDEM_THROW(prefix(path),
               "not a Keras weights file: it has none of the layouts Keras writes (a layer_names "
               "attribute at the root: legacy .h5 weights; a /model_weights group with "
               "layer_names: legacy .h5 model; a /layers group: Keras 3 .weights.h5); its root "
               "holds ",
               held);
}

}  // namespace

void load_weights(const nn::Module& model, const std::string& path,
                  const LoadWeightsOptions& options) {
  TANDEM_CHECK(current_replica_binding().num_replicas <= 1, prefix(path),
               "called inside strategy.run; load weights from the main thread, outside run");
  TANDEM_CHECK(model.built(), prefix(path), "model \"", model.name(),
               "\" is not built; call model.build(input_shape) (or run it once) first, as Keras ",
               "requires a built model too");
  // 1. Read and check everything; the model is not touched until every value fits.
  std::vector<std::pair<Variable, Tensor>> values;
  {
    const h5::File file = h5::File::open(path, h5::Origin::kForeign);
    const h5::Group& root = file.root();
    const KerasLayout layout = detect_layout(root, path);
    const std::vector<ModelLayer> layers =
        model_layers(model, /*nested=*/layout == KerasLayout::kKeras3);
    const std::vector<FileLayer> file_layers = match_layers(root, layout, layers, path);
    for (size_t i = 0; i < layers.size(); ++i) {
      const ModelLayer& layer = layers[i];
      const FileLayer& stored = file_layers[i];
      const std::string where = detail::str_cat("layer ", layer.index, " (Tandem \"", layer.name,
                                                "\", Keras \"", stored.name, "\"): ");
      // Legacy files list a layer's trainable weights first (Keras's _legacy_weights); Keras 3
      // keeps the layer's own order.
      std::vector<Variable> weights = layer.weights;
      if (layout != KerasLayout::kKeras3)
        std::stable_partition(weights.begin(), weights.end(),
                              [](const Variable& v) { return v.trainable(); });
      if (stored.datasets.size() != weights.size()) {
        std::vector<std::string> names;
        for (const Variable& v : weights) names.push_back(short_name(v));
        refuse(path, detail::str_cat(where, "the file has ", stored.datasets.size(), " weights (",
                                     quoted_list(stored.datasets), "), the model ", weights.size(),
                                     " (", quoted_list(names), ")"));
      }
      const h5::Group group = root.open_group(stored.group.substr(1));
      for (size_t k = 0; k < weights.size(); ++k) {
        const Variable& v = weights[k];
        const std::string& dataset = stored.datasets[k];
        const Shape shape = group.dataset_shape(dataset);
        if (shape != v.shape())
          refuse(path,
                 detail::str_cat(where, short_name(v), " shape ", shape, " in the file (",
                                 stored.group, "/", dataset, "), ", v.shape(), " in the model"));
        Tensor value = group.read_tensor(dataset);
        if (value.dtype() != v.dtype()) {
          TANDEM_CHECK(is_floating(value.dtype()) && is_floating(v.dtype()), prefix(path), where,
                       short_name(v), " is ", value.dtype(), " in the file (", stored.group, "/",
                       dataset, "), ", v.dtype(), " in the model");
          value = ops::cast(value, v.dtype());
        }
        // After the cast: a float64 1e300 is finite in the file and Inf in a float32 model.
        if (is_floating(value.dtype()) && !options.allow_non_finite) {
          const ops::NonFinite found = ops::count_non_finite(value);
          TANDEM_CHECK(found.total() == 0, prefix(path), where, stored.group, "/", dataset,
                       " holds ", found.total(), " non-finite values (", found.nan, " NaN, ",
                       found.inf, " Inf) of ", value.numel(), " as ", value.dtype(),
                       "; a model trained into NaN, or a damaged file (pass "
                       "{.allow_non_finite = true} to load them anyway)");
        }
        values.emplace_back(v, std::move(value));
      }
    }
  }

  // 2. Assign: every replica's copy of a mirrored variable gets the same values.
  for (const auto& [variable, value] : values) detail::assign_all_copies(variable, value);
}

}  // namespace tandem
