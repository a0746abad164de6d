// replica_list: how the collectives and the strategies name a set of replicas in their messages.
#pragma once

#include <sstream>
#include <string>
#include <vector>

namespace tandem::detail {

/// "replica 2" or "replicas 0, 3".
inline std::string replica_list(const std::vector<int>& ids) {
  std::ostringstream out;
  out << (ids.size() == 1 ? "replica " : "replicas ");
  for (size_t i = 0; i < ids.size(); ++i) out << (i ? ", " : "") << ids[i];
  return out.str();
}

}  // namespace tandem::detail
