// The dropout mask from Philox: element i is a pure function of (seed, stream, block), so the
// mask is the same for any thread count, and on any backend that follows the same rule.
#include <algorithm>

#include "tandem/core/error.h"
#include "tandem/ops/cpu/nn_kernels.h"
#include "tandem/ops/cpu/parallel.h"
#include "tandem/tensor/philox.h"

namespace tandem::ops::cpu {

template <typename T>
void dropout_mask(int64_t n, double rate, uint64_t seed, uint64_t stream, uint64_t first_block,
                  T* mask) {
  TANDEM_CHECK(rate >= 0.0 && rate <= 1.0, "dropout_mask: rate ", rate, " is outside [0, 1]");
  // With rate == 1 nothing is kept, so the infinite scale is never written.
  const T kept = static_cast<T>(1.0 / (1.0 - rate));
  // One Philox block serves four consecutive elements; blocks are independent.
  const int64_t blocks = (n + 3) / 4;
  parallel_for(blocks, kElementwiseGrain / 4, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      const philox::Block bits =
          philox::block(seed, stream, first_block + static_cast<uint64_t>(b));
      const int64_t lanes = std::min<int64_t>(4, n - b * 4);
      for (int64_t lane = 0; lane < lanes; ++lane) {
        // Compared in double (the float converts exactly); another backend must compare the
        // same way to drop the same elements.
        const double u = philox::to_unit_float(bits.v[lane]);
        mask[b * 4 + lane] = u >= rate ? kept : T(0);
      }
    }
  });
}

template void dropout_mask<float>(int64_t, double, uint64_t, uint64_t, uint64_t, float*);
template void dropout_mask<double>(int64_t, double, uint64_t, uint64_t, uint64_t, double*);

}  // namespace tandem::ops::cpu
