// Internal: formats doubles for the optimizers' and schedules' config JSON.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>

namespace tandem::optim::detail {

/// The shortest %g text that reads back as exactly `value` ("0.9", "1e-07").
inline std::string json_number(double value) {
  char buffer[32];
  for (int precision = 1; precision <= 17; ++precision) {
    std::snprintf(buffer, sizeof(buffer), "%.*g", precision, value);
    if (std::strtod(buffer, nullptr) == value) break;
  }
  return buffer;
}

}  // namespace tandem::optim::detail
