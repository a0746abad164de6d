// ParameterLayout: contiguous runs of whole variables of about equal bytes per replica.
#include "tandem/optim/parameter_layout.h"

#include <algorithm>

#include "tandem/core/error.h"

namespace tandem::optim {

ParameterLayout::ParameterLayout(std::vector<int64_t> bytes, int replicas) : replicas_(replicas) {
  TANDEM_CHECK(replicas >= 1, "ParameterLayout: replicas must be >= 1, got ", replicas);
  offsets_.reserve(bytes.size() + 1);
  offsets_.push_back(0);
  for (size_t i = 0; i < bytes.size(); ++i) {
    TANDEM_CHECK(bytes[i] >= 0, "ParameterLayout: variable ", i, " has ", bytes[i], " bytes");
    offsets_.push_back(offsets_.back() + bytes[i]);
  }
  const int64_t total = offsets_.back();
  owners_.reserve(bytes.size());
  for (size_t i = 0; i < bytes.size(); ++i) {
    // The share that holds the variable's middle: floor((start + size / 2) * R / total), in
    // integers (twice over, so that odd sizes need no fraction). Nondecreasing in i, so each
    // replica's variables are contiguous.
    const int64_t middle_twice = 2 * offsets_[i] + bytes[i];
    const int64_t share = total == 0 ? 0 : middle_twice * replicas / (2 * total);
    owners_.push_back(static_cast<int>(std::min<int64_t>(share, replicas - 1)));
  }
}

int64_t ParameterLayout::bytes_owned(int r) const {
  int64_t out = 0;
  for (size_t i = 0; i < owners_.size(); ++i)
    if (owners_[i] == r) out += offsets_[i + 1] - offsets_[i];
  return out;
}

}  // namespace tandem::optim
