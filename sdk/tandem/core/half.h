// The two 16-bit floating-point element types of mixed precision: bfloat16 (float32's exponent,
// 8 significant bits; what the CPUs' AVX512-BF16 instructions and tensor cores take) and float16
// (IEEE 754 binary16: 5 exponent bits, 11 significant bits, subnormals). Both are storage types:
// they convert to float implicitly (exactly), and from float only explicitly (rounding), so
// arithmetic computes in float and rounds back once, as the kernels do when they accumulate in
// float32. Conversions from float round to nearest, ties to even, keep the sign
// of zeros and infinities, and turn any NaN into a quiet NaN of the same sign; float16 overflows
// to infinity. Written with integer operations only, so that the result does not depend on the
// thread's floating-point mode (flush-to-zero, denormals-are-zero) and is the same on the host
// and on the device (TANDEM_HD).
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "tandem/core/host_device.h"

namespace tandem {

namespace detail {

TANDEM_HD_INLINE uint32_t float_bits(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  return bits;
}

TANDEM_HD_INLINE float bits_float(uint32_t bits) {
  float value;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
}

/// `value` >> `shift` rounded to nearest, ties to even (shift in [1, 31]).
TANDEM_HD_INLINE uint32_t shift_right_rounded(uint32_t value, int shift) {
  const uint32_t kept = value >> shift;
  const uint32_t rest = value & ((uint32_t{1} << shift) - 1);
  const uint32_t half = uint32_t{1} << (shift - 1);
  return kept + ((rest > half || (rest == half && (kept & 1) != 0)) ? 1 : 0);
}

}  // namespace detail

/// bfloat16: the upper half of a float32's bits.
struct bfloat16 {
  /// The value's 16 bits (a float32's upper half).
  uint16_t bits = 0;

  /// The bfloat16 whose bits are `bits`.
  static TANDEM_HD_INLINE bfloat16 from_bits(uint16_t bits) {
    bfloat16 value;
    value.bits = bits;
    return value;
  }
  bfloat16() = default;
  /// `value` rounded to nearest, ties to even; NaN stays a (quiet) NaN.
  TANDEM_HD_INLINE explicit bfloat16(float value) {
    const uint32_t f = detail::float_bits(value);
    // The low 16 bits decide: above half rounds up, half rounds to the even upper half (adding
    // 0x7fff plus the kept part's lowest bit carries exactly then). A carry out of the
    // significand raises the exponent (the largest finite values round to infinity), which is
    // the right result. Branch-free, so that conversion loops vectorize.
    const uint32_t rounded = (f + 0x7fffu + ((f >> 16) & 1u)) >> 16;
    const uint32_t quiet_nan = (f >> 16) | 0x0040u;  // sign and top payload kept
    bits = static_cast<uint16_t>((f & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded);
  }
  /// The exact float32 value.
  TANDEM_HD_INLINE operator float() const {  // NOLINT: implicit, as a float would widen
    return detail::bits_float(static_cast<uint32_t>(bits) << 16);
  }
};

/// float16: IEEE 754 binary16.
struct float16 {
  /// The value's 16 bits: sign, 5-bit exponent, 10-bit mantissa.
  uint16_t bits = 0;

  /// The float16 whose bits are `bits`.
  static TANDEM_HD_INLINE float16 from_bits(uint16_t bits) {
    float16 value;
    value.bits = bits;
    return value;
  }
  float16() = default;
  /// `value` rounded to nearest, ties to even: past the largest finite value (65504) it rounds
  /// to infinity, below half the smallest subnormal to zero; NaN stays a (quiet) NaN.
  TANDEM_HD_INLINE explicit float16(float value) {
    const uint32_t f = detail::float_bits(value);
    const uint32_t sign = (f >> 16) & 0x8000u;
    const uint32_t magnitude = f & 0x7fffffffu;
    if (magnitude > 0x7f800000u) {  // NaN: quiet, sign and top payload kept
      bits = static_cast<uint16_t>(sign | 0x7e00u | ((magnitude >> 13) & 0x01ffu));
      return;
    }
    const int exponent = static_cast<int>(magnitude >> 23) - 127;  // unbiased
    if (exponent >= 16) {  // 65536 and above, and infinity: infinity
      bits = static_cast<uint16_t>(sign | 0x7c00u);
      return;
    }
    if (exponent >= -14) {
      // A normal float16 (or, after rounding up, the next binade or infinity): rebias the
      // exponent and round the significand from 23 to 10 bits; a carry moves into the exponent.
      const uint32_t rebased = magnitude - (static_cast<uint32_t>(127 - 15) << 23);
      bits = static_cast<uint16_t>(sign | detail::shift_right_rounded(rebased, 13));
      return;
    }
    if (exponent < -25) {  // below half the smallest subnormal: zero
      bits = static_cast<uint16_t>(sign);
      return;
    }
    // A subnormal float16: the significand with its implicit bit, in units of 2^-24. A value
    // rounding up to 2^-14 carries into the exponent field, the smallest normal: right again.
    const uint32_t significand = (magnitude & 0x007fffffu) | 0x00800000u;
    const int shift = -exponent - 14 + 13;  // 14..24
    bits = static_cast<uint16_t>(sign | detail::shift_right_rounded(significand, shift));
  }
  /// The exact float32 value.
  TANDEM_HD_INLINE operator float() const {  // NOLINT: implicit, as a float would widen
    const uint32_t sign = static_cast<uint32_t>(bits & 0x8000u) << 16;
    const uint32_t exponent = (bits >> 10) & 0x1fu;
    const uint32_t mantissa = bits & 0x03ffu;
    if (exponent == 0x1fu)  // infinity, NaN (payload kept)
      return detail::bits_float(sign | 0x7f800000u | (mantissa << 13));
    if (exponent != 0)
      return detail::bits_float(sign | ((exponent + 127 - 15) << 23) | (mantissa << 13));
    if (mantissa == 0) return detail::bits_float(sign);
    // Subnormal: mantissa x 2^-24, normalised for float32 (exact).
    int shift = 0;
    uint32_t m = mantissa;
    while ((m & 0x0400u) == 0) {
      m <<= 1;
      ++shift;
    }
    const uint32_t float_exponent = static_cast<uint32_t>(127 - 15 + 1 - shift);
    return detail::bits_float(sign | (float_exponent << 23) | ((m & 0x03ffu) << 13));
  }
};

/// True for the 16-bit floating storage types.
template <typename T>
inline constexpr bool is_half_v = std::is_same_v<T, bfloat16> || std::is_same_v<T, float16>;

/// The type elementwise math on T runs in: float for the 16-bit types (each element is widened,
/// computed in float32 and rounded once to nearest even), T itself otherwise.
template <typename T>
using compute_type_t = std::conditional_t<is_half_v<T>, float, T>;

}  // namespace tandem
