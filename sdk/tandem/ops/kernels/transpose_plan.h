// How a transpose is simplified before a kernel runs, shared by the CPU and CUDA kernels:
// axes of size 1 are dropped and runs of input axes that stay consecutive in the output merge.
#pragma once

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

namespace tandem::ops {

/// The merged transpose: output axis i has size out_dims[i] and steps src_strides[i] elements
/// through the input. One axis or none means the transpose is a plain copy.
struct TransposePlan {
  std::vector<int64_t> out_dims;
  std::vector<int64_t> src_strides;
};

inline TransposePlan plan_transpose(const std::vector<int64_t>& dims,
                                    const std::vector<int64_t>& perm) {
  std::vector<int64_t> kept(dims.size(), -1);  // input axis -> index among the kept axes
  std::vector<int64_t> kept_dims;
  for (size_t a = 0; a < dims.size(); ++a) {
    if (dims[a] == 1) continue;
    kept[a] = static_cast<int64_t>(kept_dims.size());
    kept_dims.push_back(dims[a]);
  }
  // Groups of input axes, in output order: [first input axis, last input axis].
  std::vector<std::pair<int64_t, int64_t>> groups;
  for (int64_t p : perm) {
    if (kept[p] < 0) continue;
    if (!groups.empty() && groups.back().second + 1 == kept[p])
      groups.back().second = kept[p];
    else
      groups.push_back({kept[p], kept[p]});
  }
  TransposePlan plan;
  if (groups.size() <= 1) {
    plan.out_dims.assign(groups.size(), 0);
    return plan;
  }
  // The groups in input order give the merged input shape; output axis i reads group g_i.
  std::vector<std::pair<int64_t, int64_t>> by_input = groups;
  std::sort(by_input.begin(), by_input.end());
  std::vector<int64_t> merged_dims, merged_strides(by_input.size());
  for (const auto& [first, last] : by_input) {
    int64_t d = 1;
    for (int64_t a = first; a <= last; ++a) d *= kept_dims[a];
    merged_dims.push_back(d);
  }
  for (size_t g = by_input.size(), stride = 1; g-- > 0;) {
    merged_strides[g] = static_cast<int64_t>(stride);
    stride *= static_cast<size_t>(merged_dims[g]);
  }
  for (const auto& group : groups) {
    const size_t g = static_cast<size_t>(std::lower_bound(by_input.begin(), by_input.end(), group) -
                                         by_input.begin());
    plan.out_dims.push_back(merged_dims[g]);
    plan.src_strides.push_back(merged_strides[g]);
  }
  return plan;
}

}  // namespace tandem::ops
