// A metric's saved state (/training_state/metrics/<name>/<variable>: one float64 dataset per
// state variable of the metric) as writing, restoring and verifying a checkpoint see it:
// checked, so that a damaged value is named, never restored. Internal to the checkpoint layer.
#pragma once

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "tandem/checkpoint/internal/layout.h"
#include "tandem/core/error.h"
#include "tandem/io/internal/hdf5_file.h"
#include "tandem/metrics/metric.h"

namespace tandem::detail {

/// The group attribute listing the metric's variables in order, and the one listing those that
/// are counts (>= 0). Files written before metrics had general state lack both: their metric
/// groups hold total and count, and count is the count.
inline constexpr const char* kMetricVariables = "variable_names";
inline constexpr const char* kMetricCounts = "non_negative";

/// Raises naming the dataset unless every value is finite, and >= 0 for a count.
inline void check_metric_values(const h5::Group& m, const std::string& name,
                                const std::vector<double>& values, bool non_negative) {
  for (size_t i = 0; i < values.size(); ++i) {
    if (std::isfinite(values[i]) && (!non_negative || values[i] >= 0)) continue;
    const std::string index = values.size() > 1 ? str_cat("[", i, "]") : std::string();
    TANDEM_THROW(location(m, name), index, " is ", values[i],
                 non_negative ? ", not a finite count >= 0" : ", not finite",
                 "; the checkpoint is damaged");
  }
}

/// Reads the state of `metric` from its group `m` and checks it against the metric: every
/// variable present with the metric's shape (else CheckpointMismatchError naming the metric,
/// the dataset and both shapes: the file holds another metric), no variable the metric lacks,
/// every value finite and every count >= 0 (else an Error naming the dataset).
inline metrics::MetricState read_metric_state(const h5::Group& m, const metrics::Metric& metric,
                                              const std::string& path) {
  metrics::MetricState::Values values;
  for (const metrics::MetricVariable& v : metric.variables()) {
    if (!m.exists(v.name))
      mismatch(path, str_cat("metric \"", metric.name(), "\" has a variable \"", v.name,
                             "\" (shape ", v.shape, ") that ", location(m, v.name),
                             " does not hold: the checkpoint's metric is another kind"));
    const Shape stored = m.dataset_shape(v.name);
    if (stored != v.shape)
      mismatch(path, str_cat(location(m, v.name), " has shape ", stored, " but metric \"",
                             metric.name(), "\"'s variable \"", v.name, "\" has shape ", v.shape));
    std::vector<double> read = m.read_tensor(v.name).to_vector<double>();
    check_metric_values(m, v.name, read, v.non_negative);
    values.emplace_back(v.name, std::move(read));
  }
  for (const std::string& child : m.children()) {
    const bool known =
        std::any_of(metric.variables().begin(), metric.variables().end(),
                    [&](const metrics::MetricVariable& v) { return v.name == child; });
    if (!known)
      mismatch(path, str_cat(location(m, child), " is a variable that metric \"", metric.name(),
                             "\" does not have: the checkpoint's metric is another kind"));
  }
  return metrics::MetricState(std::move(values));
}

/// Reads every variable of the metric group `m` without the metric (verify_checkpoint): each
/// finite, the counts (from the group's attribute; `count` in older files) >= 0.
inline void verify_metric_state(const h5::Group& m) {
  std::vector<std::string> counts = {"count"};
  if (m.has_attr(kMetricVariables))
    counts =
        m.has_attr(kMetricCounts) ? m.read_attr_strings(kMetricCounts) : std::vector<std::string>{};
  if (!m.has_attr(kMetricVariables)) {
    // The older layout: exactly total and count, scalars.
    check_metric_values(m, "total", {m.read_scalar_float64("total")}, false);
    check_metric_values(m, "count", {m.read_scalar_float64("count")}, true);
    return;
  }
  for (const std::string& name : m.read_attr_strings(kMetricVariables)) {
    const bool non_negative = std::find(counts.begin(), counts.end(), name) != counts.end();
    check_metric_values(m, name, m.read_tensor(name).to_vector<double>(), non_negative);
  }
}

}  // namespace tandem::detail
