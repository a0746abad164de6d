// 16-bit arrays widened to float32 and float32 arrays rounded back: how the CPU kernels without a
// 16-bit implementation (float16 everywhere; bfloat16 where oneDNN has none) compute in float32.
#pragma once

#include <cstdint>
#include <vector>

#include "tandem/core/half.h"
#include "tandem/ops/cpu/half_convert.h"
#include "tandem/ops/cpu/parallel.h"

namespace tandem::ops::cpu {

/// x [0, n) as float32 (exact); empty for a null x.
template <typename H>
std::vector<float> widen(const H* x, int64_t n) {
  if (x == nullptr) return {};
  std::vector<float> out(static_cast<size_t>(n));
  parallel_for(n, kElementwiseGrain, [&](int64_t begin, int64_t end) {
    convert(x + begin, out.data() + begin, end - begin);
  });
  return out;
}

/// y = x rounded to H (nearest, ties to even).
template <typename H>
void narrow(const std::vector<float>& x, H* y) {
  parallel_for(static_cast<int64_t>(x.size()), kElementwiseGrain, [&](int64_t begin, int64_t end) {
    convert(x.data() + begin, y + begin, end - begin);
  });
}

/// The data of a widened array, or null for an empty one that stands for a null pointer.
inline const float* data_or_null(const std::vector<float>& v) {
  return v.empty() ? nullptr : v.data();
}

}  // namespace tandem::ops::cpu
