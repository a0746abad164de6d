// CPU loop of the fused optimizer updates: one pass applying an update functor of
// ops/kernels/optimizer_functors.h to every element of a variable, its gradient and its slots.
#pragma once

#include <cstdint>

#include "tandem/ops/kernels/optimizer_functors.h"

namespace tandem::ops::cpu {

/// f(w[i], g[i], slots[i]...) for i < n: w and the slots are updated in place. Instantiated for
/// SgdUpdate (no slot), SgdMomentumUpdate (one) and AdamUpdate (two), float and double.
template <typename F, typename T, typename... Slots>
void optimizer_update(const F& f, int64_t n, T* w, const T* g, Slots*... slots);

}  // namespace tandem::ops::cpu
