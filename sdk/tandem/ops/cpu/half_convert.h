// Conversions between float32 arrays and the 16-bit floating types, each loop built for AVX-512
// (x86-64-v4), AVX2 (x86-64-v3, with F16C) and the baseline, run as cpu_isa() says
// (TANDEM_MAX_CPU_ISA caps it). All give the same bits (round to nearest, ties to even, NaN kept
// quiet).
// The baseline has no instruction that narrows 32-bit lanes to 16, so its narrowing loops run
// an element at a time.
#pragma once

#include <cstdint>

#include "tandem/core/half.h"

namespace tandem::ops::cpu {

/// y[i] = x[i] rounded to the 16-bit type, for i < n (no threads: callers split the work).
void convert(const float* x, bfloat16* y, int64_t n);
void convert(const float* x, float16* y, int64_t n);
/// y[i] = x[i] widened to float32 (exact), for i < n.
void convert(const bfloat16* x, float* y, int64_t n);
void convert(const float16* x, float* y, int64_t n);

}  // namespace tandem::ops::cpu
