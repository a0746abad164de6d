// CPU elementwise loops. Fast paths (equal shapes, a scalar operand, a broadcast row such as
// a bias) reduce to one contiguous inner loop per row with compile-time strides, which the
// compiler vectorises; the outer rows advance with an odometer, never per element.
#include "tandem/ops/cpu/elementwise.h"

#include <algorithm>
#include <array>
#include <type_traits>
#include <vector>

#include "tandem/ops/cpu/activations.h"
#include "tandem/ops/cpu/half_convert.h"
#include "tandem/ops/cpu/parallel.h"
#include "tandem/ops/kernels/op_list.h"

namespace tandem::ops::cpu {

namespace {

// One inner run; kA / kB say whether a / b advance (else their first element repeats). The
// math runs in C (float for the 16-bit types: widened, computed, rounded once).
template <bool kA, bool kB, typename F, typename T, typename R>
inline void run(const F& f, int64_t n, const T* a, const T* b, R* y) {
  using C = compute_type_t<T>;
  if constexpr (kA && kB) {
    for (int64_t i = 0; i < n; ++i) y[i] = static_cast<R>(f(C(a[i]), C(b[i])));
  } else if constexpr (kA) {
    const C bv = C(b[0]);
    for (int64_t i = 0; i < n; ++i) y[i] = static_cast<R>(f(C(a[i]), bv));
  } else if constexpr (kB) {
    const C av = C(a[0]);
    for (int64_t i = 0; i < n; ++i) y[i] = static_cast<R>(f(av, C(b[i])));
  } else {  // neither advances (broadcast_to): one value, repeated
    const R v = static_cast<R>(f(C(a[0]), C(b[0])));
    for (int64_t i = 0; i < n; ++i) y[i] = v;
  }
}

// Output elements [begin, end): whole or partial inner runs, the outer index advancing as an
// odometer over plan.outer.
template <bool kA, bool kB, typename F, typename T, typename R>
void binary_range(const F& f, const kernels::BroadcastPlan& p, const T* a, const T* b, R* y,
                  int64_t begin, int64_t end) {
  if (p.outer.empty()) {
    run<kA, kB>(f, end - begin, kA ? a + begin : a, kB ? b + begin : b, y + begin);
    return;
  }
  const size_t rank = p.outer.size();
  std::vector<int64_t> index(rank);
  int64_t row = begin / p.inner, col = begin % p.inner;
  int64_t a_offset = 0, b_offset = 0;
  for (size_t k = rank; k-- > 0;) {
    index[k] = row % p.outer[k];
    row /= p.outer[k];
    a_offset += index[k] * p.a_strides[k];
    b_offset += index[k] * p.b_strides[k];
  }
  while (begin < end) {
    const int64_t n = std::min(p.inner - col, end - begin);
    run<kA, kB>(f, n, a + a_offset + (kA ? col : 0), b + b_offset + (kB ? col : 0), y + begin);
    begin += n;
    col = 0;
    for (size_t k = rank; k-- > 0;) {
      a_offset += p.a_strides[k];
      b_offset += p.b_strides[k];
      if (++index[k] < p.outer[k]) break;
      a_offset -= p.outer[k] * p.a_strides[k];
      b_offset -= p.outer[k] * p.b_strides[k];
      index[k] = 0;
    }
  }
}

// One inner run of a select; advances[j] says whether operand j advances along it. The common
// case, every operand advancing, gets a loop of its own (unit strides).
template <typename F, typename T>
inline void select_run(const F& f, int64_t n, const std::array<bool, 3>& advances, const bool* c,
                       const T* a, const T* b, T* y) {
  if (advances[0] && advances[1] && advances[2]) {
    for (int64_t i = 0; i < n; ++i) y[i] = f(c[i], a[i], b[i]);
    return;
  }
  const int64_t sc = advances[0] ? 1 : 0, sa = advances[1] ? 1 : 0, sb = advances[2] ? 1 : 0;
  for (int64_t i = 0; i < n; ++i) y[i] = f(c[i * sc], a[i * sa], b[i * sb]);
}

// Output elements [begin, end) of a select, as binary_range walks a binary op's.
template <typename F, typename T>
void select_range(const F& f, const kernels::SelectPlan& p, const bool* c, const T* a, const T* b,
                  T* y, int64_t begin, int64_t end) {
  const std::array<bool, 3>& adv = p.advances;
  if (p.outer.empty()) {
    select_run(f, end - begin, adv, adv[0] ? c + begin : c, adv[1] ? a + begin : a,
               adv[2] ? b + begin : b, y + begin);
    return;
  }
  const size_t rank = p.outer.size();
  std::vector<int64_t> index(rank);
  int64_t row = begin / p.inner, col = begin % p.inner;
  std::array<int64_t, 3> offset = {0, 0, 0};
  for (size_t k = rank; k-- > 0;) {
    index[k] = row % p.outer[k];
    row /= p.outer[k];
    for (size_t j = 0; j < 3; ++j) offset[j] += index[k] * p.strides[j][k];
  }
  while (begin < end) {
    const int64_t n = std::min(p.inner - col, end - begin);
    select_run(f, n, adv, c + offset[0] + (adv[0] ? col : 0), a + offset[1] + (adv[1] ? col : 0),
               b + offset[2] + (adv[2] ? col : 0), y + begin);
    begin += n;
    col = 0;
    for (size_t k = rank; k-- > 0;) {
      for (size_t j = 0; j < 3; ++j) offset[j] += p.strides[j][k];
      if (++index[k] < p.outer[k]) break;
      for (size_t j = 0; j < 3; ++j) offset[j] -= p.outer[k] * p.strides[j][k];
      index[k] = 0;
    }
  }
}

// Float32 and the 16-bit types take GELU's vectorised loops (activations.h); the 16-bit ones
// widened a block at a time, computed in float and rounded once, as the generic loops do.
template <typename T>
constexpr bool kVectorGelu = std::is_same_v<T, float> || is_half_v<T>;

template <typename T>
void gelu_range(const T* x, T* y, int64_t begin, int64_t end) {
  if constexpr (std::is_same_v<T, float>) {
    gelu(x + begin, y + begin, end - begin);
  } else {
    constexpr int64_t kBlock = 512;
    float wide[kBlock];
    for (int64_t i = begin; i < end; i += kBlock) {
      const int64_t m = std::min(kBlock, end - i);
      convert(x + i, wide, m);
      gelu(wide, wide, m);
      convert(wide, y + i, m);
    }
  }
}

template <typename T>
void gelu_grad_range(const T* x, const T* g, T* dx, int64_t begin, int64_t end) {
  if constexpr (std::is_same_v<T, float>) {
    gelu_grad(x + begin, g + begin, dx + begin, end - begin);
  } else {
    constexpr int64_t kBlock = 512;
    float wide_x[kBlock], wide_g[kBlock];
    for (int64_t i = begin; i < end; i += kBlock) {
      const int64_t m = std::min(kBlock, end - i);
      convert(x + i, wide_x, m);
      convert(g + i, wide_g, m);
      gelu_grad(wide_x, wide_g, wide_x, m);
      convert(wide_x, dx + i, m);
    }
  }
}

}  // namespace

template <typename F, typename T, typename R>
void unary(const F& f, int64_t n, const T* x, R* y) {
  using C = compute_type_t<T>;
  if constexpr (std::is_same_v<F, kernels::Gelu> && kVectorGelu<T>) {
    parallel_for(n, kElementwiseGrain,
                 [&](int64_t begin, int64_t end) { gelu_range(x, y, begin, end); });
    return;
  }
  parallel_for(n, kElementwiseGrain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) y[i] = static_cast<R>(f(C(x[i])));
  });
}

template <typename F, typename T, typename R>
void binary(const F& f, const kernels::BroadcastPlan& plan, const T* a, const T* b, R* y) {
  if constexpr (std::is_same_v<F, kernels::GeluGrad> && kVectorGelu<T>) {
    if (plan.outer.empty() && plan.a_inner && plan.b_inner) {  // x and g of one shape
      parallel_for(plan.numel, kElementwiseGrain,
                   [&](int64_t begin, int64_t end) { gelu_grad_range(a, b, y, begin, end); });
      return;
    }
  }
  parallel_for(plan.numel, kElementwiseGrain, [&](int64_t begin, int64_t end) {
    if (plan.a_inner && plan.b_inner)
      binary_range<true, true>(f, plan, a, b, y, begin, end);
    else if (plan.a_inner)
      binary_range<true, false>(f, plan, a, b, y, begin, end);
    else if (plan.b_inner)
      binary_range<false, true>(f, plan, a, b, y, begin, end);
    else  // both repeat along the inner run: only broadcast_to's output outgrows both inputs
      binary_range<false, false>(f, plan, a, b, y, begin, end);
  });
}

template <typename F, typename T>
void select(const F& f, const kernels::SelectPlan& plan, const bool* condition, const T* a,
            const T* b, T* y) {
  parallel_for(plan.numel, kElementwiseGrain, [&](int64_t begin, int64_t end) {
    select_range(f, plan, condition, a, b, y, begin, end);
  });
}

void cast(DType from, DType to, int64_t n, const void* x, void* y) {
  dispatch_dtype(from, [&]<typename S>() {
    dispatch_dtype(to, [&]<typename D>() {
      const S* src = static_cast<const S*>(x);
      D* dst = static_cast<D*>(y);
      parallel_for(n, kElementwiseGrain, [&](int64_t begin, int64_t end) {
        // float32 <-> 16-bit: the loops cloned for AVX-512 (half_convert.h).
        if constexpr ((std::is_same_v<S, float> && is_half_v<D>) ||
                      (is_half_v<S> && std::is_same_v<D, float>)) {
          convert(src + begin, dst + begin, end - begin);
        } else {
          for (int64_t i = begin; i < end; ++i) dst[i] = static_cast<D>(src[i]);
        }
      });
    });
  });
}

// ---- instantiations: the functor x dtype list of ops/kernels/op_list.h ----------------------

#define TANDEM_UNARY(F, T) \
  template void unary<kernels::F, T, T>(const kernels::F&, int64_t, const T*, T*);
#define TANDEM_PREDICATE(F, T) \
  template void unary<kernels::F, T, bool>(const kernels::F&, int64_t, const T*, bool*);
#define TANDEM_SELECT(F, T)                                                                       \
  template void select<kernels::F, T>(const kernels::F&, const kernels::SelectPlan&, const bool*, \
                                      const T*, const T*, T*);
#define TANDEM_BINARY(F, T)                                                                \
  template void binary<kernels::F, T, T>(const kernels::F&, const kernels::BroadcastPlan&, \
                                         const T*, const T*, T*);
#define TANDEM_COMPARISON(F, T)                                                               \
  template void binary<kernels::F, T, bool>(const kernels::F&, const kernels::BroadcastPlan&, \
                                            const T*, const T*, bool*);
#define TANDEM_FLOATING_UNARY(F) TANDEM_ANY_FLOATING_TYPES(TANDEM_UNARY, F)
#define TANDEM_NUMERIC_UNARY(F) TANDEM_ANY_NUMERIC_TYPES(TANDEM_UNARY, F)
#define TANDEM_FLOATING_BINARY(F) TANDEM_ANY_FLOATING_TYPES(TANDEM_BINARY, F)
#define TANDEM_NUMERIC_BINARY(F) TANDEM_ANY_NUMERIC_TYPES(TANDEM_BINARY, F)
#define TANDEM_ALL_COMPARISON(F) TANDEM_EVERY_TYPE(TANDEM_COMPARISON, F)
#define TANDEM_ALL_PREDICATE(F) TANDEM_EVERY_TYPE(TANDEM_PREDICATE, F)
#define TANDEM_ALL_SELECT(F) TANDEM_EVERY_TYPE(TANDEM_SELECT, F)

TANDEM_FLOATING_UNARY_FUNCTORS(TANDEM_FLOATING_UNARY)
TANDEM_NUMERIC_UNARY_FUNCTORS(TANDEM_NUMERIC_UNARY)
TANDEM_FLOATING_BINARY_FUNCTORS(TANDEM_FLOATING_BINARY)
TANDEM_NUMERIC_BINARY_FUNCTORS(TANDEM_NUMERIC_BINARY)
TANDEM_COMPARISON_FUNCTORS(TANDEM_ALL_COMPARISON)
TANDEM_PREDICATE_FUNCTORS(TANDEM_ALL_PREDICATE)
TANDEM_SELECT_FUNCTORS(TANDEM_ALL_SELECT)

}  // namespace tandem::ops::cpu
