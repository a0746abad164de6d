// inspect_checkpoint: walks a checkpoint file through the HDF5 wrapper and prints its layout
// (docs/checkpoint-format.md) in a fixed, readable order.
#include "tandem/checkpoint/inspect.h"

#include <iomanip>
#include <sstream>

#include "tandem/checkpoint/checkpoint.h"
#include "tandem/checkpoint/internal/layout.h"
#include "tandem/io/internal/hdf5_file.h"

namespace tandem {

namespace {

std::string describe_dataset(const h5::Group& group, const std::string& name) {
  return detail::str_cat(group.dataset_type_name(name), " ", group.dataset_shape(name));
}

int64_t scalar_int64(const h5::Group& group, const std::string& name) {
  return group.read_scalar_int64(name);
}

std::string attr_or(const h5::Group& group, const std::string& name, const std::string& fallback) {
  return group.has_attr(name) ? group.read_attr_string(name) : fallback;
}

/// Pads `text` to `width` columns (names line up in the listing).
std::string pad(const std::string& text, size_t width) {
  return text.size() >= width ? text + " " : text + std::string(width - text.size(), ' ');
}

void describe_model(const h5::Group& root, std::ostringstream& out) {
  if (!root.exists("model_weights")) {
    out << "model_weights: missing\n";
    return;
  }
  const h5::Group weights = root.open_group("model_weights");
  const std::vector<std::string> layers = weights.read_attr_strings("layer_names");
  std::ostringstream body;
  int64_t parameters = 0;
  for (const std::string& layer : layers) {
    const h5::Group group = weights.open_group(layer);
    const std::vector<std::string> names = group.read_attr_strings("weight_names");
    if (names.empty()) body << "  " << pad(layer, 16) << "(no weights)\n";
    for (size_t i = 0; i < names.size(); ++i) {
      parameters += group.dataset_shape(names[i]).numel();
      body << "  " << pad(i == 0 ? layer : "", 16) << pad(names[i], 24)
           << describe_dataset(group, names[i]) << "\n";
    }
  }
  out << "model_weights (Keras " << attr_or(weights, "keras_version", "?") << " layout, "
      << layers.size() << " layers, " << parameters << " parameters)\n"
      << body.str();
}

void describe_optimizer(const h5::Group& root, std::ostringstream& out) {
  if (!root.exists("optimizer_weights")) {
    out << "optimizer: none\n";
    return;
  }
  const h5::Group group = root.open_group("optimizer_weights");
  out << "optimizer " << attr_or(group, "optimizer", "?") << ", iterations "
      << scalar_int64(group, "iteration:0") << "\n";
  out << "  config " << attr_or(group, "config_json", "{}") << "\n";
  const std::vector<std::string> names = group.read_attr_strings("weight_names");
  bool first = true;
  for (const std::string& name : names) {
    if (name == "iteration:0") continue;
    out << "  " << pad(first ? "slots" : "", 7) << pad(name, 26) << describe_dataset(group, name)
        << "\n";
    first = false;
  }
  if (first) out << "  slots  (none yet: no update was applied)\n";
}

void describe_training_state(const h5::Group& root, std::ostringstream& out) {
  if (!root.exists("training_state")) {
    out << "training_state: missing\n";
    return;
  }
  const h5::Group group = root.open_group("training_state");
  out << "training_state\n ";
  for (const char* name : {"global_step", "epoch", "step_in_epoch", "samples_seen"})
    if (group.exists(name)) out << " " << name << " " << scalar_int64(group, name);
  out << "\n";
  if (group.exists("counters")) {
    const h5::Group counters = group.open_group("counters");
    for (const std::string& name : counters.children()) {
      out << "  " << pad("counters/" + name, 26);
      if (counters.dataset_dtype(name) == DType::kInt64)
        out << scalar_int64(counters, name) << "\n";
      else  // the program's float64 / float32 numbers, to their last digit
        out << detail::str_cat(std::setprecision(17), counters.read_scalar_float64(name)) << " ("
            << counters.dataset_dtype(name) << ")\n";
    }
  }
  if (group.exists("user")) {  // TrackedState objects: each key's dtype and shape
    const h5::Group user = group.open_group("user");
    for (const std::string& name : user.children()) {
      const h5::Group state = user.open_group(name);
      out << "  " << pad("user/" + name, 26);
      const std::vector<std::string> keys = state.children();
      for (size_t i = 0; i < keys.size(); ++i)
        out << (i ? ", " : "") << keys[i] << " " << describe_dataset(state, keys[i]);
      out << "\n";
    }
  }
  if (group.exists("data")) {
    const h5::Group data = group.open_group("data");
    for (const std::string& name : data.children()) {
      const h5::Group d = data.open_group(name);
      const std::string kind = attr_or(d, "kind", "?");
      out << "  " << pad("data/" + name, 26) << kind;
      if (d.has_attr("num_replicas"))
        out << ", " << d.read_attr_int64("num_replicas") << " replicas";
      if (d.has_attr("epoch")) out << ", epoch " << d.read_attr_int64("epoch");
      out << "\n";
      for (const std::string& entry : d.read_attr_strings("entry_names")) {
        const Shape shape = d.dataset_shape(entry);
        out << "    " << pad(entry, 28) << "int64 " << shape;
        if (shape.numel() <= 4) {
          const std::vector<int64_t> values = d.read_tensor(entry).to_vector<int64_t>();
          out << " = {";
          for (size_t i = 0; i < values.size(); ++i) out << (i ? ", " : "") << values[i];
          out << "}";
        }
        out << "\n";
      }
    }
  }
  if (group.exists("rng/replica_state")) {
    out << "  " << pad("rng/replica_state", 26) << describe_dataset(group, "rng/replica_state")
        << " " << group.read_attr_string_of("rng/replica_state", "algorithm").value_or("?") << "\n";
  }
  if (group.exists("metrics")) {
    const h5::Group metrics = group.open_group("metrics");
    for (const std::string& name : metrics.children()) {
      const h5::Group m = metrics.open_group(name);
      out << "  " << pad("metrics/" + name, 26);
      if (m.exists("total") && m.exists("count")) {  // the means (Mean, accuracies)
        const double total = m.read_scalar_float64("total");
        const double count = m.read_scalar_float64("count");
        out << "total " << total << ", count " << count;
        if (count > 0) out << " (mean " << std::setprecision(6) << total / count << ")";
      } else {  // other state: each variable's shape
        const std::vector<std::string> variables = m.children();
        for (size_t i = 0; i < variables.size(); ++i)
          out << (i ? ", " : "") << variables[i] << " " << m.dataset_shape(variables[i]);
      }
      out << "\n";
    }
  }
  if (group.exists("grad_accum/micro_step")) {
    const h5::Group accumulation = group.open_group("grad_accum");
    out << "  " << pad("grad_accum/micro_step", 26) << scalar_int64(accumulation, "micro_step");
    if (accumulation.has_attr("gradient_accumulation_steps")) {
      const int64_t steps = accumulation.read_attr_int64("gradient_accumulation_steps");
      if (steps > 1) out << " of " << steps;
    }
    // Besides micro_step, the groups of the stored accumulators (present mid-accumulation).
    if (accumulation.children().size() > 1) out << " (accumulators stored)";
    out << "\n";
  }
  if (group.exists("loss_scale/scale")) {
    const h5::Group loss_scale = group.open_group("loss_scale");
    out << "  " << pad("loss_scale", 26) << "scale "
        << loss_scale.read_tensor("scale").item<double>() << ", good_steps "
        << scalar_int64(loss_scale, "good_steps") << "\n";
  }
}

}  // namespace

std::string inspect_checkpoint(const std::string& path) {
  h5::File file = detail::open_checkpoint(path);
  const h5::Group& root = file.root();
  TANDEM_CHECK(root.has_attr("tandem_format") &&
                   root.read_attr_string("tandem_format") == "tandem.checkpoint",
               path,
               ": not a Tandem checkpoint (no tandem_format=\"tandem.checkpoint\" attribute)");
  std::ostringstream out;
  const int64_t version = root.read_attr_int64("tandem_format_version");
  out << path << "\n";
  out << "  format          tandem.checkpoint version " << version;
  if (version > kCheckpointFormatVersion)
    out << " (newer than this build reads: " << kCheckpointFormatVersion << ")";
  out << "\n  written by      Tandem " << attr_or(root, "tandem_version", "?") << " at "
      << attr_or(root, "created_utc", "?") << "\n";
  out << "  replicas        "
      << (root.has_attr("num_replicas") ? root.read_attr_int64("num_replicas") : 0) << " on "
      << (root.has_attr("num_workers") ? root.read_attr_int64("num_workers") : 0)
      << " worker(s), backend " << attr_or(root, "backend", "?") << "\n";
  out << "  model_signature " << attr_or(root, "model_signature", "?") << "\n";
  out << "  checksums       "
      << (root.has_attr("tandem_checksums")
              ? attr_or(root, "tandem_checksums", "?") + " on every dataset with data"
              : std::string("none (written before checkpoints carried them)"))
      << "\n";
  if (root.exists("training_state/global_step"))
    out << "  step            " << scalar_int64(root.open_group("training_state"), "global_step")
        << "\n";
  out << "\n";
  describe_model(root, out);
  out << "\n";
  describe_optimizer(root, out);
  out << "\n";
  describe_training_state(root, out);
  return out.str();
}

bool checkpoint_has_checksums(const std::string& path) {
  return detail::open_checkpoint(path).root().has_attr("tandem_checksums");
}

}  // namespace tandem
