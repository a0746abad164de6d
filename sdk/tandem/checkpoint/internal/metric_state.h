// A metric's saved state (/training_state/metrics/<name>: total and count) as restoring and
// verifying a checkpoint read it: checked, so that a damaged value is named, never restored.
// Internal to the checkpoint layer.
#pragma once

#include <cmath>

#include "tandem/checkpoint/internal/layout.h"
#include "tandem/core/error.h"
#include "tandem/io/internal/hdf5_file.h"
#include "tandem/metrics/metrics.h"

namespace tandem::detail {

/// Reads the total and count of the metric group `m`; raises naming the value unless the total
/// is finite and the count a finite count >= 0 (the checkpoint is damaged).
inline metrics::MetricState read_metric_state(const h5::Group& m) {
  const double total = m.read_scalar_float64("total");
  const double count = m.read_scalar_float64("count");
  TANDEM_CHECK(std::isfinite(total), location(m, "total"), " is ", total,
               ", not finite; the checkpoint is damaged");
  TANDEM_CHECK(std::isfinite(count) && count >= 0, location(m, "count"), " is ", count,
               ", not a finite count >= 0; the checkpoint is damaged");
  return {total, count};
}

}  // namespace tandem::detail
