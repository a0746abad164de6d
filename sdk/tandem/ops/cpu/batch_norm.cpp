// Batch normalization over the rows of x [rows, channels] (channels last), in training mode:
// the forward makes the batch's mean and biased variance and the normalized, scaled and shifted
// output in two passes over float32 (three over float64); the backward makes the gradients of x,
// gamma and beta in two. Sums run in double over fixed blocks of rows, the blocks in parallel and
// combined in block order, so the results do not depend on the thread count.
#include "tandem/ops/cpu/batch_norm.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace tandem::ops::cpu {

namespace {

constexpr int64_t kBlockRows = 512;  // rows per partial sum
// Below this many elements a parallel region costs more than it saves.
constexpr int64_t kParallelMinElements = int64_t{1} << 15;

/// sums[c] (and, with `second`, sums2[c]) over every row of f(row, c), blocks of kBlockRows in
/// parallel, added in block order.
template <typename F>
void column_sums(int64_t rows, int64_t channels, const F& f, std::vector<double>& sums,
                 std::vector<double>* second) {
  const int64_t blocks = (rows + kBlockRows - 1) / kBlockRows;
  const int64_t width = second ? 2 * channels : channels;
  std::vector<double> partial(static_cast<size_t>(std::max<int64_t>(blocks, 1) * width), 0.0);
#pragma omp parallel for schedule(static) if (rows * channels >= kParallelMinElements)
  for (int64_t b = 0; b < blocks; ++b) {
    double* acc = partial.data() + b * width;
    const int64_t end = std::min(rows, (b + 1) * kBlockRows);
    for (int64_t r = b * kBlockRows; r < end; ++r) f(r, acc);
  }
  sums.assign(static_cast<size_t>(channels), 0.0);
  if (second) second->assign(static_cast<size_t>(channels), 0.0);
  for (int64_t b = 0; b < blocks; ++b) {
    const double* acc = partial.data() + b * width;
    for (int64_t c = 0; c < channels; ++c) sums[static_cast<size_t>(c)] += acc[c];
    if (second)
      for (int64_t c = 0; c < channels; ++c) (*second)[static_cast<size_t>(c)] += acc[channels + c];
  }
}

}  // namespace

template <typename T>
void batch_norm_forward(const T* x, int64_t rows, int64_t channels, const T* gamma, const T* beta,
                        double epsilon, T* y, T* mean, T* variance, T* inverse) {
  const auto n = static_cast<double>(rows);
  std::vector<double> sums, squares;
  std::vector<double> m(static_cast<size_t>(channels));
  if constexpr (sizeof(T) < sizeof(double)) {
    // One pass: the sums of x and x^2 in double, whose 53 bits keep E[x^2] - E[x]^2 exact to
    // float32's precision unless |mean| / deviation exceeds about 2^14.
    column_sums(
        rows, channels,
        [&](int64_t r, double* acc) {
          const T* row = x + r * channels;
#pragma omp simd
          for (int64_t c = 0; c < channels; ++c) {
            const auto v = static_cast<double>(row[c]);
            acc[c] += v;
            acc[channels + c] += v * v;
          }
        },
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
        [&](int64_t r, double* acc) {
          const T* row = x + r * channels;
#pragma omp simd
          for (int64_t c = 0; c < channels; ++c) acc[c] += static_cast<double>(row[c]);
        },
        sums, nullptr);
    for (int64_t c = 0; c < channels; ++c)
      m[static_cast<size_t>(c)] = sums[static_cast<size_t>(c)] / n;
    column_sums(
        rows, channels,
        [&](int64_t r, double* acc) {
          const T* row = x + r * channels;
#pragma omp simd
          for (int64_t c = 0; c < channels; ++c) {
            const double d = static_cast<double>(row[c]) - m[static_cast<size_t>(c)];
            acc[c] += d * d;
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
  const T* sc = scale.data();
  const T* sh = shift.data();
#pragma omp parallel for schedule(static) if (rows * channels >= kParallelMinElements)
  for (int64_t r = 0; r < rows; ++r) {
    const T* in = x + r * channels;
    T* out = y + r * channels;
#pragma omp simd
    for (int64_t c = 0; c < channels; ++c) out[c] = in[c] * sc[c] + sh[c];
  }
}

template <typename T>
void batch_norm_backward(const T* x, const T* dy, int64_t rows, int64_t channels, const T* gamma,
                         const T* mean, const T* inverse, T* dx, T* dgamma, T* dbeta) {
  const auto n = static_cast<double>(rows);
  std::vector<double> sum_dy, sum_dy_centered;
  column_sums(
      rows, channels,
      [&](int64_t r, double* acc) {
        const T* in = x + r * channels;
        const T* g = dy + r * channels;
#pragma omp simd
        for (int64_t c = 0; c < channels; ++c) {
          const double d = static_cast<double>(g[c]);
          acc[c] += d;
          acc[channels + c] += d * (static_cast<double>(in[c]) - static_cast<double>(mean[c]));
        }
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
  const T* kp = k.data();
  const T* ap = a.data();
  const T* bp = b.data();
#pragma omp parallel for schedule(static) if (rows * channels >= kParallelMinElements)
  for (int64_t r = 0; r < rows; ++r) {
    const T* in = x + r * channels;
    const T* g = dy + r * channels;
    T* out = dx + r * channels;
#pragma omp simd
    for (int64_t c = 0; c < channels; ++c) out[c] = kp[c] * g[c] + in[c] * ap[c] + bp[c];
  }
}

template void batch_norm_forward<float>(const float*, int64_t, int64_t, const float*, const float*,
                                        double, float*, float*, float*, float*);
template void batch_norm_forward<double>(const double*, int64_t, int64_t, const double*,
                                         const double*, double, double*, double*, double*, double*);
template void batch_norm_backward<float>(const float*, const float*, int64_t, int64_t, const float*,
                                         const float*, const float*, float*, float*, float*);
template void batch_norm_backward<double>(const double*, const double*, int64_t, int64_t,
                                          const double*, const double*, const double*, double*,
                                          double*, double*);

}  // namespace tandem::ops::cpu
