// Batch normalization over the rows of x [rows, channels] (channels last), in training mode:
// the forward makes the batch's mean and biased variance and the normalized, scaled and shifted
// output (through a ReLU when asked) in two passes over float32 (three over float64); the
// backward makes the gradients of x, gamma and beta in two, the ReLU's mask read on the fly.
// Sums run in double over fixed blocks of rows, the blocks in parallel and combined in block
// order (float32 keeps four interleaved partial sums per channel within a block), so the
// results do not depend on the thread count (nor on the vector width).
#include "tandem/ops/cpu/batch_norm.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>
#include <vector>

#include "tandem/ops/cpu/cpu_dispatch.h"

namespace tandem::ops::cpu {

namespace {

constexpr int64_t kBlockRows = 512;  // rows per partial sum
// Below this many elements a parallel region costs more than it saves.
constexpr int64_t kParallelMinElements = int64_t{1} << 15;

/// g where out > 0, else +0 (ops::relu's gradient), as a bit mask: compilers vectorize it, where
/// a select of floats may become a branch per element.
template <typename T>
inline T pass_if_positive(T out, T g) {
  using Bits = std::conditional_t<sizeof(T) == 4, uint32_t, uint64_t>;
  const Bits mask = Bits{0} - static_cast<Bits>(out > T(0));
  return std::bit_cast<T>(static_cast<Bits>(std::bit_cast<Bits>(g) & mask));
}

// ---- the passes over rows [begin, end), each vectorized across the channels ------------------
// Built for AVX-512, AVX2 and the baseline (TANDEM_CPU_DISPATCH): each lane is one channel,
// whose sum runs over the rows in the same order at any width, and this file is compiled
// without multiply-add contraction, so all give the same bits.

// ---- float32 column sums, the rows interleaved ----------------------------------------------
// A sum over rows is a chain of dependent additions per channel; with 16 channels a row is one
// vector, and the chain's latency, not memory, set the pace. The float32 sums keep kPhases
// partial sums per channel instead: row r of a range adds into partial (r - begin) % kPhases,
// and the partials are combined as (p0 + p1) + (p2 + p3) at the range's end. The tiles of 16 or
// 8 channels held in registers and the one-channel remainder add in that same order, so the
// bits depend neither on the channel count nor on the vector width.

constexpr int kPhases = 4;

// The vector helpers are always inlined into one build of each function, so no vector ever
// crosses a call: the ABI note GCC gives for 32- and 64-byte vectors by value does not apply
// (GCC gives it at the end of the file, so it is off to the end).
#pragma GCC diagnostic ignored "-Wpsabi"

using Floats8 = float __attribute__((vector_size(32)));
using Doubles8 = double __attribute__((vector_size(64)));
using Bits8 = uint32_t __attribute__((vector_size(32)));

[[gnu::always_inline]] inline Floats8 load8(const float* p) {
  Floats8 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
[[gnu::always_inline]] inline Doubles8 widen8(Floats8 v) {
  return __builtin_convertvector(v, Doubles8);
}
/// g where out > 0, else +0, on 8 lanes (pass_if_positive).
[[gnu::always_inline]] inline Floats8 pass_if_positive8(Floats8 out, Floats8 g) {
  return reinterpret_cast<Floats8>(reinterpret_cast<Bits8>(g) &
                                   reinterpret_cast<Bits8>(out > Floats8{}));
}

/// Adds over rows [begin, end) f(r, c) = {u, v} (8 channels from c, as two vectors of doubles)
/// into acc[c..] (u) and acc[channels + c..] (v), for the V x 8 channels from c.
template <int V, typename F>
[[gnu::always_inline]] inline void tile_sums(int64_t begin, int64_t end, int64_t c,
                                             int64_t channels, const F& f, double* acc) {
  Doubles8 u[kPhases][V] = {}, v[kPhases][V] = {};
  int64_t r = begin;
  for (; r + kPhases <= end; r += kPhases)
    for (int p = 0; p < kPhases; ++p)
      for (int t = 0; t < V; ++t) {
        const auto [a, b] = f(r + p, c + 8 * t);
        u[p][t] += a;
        v[p][t] += b;
      }
  for (int p = 0; r < end; ++r, ++p)
    for (int t = 0; t < V; ++t) {
      const auto [a, b] = f(r, c + 8 * t);
      u[p][t] += a;
      v[p][t] += b;
    }
  for (int t = 0; t < V; ++t) {
    const Doubles8 su = (u[0][t] + u[1][t]) + (u[2][t] + u[3][t]);
    const Doubles8 sv = (v[0][t] + v[1][t]) + (v[2][t] + v[3][t]);
    for (int j = 0; j < 8; ++j) {
      acc[c + 8 * t + j] += su[j];
      acc[channels + c + 8 * t + j] += sv[j];
    }
  }
}

/// tile_sums over every channel: `vector(r, c)` for 8 channels, `scalar(r, c)` for one, which
/// must compute the same per lane.
template <typename Vector, typename Scalar>
[[gnu::always_inline]] inline void interleaved_sums(int64_t begin, int64_t end, int64_t channels,
                                                    const Vector& vector, const Scalar& scalar,
                                                    double* acc) {
  int64_t c = 0;
  for (; c + 16 <= channels; c += 16) tile_sums<2>(begin, end, c, channels, vector, acc);
  for (; c + 8 <= channels; c += 8) tile_sums<1>(begin, end, c, channels, vector, acc);
  for (; c < channels; ++c) {
    double u[kPhases] = {}, v[kPhases] = {};
    int64_t r = begin;
    for (; r + kPhases <= end; r += kPhases)
      for (int p = 0; p < kPhases; ++p) {
        const auto [a, b] = scalar(r + p, c);
        u[p] += a;
        v[p] += b;
      }
    for (int p = 0; r < end; ++r, ++p) {
      const auto [a, b] = scalar(r, c);
      u[p] += a;
      v[p] += b;
    }
    acc[c] += (u[0] + u[1]) + (u[2] + u[3]);
    acc[channels + c] += (v[0] + v[1]) + (v[2] + v[3]);
  }
}

/// acc[c] += x, acc[channels + c] += x^2 (in double), float32 x.
TANDEM_CPU_LOOP void moments_loop(const float* x, int64_t begin, int64_t end, int64_t channels,
                                  double* acc) {
  interleaved_sums(
      begin, end, channels,
      [&](int64_t r, int64_t c) {
        const Doubles8 a = widen8(load8(x + r * channels + c));
        return std::pair{a, a * a};
      },
      [&](int64_t r, int64_t c) {
        const auto a = static_cast<double>(x[r * channels + c]);
        return std::pair{a, a * a};
      },
      acc);
}

TANDEM_CPU_DISPATCH(moments, moments_loop,
                    (const float* x, int64_t begin, int64_t end, int64_t channels, double* acc),
                    (x, begin, end, channels, acc))

/// acc[c] += d, acc[channels + c] += d (x - mean), d = dy through the ReLU when `relu_output`;
/// float32 tensors.
TANDEM_CPU_LOOP void float_gradient_sums_loop(const float* x, const float* dy,
                                              const float* relu_output, int64_t begin, int64_t end,
                                              int64_t channels, const float* mean, double* acc) {
  const auto scalar = [&](int64_t r, int64_t c) {
    const int64_t i = r * channels + c;
    const auto d =
        static_cast<double>(relu_output ? pass_if_positive(relu_output[i], dy[i]) : dy[i]);
    return std::pair{d, d * (static_cast<double>(x[i]) - static_cast<double>(mean[c]))};
  };
  if (relu_output != nullptr) {
    interleaved_sums(
        begin, end, channels,
        [&](int64_t r, int64_t c) {
          const int64_t i = r * channels + c;
          const Doubles8 d = widen8(pass_if_positive8(load8(relu_output + i), load8(dy + i)));
          return std::pair{d, d * (widen8(load8(x + i)) - widen8(load8(mean + c)))};
        },
        scalar, acc);
  } else {
    interleaved_sums(
        begin, end, channels,
        [&](int64_t r, int64_t c) {
          const int64_t i = r * channels + c;
          const Doubles8 d = widen8(load8(dy + i));
          return std::pair{d, d * (widen8(load8(x + i)) - widen8(load8(mean + c)))};
        },
        scalar, acc);
  }
}

TANDEM_CPU_DISPATCH(gradient_sums, float_gradient_sums_loop,
                    (const float* x, const float* dy, const float* relu_output, int64_t begin,
                     int64_t end, int64_t channels, const float* mean, double* acc),
                    (x, dy, relu_output, begin, end, channels, mean, acc))

/// y = x * scale + shift, then max(y, 0) when `relu`.
template <typename T>
TANDEM_CPU_LOOP void scale_shift_loop(const T* x, int64_t begin, int64_t end, int64_t channels,
                                      const T* scale, const T* shift, bool relu, T* y) {
  for (int64_t r = begin; r < end; ++r) {
    const T* in = x + r * channels;
    T* out = y + r * channels;
    if (relu) {
#pragma omp simd
      for (int64_t c = 0; c < channels; ++c) {
        const T v = in[c] * scale[c] + shift[c];
        out[c] = v > T(0) ? v : T(0);  // as ops::relu
      }
    } else {
#pragma omp simd
      for (int64_t c = 0; c < channels; ++c) out[c] = in[c] * scale[c] + shift[c];
    }
  }
}
TANDEM_CPU_DISPATCH(scale_shift, scale_shift_loop,
                    (const float* x, int64_t begin, int64_t end, int64_t channels,
                     const float* scale, const float* shift, bool relu, float* y),
                    (x, begin, end, channels, scale, shift, relu, y))
TANDEM_CPU_DISPATCH(scale_shift, scale_shift_loop,
                    (const double* x, int64_t begin, int64_t end, int64_t channels,
                     const double* scale, const double* shift, bool relu, double* y),
                    (x, begin, end, channels, scale, shift, relu, y))

/// acc[c] += d, acc[channels + c] += d (x - mean), d = dy through the ReLU when `relu_output`.
template <typename T>
TANDEM_CPU_LOOP void gradient_sums_loop(const T* x, const T* dy, const T* relu_output,
                                        int64_t begin, int64_t end, int64_t channels, const T* mean,
                                        double* acc) {
  for (int64_t r = begin; r < end; ++r) {
    const T* in = x + r * channels;
    const T* g = dy + r * channels;
    if (relu_output != nullptr) {
      const T* out = relu_output + r * channels;
#pragma omp simd
      for (int64_t c = 0; c < channels; ++c) {
        const auto d = static_cast<double>(pass_if_positive(out[c], g[c]));
        acc[c] += d;
        acc[channels + c] += d * (static_cast<double>(in[c]) - static_cast<double>(mean[c]));
      }
    } else {
#pragma omp simd
      for (int64_t c = 0; c < channels; ++c) {
        const auto d = static_cast<double>(g[c]);
        acc[c] += d;
        acc[channels + c] += d * (static_cast<double>(in[c]) - static_cast<double>(mean[c]));
      }
    }
  }
}
TANDEM_CPU_DISPATCH(gradient_sums, gradient_sums_loop,
                    (const double* x, const double* dy, const double* relu_output, int64_t begin,
                     int64_t end, int64_t channels, const double* mean, double* acc),
                    (x, dy, relu_output, begin, end, channels, mean, acc))

/// dx = k d + x a + b per channel, d = dy through the ReLU when `relu_output`.
template <typename T>
TANDEM_CPU_LOOP void input_gradient_loop(const T* x, const T* dy, const T* relu_output,
                                         int64_t begin, int64_t end, int64_t channels, const T* k,
                                         const T* a, const T* b, T* dx) {
  for (int64_t r = begin; r < end; ++r) {
    const T* in = x + r * channels;
    const T* g = dy + r * channels;
    T* out = dx + r * channels;
    if (relu_output != nullptr) {
      const T* mask = relu_output + r * channels;
#pragma omp simd
      for (int64_t c = 0; c < channels; ++c)
        out[c] = k[c] * pass_if_positive(mask[c], g[c]) + in[c] * a[c] + b[c];
    } else {
#pragma omp simd
      for (int64_t c = 0; c < channels; ++c) out[c] = k[c] * g[c] + in[c] * a[c] + b[c];
    }
  }
}
TANDEM_CPU_DISPATCH(input_gradient, input_gradient_loop,
                    (const float* x, const float* dy, const float* relu_output, int64_t begin,
                     int64_t end, int64_t channels, const float* k, const float* a, const float* b,
                     float* dx),
                    (x, dy, relu_output, begin, end, channels, k, a, b, dx))
TANDEM_CPU_DISPATCH(input_gradient, input_gradient_loop,
                    (const double* x, const double* dy, const double* relu_output, int64_t begin,
                     int64_t end, int64_t channels, const double* k, const double* a,
                     const double* b, double* dx),
                    (x, dy, relu_output, begin, end, channels, k, a, b, dx))

/// sums[c] (and, with `second`, sums2[c]) over every row: f(begin, end, acc) adds rows
/// [begin, end) into acc (width channels, or 2 x channels with `second`), for blocks of
/// kBlockRows in parallel, the blocks added in order.
template <typename F>
void column_sums(int64_t rows, int64_t channels, const F& f, std::vector<double>& sums,
                 std::vector<double>* second) {
  const int64_t blocks = (rows + kBlockRows - 1) / kBlockRows;
  const int64_t width = second ? 2 * channels : channels;
  std::vector<double> partial(static_cast<size_t>(std::max<int64_t>(blocks, 1) * width), 0.0);
#pragma omp parallel for schedule(static) if (rows * channels >= kParallelMinElements)
  for (int64_t b = 0; b < blocks; ++b)
    f(b * kBlockRows, std::min(rows, (b + 1) * kBlockRows), partial.data() + b * width);
  sums.assign(static_cast<size_t>(channels), 0.0);
  if (second) second->assign(static_cast<size_t>(channels), 0.0);
  for (int64_t b = 0; b < blocks; ++b) {
    const double* acc = partial.data() + b * width;
    for (int64_t c = 0; c < channels; ++c) sums[static_cast<size_t>(c)] += acc[c];
    if (second)
      for (int64_t c = 0; c < channels; ++c) (*second)[static_cast<size_t>(c)] += acc[channels + c];
  }
}

/// Rows [0, rows) in chunks of kBlockRows, in parallel when there are enough elements.
template <typename F>
void row_blocks(int64_t rows, int64_t channels, const F& f) {
  const int64_t blocks = (rows + kBlockRows - 1) / kBlockRows;
#pragma omp parallel for schedule(static) if (rows * channels >= kParallelMinElements)
  for (int64_t b = 0; b < blocks; ++b) f(b * kBlockRows, std::min(rows, (b + 1) * kBlockRows));
}

}  // namespace

template <typename T>
void batch_norm_forward(const T* x, int64_t rows, int64_t channels, const T* gamma, const T* beta,
                        double epsilon, bool relu, T* y, T* mean, T* variance, T* inverse) {
  const auto n = static_cast<double>(rows);
  std::vector<double> sums, squares;
  std::vector<double> m(static_cast<size_t>(channels));
  if constexpr (sizeof(T) < sizeof(double)) {
    // One pass: the sums of x and x^2 in double, whose 53 bits keep E[x^2] - E[x]^2 exact to
    // float32's precision unless |mean| / deviation exceeds about 2^14.
    column_sums(
        rows, channels,
        [&](int64_t begin, int64_t end, double* acc) { moments(x, begin, end, channels, acc); },
        sums, &squares);
    for (int64_t c = 0; c < channels; ++c) {
      const auto i = static_cast<size_t>(c);
      m[i] = sums[i] / n;
      squares[i] = std::max(squares[i] - m[i] * sums[i], 0.0);  // n * variance
    }
  } else {
    // Two passes: the mean, then the squared deviations from it.
    column_sums(
        rows, channels,
        [&](int64_t begin, int64_t end, double* acc) {
          for (int64_t r = begin; r < end; ++r) {
            const T* row = x + r * channels;
#pragma omp simd
            for (int64_t c = 0; c < channels; ++c) acc[c] += static_cast<double>(row[c]);
          }
        },
        sums, nullptr);
    for (int64_t c = 0; c < channels; ++c)
      m[static_cast<size_t>(c)] = sums[static_cast<size_t>(c)] / n;
    column_sums(
        rows, channels,
        [&](int64_t begin, int64_t end, double* acc) {
          for (int64_t r = begin; r < end; ++r) {
            const T* row = x + r * channels;
#pragma omp simd
            for (int64_t c = 0; c < channels; ++c) {
              const double d = static_cast<double>(row[c]) - m[static_cast<size_t>(c)];
              acc[c] += d * d;
            }
          }
        },
        squares, nullptr);
  }
  // y = x * scale + shift, with scale = gamma / sqrt(var + eps), shift = beta - mean * scale.
  std::vector<T> scale(static_cast<size_t>(channels)), shift(static_cast<size_t>(channels));
  for (int64_t c = 0; c < channels; ++c) {
    const auto i = static_cast<size_t>(c);
    const double var = squares[i] / n;
    const double inv = 1.0 / std::sqrt(var + epsilon);
    mean[c] = static_cast<T>(m[i]);
    variance[c] = static_cast<T>(var);
    inverse[c] = static_cast<T>(inv);
    const double s = inv * (gamma ? static_cast<double>(gamma[c]) : 1.0);
    scale[i] = static_cast<T>(s);
    shift[i] = static_cast<T>((beta ? static_cast<double>(beta[c]) : 0.0) - m[i] * s);
  }
  row_blocks(rows, channels, [&](int64_t begin, int64_t end) {
    scale_shift(x, begin, end, channels, scale.data(), shift.data(), relu, y);
  });
}

template <typename T>
void batch_norm_backward(const T* x, const T* dy, const T* relu_output, int64_t rows,
                         int64_t channels, const T* gamma, const T* mean, const T* inverse, T* dx,
                         T* dgamma, T* dbeta) {
  const auto n = static_cast<double>(rows);
  std::vector<double> sum_dy, sum_dy_centered;
  // dy through the ReLU: dy where the output is > 0, else 0 (as ops::relu's gradient).
  column_sums(
      rows, channels,
      [&](int64_t begin, int64_t end, double* acc) {
        gradient_sums(x, dy, relu_output, begin, end, channels, mean, acc);
      },
      sum_dy, &sum_dy_centered);
  // dx = k (dy - sum_dy / n - xhat * dgamma / n), k = gamma * inv, xhat = (x - mean) * inv,
  // dgamma = sum(dy * xhat): dx = k * dy + x * a + b per channel.
  std::vector<T> k(static_cast<size_t>(channels)), a(static_cast<size_t>(channels)),
      b(static_cast<size_t>(channels));
  for (int64_t c = 0; c < channels; ++c) {
    const auto i = static_cast<size_t>(c);
    const double inv = static_cast<double>(inverse[c]);
    const double dg = sum_dy_centered[i] * inv;
    if (dgamma) dgamma[c] = static_cast<T>(dg);
    if (dbeta) dbeta[c] = static_cast<T>(sum_dy[i]);
    const double kc = inv * (gamma ? static_cast<double>(gamma[c]) : 1.0);
    const double slope = -kc * inv * dg / n;  // multiplies (x - mean)
    k[i] = static_cast<T>(kc);
    a[i] = static_cast<T>(slope);
    b[i] = static_cast<T>(-kc * sum_dy[i] / n - slope * static_cast<double>(mean[c]));
  }
  if (dx == nullptr) return;
  row_blocks(rows, channels, [&](int64_t begin, int64_t end) {
    input_gradient(x, dy, relu_output, begin, end, channels, k.data(), a.data(), b.data(), dx);
  });
}

template void batch_norm_forward<float>(const float*, int64_t, int64_t, const float*, const float*,
                                        double, bool, float*, float*, float*, float*);
template void batch_norm_forward<double>(const double*, int64_t, int64_t, const double*,
                                         const double*, double, bool, double*, double*, double*,
                                         double*);
template void batch_norm_backward<float>(const float*, const float*, const float*, int64_t, int64_t,
                                         const float*, const float*, const float*, float*, float*,
                                         float*);
template void batch_norm_backward<double>(const double*, const double*, const double*, int64_t,
                                          int64_t, const double*, const double*, const double*,
                                          double*, double*, double*);

}  // namespace tandem::ops::cpu
