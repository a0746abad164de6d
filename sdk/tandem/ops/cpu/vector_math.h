// Branch-free float math for loops the compiler vectorises: written with selects, integer bit
// operations and the four arithmetic operations only, so each lane computes the same bits
// whatever the vector width (the files using it build without multiply-add contraction).
#pragma once

#include <bit>
#include <cstdint>

namespace tandem::ops::cpu::vmath {

/// e^x within 2 ulp for x in [-87, 88]; 0 below -87 (where e^x leaves the normal floats),
/// +inf above 88, NaN for NaN. Cody-Waite reduction x = n ln2 + r, |r| <= ln2 / 2, then e^r by
/// its degree-7 Taylor polynomial (truncation below 1e-9 relative) scaled by 2^n through the
/// exponent bits.
[[gnu::always_inline]] inline float exp(float x) {
  const float clamped = x > -87.0f ? (x < 88.0f ? x : 88.0f) : -87.0f;  // NaN: -87
  // Round to nearest by the 1.5 * 2^23 shift: exact for |x log2 e| < 2^22.
  constexpr float kShift = 12582912.0f;
  const float n = (clamped * 1.44269504088896341f + kShift) - kShift;
  // ln 2 split in two: n * 0.693359375 is exact for |n| < 2^12.
  const float r = (clamped - n * 0.693359375f) - n * -2.12194440e-4f;
  float p = 1.0f / 5040.0f;
  p = p * r + 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  // n in [-126, 127]: a normal float's exponent.
  const float scale = std::bit_cast<float>((static_cast<int32_t>(n) + 127) << 23);
  float y = p * scale;
  y = x > 88.0f ? std::bit_cast<float>(0x7f800000) : y;
  y = x < -87.0f ? 0.0f : y;
  return x == x ? y : x;
}

/// Phi(x) = P(X <= x) for a standard normal X, and phi(x) = e^(-x^2/2) / sqrt(2 pi), the
/// standard normal density: what GELU and its derivative need, with one exponential between
/// them. Phi within 4e-7 relative (2e-7 from the fit, the rest from rounding x^2).
struct NormalCdfPdf {
  float cdf;
  float pdf;
};

/// erfc(z) = t e^(-z^2) P(t) with t = 1 / (1 + z / 2), z = |x| / sqrt(2) >= 0: P a degree-9
/// polynomial in t - 1/2, fitted for relative error 2e-8 over z in [0, 10] (erfc(z) e^(z^2) / t
/// is smooth in t on (0, 1]). Phi(x) is 1 - erfc(z) / 2 for x >= 0, erfc(z) / 2 below: the
/// small side never comes from a difference, so the lower tail keeps its relative accuracy.
[[gnu::always_inline]] inline NormalCdfPdf normal_cdf_pdf(float x) {
  const float a = x < 0.0f ? -x : x;
  const float g = exp(-0.5f * (x * x));  // e^(-z^2)
  const float t = 1.0f / (1.0f + 0.353553391f * a);
  const float v = t - 0.5f;
  float p = 1.214826573e-02f;
  p = p * v + -6.784970313e-02f;
  p = p * v + 4.647066817e-02f;
  p = p * v + 9.739552438e-02f;
  p = p * v + -1.029639244e-01f;
  p = p * v + -1.720237583e-01f;
  p = p * v + 1.457436681e-01f;
  p = p * v + 5.589430332e-01f;
  p = p * v + 6.871609092e-01f;
  p = p * v + 5.107913613e-01f;
  const float half_erfc = 0.5f * (t * g * p);
  return {x < 0.0f ? half_erfc : 1.0f - half_erfc, 0.398942280f * g};
}

}  // namespace tandem::ops::cpu::vmath
