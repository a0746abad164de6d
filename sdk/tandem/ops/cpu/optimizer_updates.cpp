// CPU loop of the fused optimizer updates. This file is compiled with -ffp-contract=off
// (CMakeLists.txt): the functors must round each product and sum on its own, as the separate
// ops they replace do, so a multiply-add contraction here would change the results.
#include "tandem/ops/cpu/optimizer_updates.h"

#include <type_traits>

#include "tandem/ops/cpu/cpu_dispatch.h"
#include "tandem/ops/cpu/parallel.h"

namespace tandem::ops::cpu {

namespace {

template <typename F, typename T, typename... Slots>
TANDEM_CPU_LOOP void update_range(const F& f, int64_t begin, int64_t end, T* w, const T* g,
                                  Slots*... slots) {
  for (int64_t i = begin; i < end; ++i) f(w[i], g[i], slots[i]...);
}

// The float32 loops, built for x86-64-v4 (AVX-512), x86-64-v3 (AVX2) and the baseline, run as
// cpu_isa() says: each lane rounds every product, quotient and square root as the scalar code
// does (no contraction in this file), so all give the same bits.
TANDEM_CPU_DISPATCH(sgd_range, update_range,
                    (const kernels::SgdUpdate<float>& f, int64_t begin, int64_t end, float* w,
                     const float* g),
                    (f, begin, end, w, g))
TANDEM_CPU_DISPATCH(sgd_momentum_range, update_range,
                    (const kernels::SgdMomentumUpdate<float>& f, int64_t begin, int64_t end,
                     float* w, const float* g, float* velocity),
                    (f, begin, end, w, g, velocity))
TANDEM_CPU_DISPATCH(adam_range, update_range,
                    (const kernels::AdamUpdate<float>& f, int64_t begin, int64_t end, float* w,
                     const float* g, float* m, float* v),
                    (f, begin, end, w, g, m, v))

}  // namespace

template <typename F, typename T, typename... Slots>
void optimizer_update(const F& f, int64_t n, T* w, const T* g, Slots*... slots) {
  // A small variable (a bias) stays on the calling thread.
  parallel_for(n, kHeavyElementwiseGrain, [&](int64_t begin, int64_t end) {
    if constexpr (std::is_same_v<F, kernels::AdamUpdate<float>>) {
      adam_range(f, begin, end, w, g, slots...);
    } else if constexpr (std::is_same_v<F, kernels::SgdMomentumUpdate<float>>) {
      sgd_momentum_range(f, begin, end, w, g, slots...);
    } else if constexpr (std::is_same_v<F, kernels::SgdUpdate<float>>) {
      sgd_range(f, begin, end, w, g, slots...);
    } else {
      update_range(f, begin, end, w, g, slots...);
    }
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
