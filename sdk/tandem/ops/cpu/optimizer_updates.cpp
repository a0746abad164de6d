// CPU loop of the fused optimizer updates. This file is compiled with -ffp-contract=off
// (CMakeLists.txt): the functors must round each product and sum on its own, as the separate
// ops they replace do, so a multiply-add contraction here would change the results.
#include "tandem/ops/cpu/optimizer_updates.h"

#include "tandem/ops/cpu/parallel.h"

namespace tandem::ops::cpu {

template <typename F, typename T, typename... Slots>
void optimizer_update(const F& f, int64_t n, T* w, const T* g, Slots*... slots) {
  // A small variable (a bias) stays on the calling thread.
  parallel_for(n, kHeavyElementwiseGrain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) f(w[i], g[i], slots[i]...);
  });
}

#define TANDEM_OPTIMIZER_UPDATES(T)                                                               \
  template void optimizer_update<kernels::SgdUpdate<T>, T>(const kernels::SgdUpdate<T>&, int64_t, \
                                                           T*, const T*);                         \
  template void optimizer_update<kernels::SgdMomentumUpdate<T>, T, T>(                            \
      const kernels::SgdMomentumUpdate<T>&, int64_t, T*, const T*, T*);                           \
  template void optimizer_update<kernels::AdamUpdate<T>, T, T, T>(const kernels::AdamUpdate<T>&,  \
                                                                  int64_t, T*, const T*, T*, T*);

TANDEM_OPTIMIZER_UPDATES(float)
TANDEM_OPTIMIZER_UPDATES(double)

}  // namespace tandem::ops::cpu
