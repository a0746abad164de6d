// 16-bit arrays widened to float32 and float32 arrays rounded back: how the CPU kernels without a
// 16-bit implementation (float16 everywhere; bfloat16 where oneDNN has none) compute in float32.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>

#include "tandem/core/half.h"
#include "tandem/ops/cpu/half_convert.h"
#include "tandem/ops/cpu/parallel.h"

namespace tandem::ops::cpu {

/// A float32 array from the calling thread's pool: returned to it when destroyed and reused by
/// the next buffer that fits, so the widened copies of every step do not allocate, zero and
/// fault in their pages again. Its elements start unset. Size 0: data() is null.
class FloatBuffer {
 public:
  explicit FloatBuffer(int64_t n);
  ~FloatBuffer();
  FloatBuffer(FloatBuffer&& other) noexcept;
  FloatBuffer(const FloatBuffer&) = delete;
  FloatBuffer& operator=(const FloatBuffer&) = delete;
  FloatBuffer& operator=(FloatBuffer&&) = delete;

  float* data() const { return size_ > 0 ? storage_.get() : nullptr; }
  int64_t size() const { return size_; }

 private:
  std::unique_ptr<float[]> storage_;
  int64_t capacity_ = 0;
  int64_t size_ = 0;
};

/// x [0, n) as float32 (exact); size 0 (data() null) for a null x.
template <typename H>
FloatBuffer widen(const H* x, int64_t n) {
  FloatBuffer out(x == nullptr ? 0 : n);
  if (x == nullptr) return out;
  float* to = out.data();
  parallel_for(n, kElementwiseGrain,
               [&](int64_t begin, int64_t end) { convert(x + begin, to + begin, end - begin); });
  return out;
}

/// x [rows, columns] (row-major, dense) as float32 rows `stride` apart (stride >= columns; the
/// floats between rows are left unset).
template <typename H>
FloatBuffer widen_rows(const H* x, int64_t rows, int64_t columns, int64_t stride) {
  if (stride == columns) return widen(x, rows * columns);
  FloatBuffer out(rows * stride);
  float* to = out.data();
  const int64_t grain = std::max<int64_t>(1, kElementwiseGrain / std::max<int64_t>(columns, 1));
  parallel_for(rows, grain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) convert(x + i * columns, to + i * stride, columns);
  });
  return out;
}

/// y [0, x.size()) = x rounded to H (nearest, ties to even).
template <typename H>
void narrow(const FloatBuffer& x, H* y) {
  const float* from = x.data();
  parallel_for(x.size(), kElementwiseGrain,
               [&](int64_t begin, int64_t end) { convert(from + begin, y + begin, end - begin); });
}

}  // namespace tandem::ops::cpu
