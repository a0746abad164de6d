// ParameterLayout: contiguous ranges of about equal bytes per replica, cut on block boundaries.
#include "tandem/optim/parameter_layout.h"

#include <algorithm>

#include "tandem/core/error.h"

namespace tandem::optim {

ParameterLayout::ParameterLayout(const std::vector<int64_t>& numels,
                                 const std::vector<int64_t>& element_bytes, int replicas,
                                 int64_t block)
    : replicas_(replicas) {
  TANDEM_CHECK(replicas >= 1, "ParameterLayout: replicas must be >= 1, got ", replicas);
  TANDEM_CHECK(block >= 1, "ParameterLayout: block must be >= 1 element, got ", block);
  TANDEM_CHECK(numels.size() == element_bytes.size(), "ParameterLayout: ", numels.size(),
               " sizes but ", element_bytes.size(), " element sizes");
  // Every place a cut may fall, in bytes from the first variable's start (nondecreasing).
  std::vector<int64_t> starts;
  std::vector<int64_t> boundaries;
  int64_t at = 0;
  for (size_t i = 0; i < numels.size(); ++i) {
    TANDEM_CHECK(numels[i] >= 0, "ParameterLayout: variable ", i, " has ", numels[i], " elements");
    TANDEM_CHECK(element_bytes[i] >= 1, "ParameterLayout: variable ", i, " has elements of ",
                 element_bytes[i], " bytes");
    starts.push_back(at);
    for (int64_t e = 0; e < numels[i]; e += block) boundaries.push_back(at + e * element_bytes[i]);
    at += numels[i] * element_bytes[i];
  }
  boundaries.push_back(at);
  const int64_t total = at;
  // Cut r: the boundary b nearest r * total / replicas, compared as |b * replicas - r * total|
  // (integers), the lower one on a tie.
  cuts_.assign(static_cast<size_t>(replicas) + 1, 0);
  cuts_.back() = total;
  for (int r = 1; r < replicas; ++r) {
    const int64_t target = static_cast<int64_t>(r) * total;
    const auto above = std::lower_bound(
        boundaries.begin(), boundaries.end(), target,
        [&](int64_t b, int64_t t) { return b * static_cast<int64_t>(replicas) < t; });
    int64_t best = above == boundaries.end() ? total : *above;
    if (above != boundaries.begin()) {
      const int64_t below = *std::prev(above);
      if (target - below * replicas <= best * replicas - target) best = below;
    }
    cuts_[static_cast<size_t>(r)] = std::max(best, cuts_[static_cast<size_t>(r) - 1]);
  }
  // Each variable's intersection with each replica's range.
  parts_.resize(numels.size());
  for (size_t i = 0; i < numels.size(); ++i) {
    const int64_t begin = starts[i];
    const int64_t end = begin + numels[i] * element_bytes[i];
    for (int r = 0; r < replicas; ++r) {
      const int64_t from = std::max(begin, cut(r));
      const int64_t to = std::min(end, cut(r + 1));
      if (from >= to) continue;
      parts_[i].push_back({.owner = r,
                           .begin = (from - begin) / element_bytes[i],
                           .end = (to - begin) / element_bytes[i]});
    }
    if (parts_[i].empty()) {
      // No bytes: the replica whose range holds its start (the last one at the very end).
      int owner = replicas - 1;
      for (int r = 0; r < replicas; ++r)
        if (begin < cut(r + 1)) {
          owner = r;
          break;
        }
      parts_[i].push_back({.owner = owner, .begin = 0, .end = 0});
    }
  }
}

}  // namespace tandem::optim
