// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3"), shared by host
// and device. A counter-based generator: block b of stream s under seed k is a pure function,
// so any element of a random tensor can be computed independently, on CPU or GPU, identically.
#pragma once

#include <cstdint>

#include "tandem/core/host_device.h"

namespace tandem::philox {

/// One Philox output: 128 random bits.
struct Block {
  /// The four 32-bit words.
  uint32_t v[4];
};

/// The low 32 bits of a * b; the high 32 bits go to *hi (one Philox round's multiply).
TANDEM_HD_INLINE uint32_t mulhilo(uint32_t a, uint32_t b, uint32_t* hi) {
  const uint64_t product = static_cast<uint64_t>(a) * b;
  *hi = static_cast<uint32_t>(product >> 32);
  return static_cast<uint32_t>(product);
}

/// Ten rounds of Philox4x32 on counter (c0..c3) with key (k0, k1).
TANDEM_HD_INLINE Block philox4x32_10(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3,
                                     uint32_t k0, uint32_t k1) {
  constexpr uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;
  constexpr uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    uint32_t hi0, hi1;
    const uint32_t lo0 = mulhilo(kMul0, c0, &hi0);
    const uint32_t lo1 = mulhilo(kMul1, c2, &hi1);
    const uint32_t n0 = hi1 ^ c1 ^ k0;
    const uint32_t n1 = lo1;
    const uint32_t n2 = hi0 ^ c3 ^ k1;
    const uint32_t n3 = lo0;
    c0 = n0; c1 = n1; c2 = n2; c3 = n3;
    k0 += kWeyl0;
    k1 += kWeyl1;
  }
  return Block{{c0, c1, c2, c3}};
}

/// Block number `block` of (seed, stream): counter = (block, stream), key = seed.
TANDEM_HD_INLINE Block block(uint64_t seed, uint64_t stream, uint64_t block) {
  return philox4x32_10(static_cast<uint32_t>(block), static_cast<uint32_t>(block >> 32),
                       static_cast<uint32_t>(stream), static_cast<uint32_t>(stream >> 32),
                       static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
}

/// Uniform float in [0, 1) from the top 24 bits.
TANDEM_HD_INLINE float to_unit_float(uint32_t x) {
  return static_cast<float>(x >> 8) * (1.0f / 16777216.0f);
}
/// Uniform double in [0, 1) from 53 bits of two draws.
TANDEM_HD_INLINE double to_unit_double(uint32_t a, uint32_t b) {
  const uint64_t bits = (static_cast<uint64_t>(a) << 21) ^ static_cast<uint64_t>(b >> 11);
  return static_cast<double>(bits & ((uint64_t{1} << 53) - 1)) * (1.0 / 9007199254740992.0);
}

}  // namespace tandem::philox
