// max_propagating_nan: the one element-wise maximum of every kMax reduction (in-process on the
// CPU and on a GPU, across MPI workers, strategy.reduce), shared by host and device code.
#pragma once

#include <type_traits>

#include "tandem/core/half.h"
#include "tandem/core/host_device.h"

namespace tandem::detail {

/// The larger of `acc` and `in`; a NaN `in` wins (and a NaN `acc` stays, since nothing compares
/// greater than it), so a non-finite flag reduced with kMax is never lost. Ties keep `acc`.
template <typename T>
TANDEM_HD_INLINE T max_propagating_nan(T acc, T in) {
  if constexpr (is_half_v<T>) {
    const float a = acc;
    const float b = in;
    return (b > a || b != b) ? in : acc;
  } else if constexpr (std::is_floating_point_v<T>) {
    return (in > acc || in != in) ? in : acc;
  } else {
    return in > acc ? in : acc;
  }
}

}  // namespace tandem::detail
