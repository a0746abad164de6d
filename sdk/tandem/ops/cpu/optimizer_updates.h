// CPU loop of the fused optimizer updates: one pass applying an update functor of
// ops/kernels/optimizer_functors.h to every element of a variable, its gradient and its slots.
#pragma once

#include <cstdint>

#include "tandem/ops/kernels/optimizer_functors.h"

namespace tandem::ops::cpu {

/// f(w[i], g[i], slots[0][i], ..., slots[F::kSlots - 1][i]) for i < n: w and the slots are
/// updated in place. Instantiated for every rule of TANDEM_FUSED_UPDATE_RULES, float and double.
template <typename F, typename T>
void optimizer_update(const F& f, int64_t n, T* w, const T* g, T* const* slots);

}  // namespace tandem::ops::cpu
