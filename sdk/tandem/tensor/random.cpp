// Scalar draws from a Generator.
#include "tandem/tensor/random.h"

#include "tandem/tensor/philox.h"

namespace tandem {

uint32_t Generator::next_u32() { return philox::block(seed_, stream_, reserve(1)).v[0]; }

double Generator::next_double() {
  const philox::Block b = philox::block(seed_, stream_, reserve(1));
  return philox::to_unit_double(b.v[0], b.v[1]);
}

uint64_t Generator::uniform_int(uint64_t bound) {
  // Lemire-style rejection on 64 bits built from one block.
  const uint64_t limit = UINT64_MAX - UINT64_MAX % bound;
  for (;;) {
    const philox::Block b = philox::block(seed_, stream_, reserve(1));
    const uint64_t x = (static_cast<uint64_t>(b.v[0]) << 32) | b.v[1];
    if (x < limit) return x % bound;
  }
}

}  // namespace tandem
