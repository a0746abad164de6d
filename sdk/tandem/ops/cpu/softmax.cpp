// CPU softmax family. Rows (softmax over the last axis, the common case) run contiguous loops;
// other axes reduce a range of columns at a time.
#include "tandem/ops/cpu/softmax.h"

#include <vector>

#include "tandem/ops/cpu/parallel.h"
#include "tandem/ops/kernels/functors.h"
#include "tandem/ops/kernels/op_list.h"

namespace tandem::ops::cpu {

namespace math = kernels::math;

template <typename T>
void softmax(const T* x, int64_t outer, int64_t n, int64_t inner, bool log, T* y) {
  parallel_for_columns(outer, n, inner, [&](int64_t o, int64_t i0, int64_t i1) {
    const int64_t base = o * n * inner;
    if (inner == 1) {
      const T* in = x + base;
      T* out = y + base;
      T m = in[0];
      for (int64_t k = 1; k < n; ++k) m = in[k] > m ? in[k] : m;
      T s = 0;
      for (int64_t k = 0; k < n; ++k) {
        out[k] = math::exp(in[k] - m);
        s += out[k];
      }
      if (log) {
        // (x - m) - log(s), not x - (m + log(s)): the first difference is exact, so large
        // logits keep the precision of log(s).
        const T log_s = math::log(s);
        for (int64_t k = 0; k < n; ++k) out[k] = (in[k] - m) - log_s;
      } else {
        const T inv = T(1) / s;
        for (int64_t k = 0; k < n; ++k) out[k] *= inv;
      }
      return;
    }
    const int64_t width = i1 - i0;
    std::vector<T> m(x + base + i0, x + base + i1), s(static_cast<size_t>(width), T(0));
    for (int64_t k = 1; k < n; ++k) {
      const T* row = x + base + k * inner + i0;
      for (int64_t i = 0; i < width; ++i) m[i] = row[i] > m[i] ? row[i] : m[i];
    }
    for (int64_t k = 0; k < n; ++k) {
      const T* row = x + base + k * inner + i0;
      T* out = y + base + k * inner + i0;
      for (int64_t i = 0; i < width; ++i) {
        out[i] = math::exp(row[i] - m[i]);
        s[i] += out[i];
      }
    }
    for (int64_t i = 0; i < width; ++i) s[i] = log ? math::log(s[i]) : T(1) / s[i];
    for (int64_t k = 0; k < n; ++k) {
      const T* row = x + base + k * inner + i0;
      T* out = y + base + k * inner + i0;
      for (int64_t i = 0; i < width; ++i) out[i] = log ? (row[i] - m[i]) - s[i] : out[i] * s[i];
    }
  });
}

template <typename T, typename L>
void sparse_softmax_cross_entropy(const T* logits, const L* labels, int64_t batch, int64_t classes,
                                  T* loss) {
  parallel_for_columns(batch, classes, 1, [&](int64_t r, int64_t, int64_t) {
    const T* z = logits + r * classes;
    T m = z[0];
    for (int64_t k = 1; k < classes; ++k) m = z[k] > m ? z[k] : m;
    T s = 0;
    for (int64_t k = 0; k < classes; ++k) s += math::exp(z[k] - m);
    loss[r] = math::log(s) + m - z[labels[r]];
  });
}

template <typename T, typename L>
void sparse_softmax_cross_entropy_backward(const T* logits, const L* labels, const T* grad_loss,
                                           int64_t batch, int64_t classes, T* dlogits) {
  parallel_for_columns(batch, classes, 1, [&](int64_t r, int64_t, int64_t) {
    softmax(logits + r * classes, 1, classes, 1, false, dlogits + r * classes);
    T* d = dlogits + r * classes;
    d[labels[r]] -= T(1);
    for (int64_t k = 0; k < classes; ++k) d[k] *= grad_loss[r];
  });
}

#define TANDEM_SOFTMAX(F, T) \
  template void softmax<T>(const T*, int64_t, int64_t, int64_t, bool, T*);
#define TANDEM_XENT(F, T)                                                                          \
  template void sparse_softmax_cross_entropy<T, int32_t>(const T*, const int32_t*, int64_t,        \
                                                         int64_t, T*);                             \
  template void sparse_softmax_cross_entropy<T, int64_t>(const T*, const int64_t*, int64_t,        \
                                                         int64_t, T*);                             \
  template void sparse_softmax_cross_entropy_backward<T, int32_t>(const T*, const int32_t*,        \
                                                                  const T*, int64_t, int64_t, T*); \
  template void sparse_softmax_cross_entropy_backward<T, int64_t>(const T*, const int64_t*,        \
                                                                  const T*, int64_t, int64_t, T*);
TANDEM_FLOATING_TYPES(TANDEM_SOFTMAX, _)
TANDEM_FLOATING_TYPES(TANDEM_XENT, _)

}  // namespace tandem::ops::cpu
