// bfloat16 and float16 (core/half.h): every 16-bit value round-trips through float exactly, and
// every conversion from float is the nearest value, ties to even, checked against the table of
// all values of the type (an independent reference: decoded with ldexp, searched with doubles).
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "tandem/core/half.h"

namespace td = tandem;

namespace {

float from_bits(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

uint32_t to_bits(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  return bits;
}

/// The value of float16 `bits` by the definition: (-1)^s x 2^(e-15) x 1.m, or 2^-14 x 0.m.
double float16_by_definition(uint16_t bits) {
  const int sign = (bits & 0x8000) != 0 ? -1 : 1;
  const int exponent = (bits >> 10) & 0x1f;
  const int mantissa = bits & 0x3ff;
  if (exponent == 0x1f)
    return mantissa == 0 ? sign * std::numeric_limits<double>::infinity()
                         : std::numeric_limits<double>::quiet_NaN();
  if (exponent == 0) return sign * std::ldexp(mantissa, -24);
  return sign * std::ldexp(1024 + mantissa, exponent - 25);
}

/// The correctly rounded 16-bit pattern for `x` among the finite values `table` (sorted pairs of
/// value and bits, positive only), with `overflow_at` the magnitude from which it is infinity
/// (`infinity` its bits): the nearest, ties to the even pattern.
template <typename Table>
uint16_t nearest(double x, const Table& table, double overflow_at, uint16_t infinity) {
  const uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  const double a = std::fabs(x);
  if (a >= overflow_at) return static_cast<uint16_t>(sign | infinity);
  auto above = std::lower_bound(table.begin(), table.end(), a,
                                [](const auto& entry, double v) { return entry.first < v; });
  if (above == table.end()) return static_cast<uint16_t>(sign | table.back().second);
  if (above->first == a || above == table.begin())
    return static_cast<uint16_t>(sign | above->second);
  const auto below = std::prev(above);
  const double up = above->first - a, down = a - below->first;
  const uint16_t pick = up < down   ? above->second
                        : down < up ? below->second
                                    : ((above->second & 1) == 0 ? above->second : below->second);
  return static_cast<uint16_t>(sign | pick);
}

/// Floats around every boundary that matters, and random ones of every magnitude.
std::vector<float> probe_floats() {
  std::vector<float> out = {0.0f,
                            -0.0f,
                            1.0f,
                            -1.0f,
                            65504.0f,
                            65519.99f,
                            65520.0f,
                            65536.0f,
                            std::ldexp(1.0f, -24),
                            std::ldexp(1.0f, -25),
                            std::ldexp(1.5f, -25),
                            std::ldexp(1.0f, -14),
                            std::ldexp(1023.5f, -24),
                            std::numeric_limits<float>::max(),
                            -std::numeric_limits<float>::max(),
                            std::numeric_limits<float>::denorm_min(),
                            std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity()};
  // Every float16 and bfloat16 value, and the midpoints and near-midpoints around them.
  for (uint32_t b = 0; b < 0x10000; ++b) {
    const float bf = from_bits(b << 16);
    if (std::isfinite(bf)) {
      out.push_back(bf);
      out.push_back(from_bits((b << 16) | 0x8000));  // the midpoint to the next bfloat16
      out.push_back(from_bits((b << 16) | 0x7fff));
      out.push_back(from_bits((b << 16) | 0x8001));
    }
  }
  std::mt19937 rng(7);
  std::uniform_int_distribution<uint32_t> any;
  for (int i = 0; i < 200000; ++i) {
    const float f = from_bits(any(rng));
    if (!std::isnan(f)) out.push_back(f);
  }
  return out;
}

}  // namespace

TEST_CASE("bfloat16: every value round-trips, conversions round to nearest even", "[cpu][core]") {
  std::vector<std::pair<double, uint16_t>> table;  // positive finite values
  for (uint32_t b = 0; b < 0x10000; ++b) {
    const td::bfloat16 h = td::bfloat16::from_bits(static_cast<uint16_t>(b));
    const float f = static_cast<float>(h);
    CHECK(to_bits(f) == b << 16);  // exact, NaN payloads included
    if (std::isnan(f)) {
      CHECK(std::isnan(static_cast<float>(td::bfloat16(f))));
      continue;
    }
    CHECK(td::bfloat16(f).bits == b);
    if (b < 0x7f80) table.emplace_back(static_cast<double>(f), static_cast<uint16_t>(b));
  }
  // Above max + half an ulp (max = 0x7f7f) rounds to infinity; exactly half ties to even: up.
  const double max = table.back().first;
  const double overflow_at = max + std::ldexp(1.0, 127 - 8);
  int checked = 0;
  for (float x : probe_floats()) {
    const uint16_t expected = nearest(static_cast<double>(x), table, overflow_at, 0x7f80);
    INFO("x = " << x << " (bits " << std::hex << to_bits(x) << ")");
    REQUIRE(td::bfloat16(x).bits == expected);
    ++checked;
  }
  CHECK(checked > 400000);
  // NaN stays NaN, quiet, with its sign.
  const td::bfloat16 nan(-std::numeric_limits<float>::signaling_NaN());
  CHECK(std::isnan(static_cast<float>(nan)));
  CHECK((nan.bits & 0x8040) == 0x8040);
}

TEST_CASE("float16: every value round-trips, conversions round to nearest even, subnormals",
          "[cpu][core]") {
  std::vector<std::pair<double, uint16_t>> table;
  for (uint32_t b = 0; b < 0x10000; ++b) {
    const td::float16 h = td::float16::from_bits(static_cast<uint16_t>(b));
    const float f = static_cast<float>(h);
    const double defined = float16_by_definition(static_cast<uint16_t>(b));
    if (std::isnan(defined)) {
      CHECK(std::isnan(f));
      CHECK(td::float16(f).bits == (b | 0x0200));  // quiet, payload kept
      continue;
    }
    CHECK(static_cast<double>(f) == defined);
    CHECK(std::signbit(f) == ((b & 0x8000) != 0));
    CHECK(td::float16(f).bits == b);
    if (b < 0x7c00) table.emplace_back(defined, static_cast<uint16_t>(b));
  }
  REQUIRE(table.back().first == 65504.0);
  // 65520 (max + half an ulp of 32) ties to even: the next pattern, infinity.
  int checked = 0;
  for (float x : probe_floats()) {
    const uint16_t expected = nearest(static_cast<double>(x), table, 65520.0, 0x7c00);
    INFO("x = " << x << " (bits " << std::hex << to_bits(x) << ")");
    REQUIRE(td::float16(x).bits == expected);
    ++checked;
  }
  CHECK(checked > 400000);
  CHECK(td::float16(std::ldexp(1.0f, -25)).bits == 0x0000);  // half the smallest: to even, 0
  CHECK(td::float16(std::ldexp(1.5f, -25)).bits == 0x0001);  // above half: the smallest
  CHECK(td::float16(std::ldexp(1.5f, -24)).bits == 0x0002);  // 1.5 units: tie, to even (2)
  CHECK(td::float16(65519.0f).bits == 0x7bff);               // below the tie: the largest
  CHECK(td::float16(-65520.0f).bits == 0xfc00);              // the tie: minus infinity
}
