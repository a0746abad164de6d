// The checks every checkpoint passes before anything of it is used, without the model that wrote
// it: validate_checkpoint (layout.h), which Checkpoint::restore runs first and verify_checkpoint
// (inspect.h, `tandem-ckpt verify`) runs alone, so that the two never disagree about a file.
#include <algorithm>
#include <functional>
#include <map>
#include <set>
#include <string>

#include "tandem/checkpoint/inspect.h"
#include "tandem/checkpoint/internal/layout.h"
#include "tandem/checkpoint/internal/metric_state.h"
#include "tandem/checkpoint/internal/user_state.h"

namespace tandem {

using detail::check_counter;
using detail::check_own_signature;
using detail::check_values;
using detail::kFormatName;
using detail::kIterationName;
using detail::kModelWeights;
using detail::kOptimizerWeights;
using detail::kRngAlgorithm;
using detail::kStandardCounters;
using detail::kTrainingState;
using detail::location;
using detail::read_iterator_state;
using detail::require_group;
using detail::str_cat;
using detail::verify_metric_state;

namespace {

/// How deep groups may nest (a checkpoint needs 5: /training_state/metrics/<name>/<variable>),
/// and how many objects one walk visits at most.
constexpr int kMaxDepth = 16;
constexpr size_t kMaxObjects = 1'000'000;

/// What a walk of a file has seen: every group by its object id, so that a cycle of hard links
/// (group A holding B holding A), or one group under two names, ends the walk with an error
/// instead of recursing forever or being read twice as two things.
struct Walk {
  std::set<std::string> groups;
  size_t objects = 0;
  /// Whether the file holds a dynamic loss scale: then an accumulation saved mid-way may hold
  /// Inf or NaN (an overflowing micro-step; the update skips it), see loss_scale_optimizer.h.
  bool loss_scaled = false;
};

/// How the values below a group are checked while the walk reads them.
enum class Values {
  kAny,        // read (so that every checksum is verified); checked where they are used
  kFinite,     // weights, accumulators, the loss scale: never NaN or infinite
  kOptimizer,  // finite, and the second moments ("v/...") >= 0
};

/// Reads every dataset below `group` (so HDF5 verifies each checksum) and checks its values as
/// `values` says. `name`: the path below the group the region started from ("v/dense/kernel:0").
void read_everything(const h5::Group& group, Values values, Walk& walk, const std::string& prefix,
                     int depth) {
  TANDEM_CHECK(walk.groups.insert(group.object_id(".")).second, group.file(), ":", group.path(),
               ": the group is reached again through another link (a cycle of links, or one "
               "group under two names); the file is damaged");
  TANDEM_CHECK(depth <= kMaxDepth, group.file(), ":", group.path(), ": groups nest deeper than ",
               kMaxDepth, " levels; not a Tandem checkpoint");
  for (const std::string& child : group.children()) {
    TANDEM_CHECK(++walk.objects <= kMaxObjects, group.file(), ": more than ", kMaxObjects,
                 " objects; not a Tandem checkpoint");
    const std::string name = prefix.empty() ? child : prefix + "/" + child;
    if (!group.is_dataset(child)) {
      Values below = values;
      if (depth == 0 && (child == kModelWeights)) below = Values::kFinite;
      if (depth == 0 && (child == kOptimizerWeights)) below = Values::kOptimizer;
      if (depth == 1 && prefix == kTrainingState && child == "loss_scale") below = Values::kFinite;
      if (depth == 1 && prefix == kTrainingState && child == "grad_accum" && !walk.loss_scaled)
        below = Values::kFinite;
      // Inside a region the names are relative to it (the optimizer's "v/...").
      const bool region = below != values;
      read_everything(group.open_group(child), below, walk, region ? "" : name, depth + 1);
      continue;
    }
    const Tensor value = group.read_tensor(child);
    if (values != Values::kAny)
      check_values(location(group, child), value,
                   /*non_negative=*/values == Values::kOptimizer && name.starts_with("v/"),
                   "the second moment v is an average of squares");
  }
}

/// Raises unless every name of `listed` (the attribute `attribute`) is a child of `group`, once:
/// a link removed or renamed after the file was written. `only_listed`: nor may it have others
/// (a metric's group holds its variables and nothing else; elsewhere readers ignore what they
/// do not know, docs/checkpoint-format.md).
void check_listed(const h5::Group& group, const std::vector<std::string>& listed,
                  const std::string& attribute, bool only_listed = false) {
  const std::set<std::string> names(listed.begin(), listed.end());
  TANDEM_CHECK(names.size() == listed.size(), group.file(), ":", group.path(), ": its attribute ",
               attribute, " names an entry twice; the file is damaged");
  for (const std::string& name : listed)
    TANDEM_CHECK(group.exists(name), location(group, name), " is listed in ", attribute,
                 " but missing; the file is damaged");
  if (!only_listed) return;
  for (const std::string& child : group.children())
    TANDEM_CHECK(names.contains(child), location(group, child), " is not listed in ", attribute,
                 " of its group; the file is damaged");
}

void check_dataset(const h5::Group& group, const std::string& name) {
  TANDEM_CHECK(group.is_dataset(name), location(group, name),
               " is a group where a dataset belongs; the file is damaged");
}

/// An int64 scalar dataset (a counter, a step).
int64_t read_int64_scalar(const h5::Group& group, const std::string& name) {
  check_dataset(group, name);
  TANDEM_CHECK(group.dataset_dtype(name) == DType::kInt64, location(group, name), " is ",
               group.dataset_dtype(name), "; an int64 is stored there");
  return group.read_scalar_int64(name);
}

/// The shape and dtype of each variable of the file's model, by its dataset's name
/// ("dense/kernel:0"): what its optimizer slots and accumulators must have too.
using VariableShapes = std::map<std::string, std::pair<Shape, DType>>;

VariableShapes validate_model_weights(const h5::Group& weights) {
  VariableShapes variables;
  const std::vector<std::string> layers = weights.read_attr_strings("layer_names");
  check_listed(weights, layers, "layer_names");
  for (const std::string& layer : layers) {
    TANDEM_CHECK(!weights.is_dataset(layer), location(weights, layer),
                 " is a dataset where a layer's group belongs; the file is damaged");
    const h5::Group group = weights.open_group(layer);
    const std::vector<std::string> names = group.read_attr_strings("weight_names");
    check_listed(group, names, "weight_names");
    for (const std::string& name : names) {
      check_dataset(group, name);
      variables[name] = {group.dataset_shape(name), group.dataset_dtype(name)};
    }
  }
  return variables;
}

/// Raises unless the dataset `name` of `group`, a slot or an accumulator of the variable
/// `variable` ("dense/kernel:0"), has that variable's shape and dtype when the file's model has
/// it.
void check_like_variable(const h5::Group& group, const std::string& name,
                         const std::string& variable, const VariableShapes& variables) {
  const auto it = variables.find(variable);
  if (it == variables.end()) return;
  const Shape shape = group.dataset_shape(name);
  const DType dtype = group.dataset_dtype(name);
  TANDEM_CHECK(shape == it->second.first && dtype == it->second.second, location(group, name),
               " is ", dtype, " ", shape, " but its variable /", kModelWeights, "/.../", variable,
               " is ", it->second.second, " ", it->second.first, "; the file is damaged");
}

void validate_optimizer(const h5::Group& optimizer, const VariableShapes& variables) {
  optimizer.read_attr_string("optimizer");
  const std::vector<std::string> names = optimizer.read_attr_strings("weight_names");
  check_listed(optimizer, names, "weight_names");
  TANDEM_CHECK(std::find(names.begin(), names.end(), kIterationName) != names.end(),
               location(optimizer, kIterationName), " is missing; the file is damaged");
  check_counter(location(optimizer, kIterationName), read_int64_scalar(optimizer, kIterationName));
  for (const std::string& name : names) {
    check_dataset(optimizer, name);
    // "m/dense/kernel:0": the slot m of the variable dense/kernel:0.
    const size_t slash = name.find('/');
    if (slash != std::string::npos)
      check_like_variable(optimizer, name, name.substr(slash + 1), variables);
  }
}

/// Every dataset below `group` by its path below the group ("dense/kernel:0").
std::vector<std::string> datasets_below(const h5::Group& group, const std::string& prefix = "") {
  std::vector<std::string> out;
  for (const std::string& child : group.children()) {
    const std::string name = prefix.empty() ? child : prefix + "/" + child;
    if (group.is_dataset(child)) {
      out.push_back(name);
    } else {
      for (std::string& below : datasets_below(group.open_group(child), name))
        out.push_back(std::move(below));
    }
  }
  return out;
}

void validate_training_state(const h5::Group& state, const VariableShapes& variables) {
  for (const char* name : kStandardCounters)
    if (state.exists(name)) check_counter(location(state, name), read_int64_scalar(state, name));
  if (state.exists("counters")) {
    const h5::Group counters = state.open_group("counters");
    for (const std::string& name : counters.children()) {
      check_dataset(counters, name);
      const DType dtype = counters.dataset_dtype(name);
      TANDEM_CHECK(dtype == DType::kInt64 || dtype == DType::kFloat64 || dtype == DType::kFloat32,
                   location(counters, name), " is ", dtype,
                   "; a counter is int64, float64 or float32");
      TANDEM_CHECK(counters.dataset_shape(name).numel() == 1, location(counters, name),
                   " has shape ", counters.dataset_shape(name), "; a counter is one value");
    }
  }
  if (state.exists("grad_accum")) {
    const h5::Group accumulation = state.open_group("grad_accum");
    if (accumulation.exists("micro_step")) {
      const int64_t micro_step = read_int64_scalar(accumulation, "micro_step");
      const int64_t steps = accumulation.has_attr("gradient_accumulation_steps")
                                ? accumulation.read_attr_int64("gradient_accumulation_steps")
                                : 1;
      TANDEM_CHECK(steps >= 1, location(accumulation, "gradient_accumulation_steps"), " is ", steps,
                   "; the file is damaged");
      TANDEM_CHECK(micro_step >= 0 && (micro_step == 0 || micro_step < steps),
                   location(accumulation, "micro_step"), " is ", micro_step,
                   ", outside [0, gradient_accumulation_steps = ", steps, "); the file is damaged");
    }
    // The accumulators, "dense/kernel:0" for the variable dense/kernel:0 (walked once: the
    // walk above has refused cycles).
    for (const std::string& name : datasets_below(accumulation))
      if (name != "micro_step") check_like_variable(accumulation, name, name, variables);
  }
  if (state.exists("loss_scale")) {
    const h5::Group loss_scale = state.open_group("loss_scale");
    check_dataset(loss_scale, "scale");
    const Tensor scale = loss_scale.read_tensor("scale");
    TANDEM_CHECK(scale.numel() == 1 && scale.dtype() == DType::kFloat32,
                 location(loss_scale, "scale"), " is not a float32 scalar; the file is damaged");
    const double value = scale.item<double>();
    TANDEM_CHECK(value > 0, location(loss_scale, "scale"), " is ", value,
                 ", not a finite positive loss scale; the file is damaged");
    const int64_t good_steps = read_int64_scalar(loss_scale, "good_steps");
    TANDEM_CHECK(good_steps >= 0, location(loss_scale, "good_steps"), " is ", good_steps,
                 ", below 0; the file is damaged");
  }
  if (state.exists("data")) {
    const h5::Group data = state.open_group("data");
    for (const std::string& name : data.children()) {
      const h5::Group d = data.open_group(name);
      d.read_attr_string("kind");
      check_counter(location(d, "epoch"), d.read_attr_int64("epoch"));
      if (d.has_attr("num_replicas")) {
        const int64_t replicas = d.read_attr_int64("num_replicas");
        TANDEM_CHECK(replicas >= 0, location(d, "num_replicas"), " is ", replicas,
                     "; the file is damaged");
      }
      check_listed(d, d.read_attr_strings("entry_names"), "entry_names");
      read_iterator_state(d);
    }
  }
  if (state.exists("rng/replica_state")) {
    const Shape shape = state.dataset_shape("rng/replica_state");
    TANDEM_CHECK(shape.rank() == 2 && shape[1] == 4, location(state, "rng/replica_state"),
                 " has shape ", shape, ", expected [R, 4]");
    const std::optional<std::string> algorithm =
        state.read_attr_string_of("rng/replica_state", "algorithm");
    TANDEM_CHECK(algorithm.value_or(kRngAlgorithm) == kRngAlgorithm,
                 location(state, "rng/replica_state"), " uses algorithm \"", *algorithm,
                 "\"; this build has ", kRngAlgorithm);
    state.read_u64("rng/replica_state");
  }
  if (state.exists("metrics")) {
    const h5::Group metrics = state.open_group("metrics");
    for (const std::string& name : metrics.children()) {
      const h5::Group m = metrics.open_group(name);
      if (m.has_attr(detail::kMetricVariables))
        check_listed(m, m.read_attr_strings(detail::kMetricVariables), detail::kMetricVariables,
                     /*only_listed=*/true);
      verify_metric_state(m);
    }
  }
  if (state.exists(detail::kUserState)) {
    const h5::Group user = state.open_group(detail::kUserState);
    for (const std::string& name : user.children()) {
      const h5::Group object = user.open_group(name);
      for (const std::string& key : object.children()) check_dataset(object, key);
    }
  }
}

}  // namespace

namespace detail {

void validate_checkpoint(const h5::Group& root, const std::string& path,
                         const std::function<std::string()>& model_difference) {
  TANDEM_CHECK(
      root.has_attr("tandem_format") && root.read_attr_string("tandem_format") == kFormatName, path,
      ": not a Tandem checkpoint (no tandem_format=\"", kFormatName, "\" attribute at the root)");
  TANDEM_CHECK(root.has_attr("tandem_format_version"), path,
               ": not a Tandem checkpoint (no tandem_format_version attribute)");
  const int64_t version = root.read_attr_int64("tandem_format_version");
  if (version > kCheckpointFormatVersion)
    mismatch(path, str_cat("written in checkpoint format version ", version,
                           ", but this build of Tandem reads versions up to ",
                           kCheckpointFormatVersion, "; restore it with a newer Tandem"));
  TANDEM_CHECK(version >= 1, path, ": invalid tandem_format_version ", version);
  for (const char* group : {kModelWeights, kTrainingState}) require_group(root, group, path);
  TANDEM_CHECK(root.has_attr("model_signature"), path,
               ": incomplete checkpoint: the root has no model_signature attribute");
  std::string difference;
  if (model_difference) {
    try {
      difference = model_difference();
    } catch (const std::exception&) {
      // The file's own layout is checked below, with its own message.
    }
  }
  check_own_signature(root, path, difference);
  Walk walk;
  walk.loss_scaled = root.exists(std::string(kTrainingState) + "/loss_scale");
  read_everything(root, Values::kAny, walk, "", 0);
  const VariableShapes variables = validate_model_weights(root.open_group(kModelWeights));
  if (root.exists(kOptimizerWeights))
    validate_optimizer(root.open_group(kOptimizerWeights), variables);
  validate_training_state(root.open_group(kTrainingState), variables);
}

}  // namespace detail

std::string verify_checkpoint(const std::string& path) {
  try {
    h5::File file = detail::open_checkpoint(path);
    detail::validate_checkpoint(file.root(), path);
    return "";
  } catch (const std::exception& e) {
    return e.what();
  }
}

}  // namespace tandem
