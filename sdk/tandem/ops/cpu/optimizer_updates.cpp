// CPU loop of the fused optimizer updates. This file is compiled with -ffp-contract=off
// (CMakeLists.txt): the functors must round each product and sum on its own, as the separate
// ops they replace do, so a multiply-add contraction here would change the results.
#include "tandem/ops/cpu/optimizer_updates.h"

#include <utility>

#include "tandem/ops/cpu/cpu_dispatch.h"
#include "tandem/ops/cpu/parallel.h"

namespace tandem::ops::cpu {

namespace {

template <typename F, typename T, size_t... S>
[[gnu::always_inline]] inline void update_elements(const F& f, int64_t begin, int64_t end, T* w,
                                                   const T* g, T* const* slots,
                                                   std::index_sequence<S...>) {
  T* const slot[] = {slots[S]..., nullptr};
  for (int64_t i = begin; i < end; ++i) f(w[i], g[i], slot[S][i]...);
}

template <typename F, typename T>
TANDEM_CPU_LOOP void update_range(const F& f, int64_t begin, int64_t end, T* w, const T* g,
                                  T* const* slots) {
  update_elements(f, begin, end, w, g, slots, std::make_index_sequence<F::kSlots>{});
}

// The float32 loops, built for x86-64-v4 (AVX-512), x86-64-v3 (AVX2) and the baseline, run as
// cpu_isa() says: each lane rounds every product, quotient and square root as the scalar code
// does (no contraction in this file), so all give the same bits. float64 runs the loop as
// compiled (range() below).
#define TANDEM_FLOAT_UPDATE_RANGE(Rule)                                                     \
  TANDEM_CPU_DISPATCH(Rule##_range, update_range,                                           \
                      (const kernels::Rule<float>& f, int64_t begin, int64_t end, float* w, \
                       const float* g, float* const* slots),                                \
                      (f, begin, end, w, g, slots))                                         \
  inline void range(const kernels::Rule<float>& f, int64_t begin, int64_t end, float* w,    \
                    const float* g, float* const* slots) {                                  \
    Rule##_range(f, begin, end, w, g, slots);                                               \
  }
TANDEM_FUSED_UPDATE_RULES(TANDEM_FLOAT_UPDATE_RANGE)
#undef TANDEM_FLOAT_UPDATE_RANGE

template <typename F>
void range(const F& f, int64_t begin, int64_t end, double* w, const double* g,
           double* const* slots) {
  update_range(f, begin, end, w, g, slots);
}

}  // namespace

template <typename F, typename T>
void optimizer_update(const F& f, int64_t n, T* w, const T* g, T* const* slots) {
  // A small variable (a bias) stays on the calling thread.
  parallel_for(n, kHeavyElementwiseGrain,
               [&](int64_t begin, int64_t end) { range(f, begin, end, w, g, slots); });
}

#define TANDEM_OPTIMIZER_UPDATE(Rule)                                             \
  template void optimizer_update<kernels::Rule<float>, float>(                    \
      const kernels::Rule<float>&, int64_t, float*, const float*, float* const*); \
  template void optimizer_update<kernels::Rule<double>, double>(                  \
      const kernels::Rule<double>&, int64_t, double*, const double*, double* const*);
TANDEM_FUSED_UPDATE_RULES(TANDEM_OPTIMIZER_UPDATE)
#undef TANDEM_OPTIMIZER_UPDATE

}  // namespace tandem::ops::cpu
