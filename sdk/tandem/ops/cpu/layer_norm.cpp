// Layer normalization's CPU kernels (layer_norm.h): one pass over each row for the statistics
// and the output, one for the gradients, rows split across the compute threads.
#include "tandem/ops/cpu/layer_norm.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "tandem/ops/cpu/parallel.h"

namespace tandem::ops::cpu {

namespace {

/// Rows whose gamma and beta gradients one partial sum holds: the blocks, not the threads,
/// fix the order of the sums.
constexpr int64_t kBlockRows = 32;

/// The sum over f < n of term(f) in double: eight partial sums by f mod 8, added at the end in
/// a fixed order, so the loop has independent additions to vectorise and its bits do not depend
/// on the vector width.
template <typename Term>
inline double lane_sum(int64_t n, const Term& term) {
  constexpr int64_t kLanes = 8;
  double lanes[kLanes] = {};
  const int64_t whole = n / kLanes * kLanes;
  for (int64_t f = 0; f < whole; f += kLanes)
    for (int64_t j = 0; j < kLanes; ++j) lanes[j] += term(f + j);
  for (int64_t f = whole; f < n; ++f) lanes[f - whole] += term(f);
  return ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) +
         ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
}

}  // namespace

template <typename T>
void layer_norm_forward(const T* x, int64_t rows, int64_t features, const T* gamma, const T* beta,
                        double epsilon, T* y, T* mean, T* inverse) {
  const int64_t grain = std::max<int64_t>(1, kElementwiseGrain / std::max<int64_t>(features, 1));
  parallel_for(rows, grain, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const T* xr = x + r * features;
      T* yr = y + r * features;
      const double sum = lane_sum(features, [&](int64_t f) { return static_cast<double>(xr[f]); });
      const double mu = features > 0 ? sum / static_cast<double>(features) : 0.0;
      const double squares = lane_sum(features, [&](int64_t f) {
        const double c = static_cast<double>(xr[f]) - mu;
        return c * c;
      });
      const double variance = features > 0 ? squares / static_cast<double>(features) : 0.0;
      const T m = static_cast<T>(mu);
      const T inv = static_cast<T>(1.0 / std::sqrt(variance + epsilon));
      mean[r] = m;
      inverse[r] = inv;
      if (gamma != nullptr && beta != nullptr) {
        for (int64_t f = 0; f < features; ++f) yr[f] = (xr[f] - m) * inv * gamma[f] + beta[f];
      } else if (gamma != nullptr) {
        for (int64_t f = 0; f < features; ++f) yr[f] = (xr[f] - m) * inv * gamma[f];
      } else if (beta != nullptr) {
        for (int64_t f = 0; f < features; ++f) yr[f] = (xr[f] - m) * inv + beta[f];
      } else {
        for (int64_t f = 0; f < features; ++f) yr[f] = (xr[f] - m) * inv;
      }
    }
  });
}

template <typename T>
void layer_norm_backward(const T* x, const T* dy, int64_t rows, int64_t features, const T* gamma,
                         const T* mean, const T* inverse, T* dx, T* dgamma, T* dbeta) {
  const int64_t blocks = (rows + kBlockRows - 1) / kBlockRows;
  const bool parameters = dgamma != nullptr || dbeta != nullptr;
  // Per block: the gamma partial sums [features], then beta's [features].
  std::vector<double> partial(parameters ? static_cast<size_t>(blocks * 2 * features) : 0);
  const int64_t grain = std::max<int64_t>(
      1, kElementwiseGrain / std::max<int64_t>(kBlockRows * std::max<int64_t>(features, 1), 1));
  parallel_for(blocks, grain, [&](int64_t first, int64_t last) {
    std::vector<T> scaled(static_cast<size_t>(features));  // dy * gamma of one row
    for (int64_t block = first; block < last; ++block) {
      double* dgamma_block = parameters ? partial.data() + block * 2 * features : nullptr;
      double* dbeta_block = parameters ? dgamma_block + features : nullptr;
      if (parameters) std::fill(dgamma_block, dgamma_block + 2 * features, 0.0);
      const int64_t row_end = std::min(rows, (block + 1) * kBlockRows);
      for (int64_t r = block * kBlockRows; r < row_end; ++r) {
        const T* xr = x + r * features;
        const T* gr = dy + r * features;
        T* dxr = dx + r * features;
        const T m = mean[r], inv = inverse[r];
        T* sc = scaled.data();
        if (gamma != nullptr) {
          for (int64_t f = 0; f < features; ++f) sc[f] = gr[f] * gamma[f];
        } else {
          std::copy(gr, gr + features, sc);
        }
        if (parameters) {
          for (int64_t f = 0; f < features; ++f) {
            const T xhat = (xr[f] - m) * inv;
            dgamma_block[f] += static_cast<double>(gr[f]) * static_cast<double>(xhat);
            dbeta_block[f] += static_cast<double>(gr[f]);
          }
        }
        const double sum_g = lane_sum(features, [&](int64_t f) { return double(sc[f]); });
        const double sum_gx = lane_sum(features, [&](int64_t f) {
          return static_cast<double>(sc[f]) * static_cast<double>((xr[f] - m) * inv);
        });
        const T a = static_cast<T>(sum_g / static_cast<double>(features));
        const T b = static_cast<T>(sum_gx / static_cast<double>(features));
        for (int64_t f = 0; f < features; ++f) {
          const T xhat = (xr[f] - m) * inv;
          dxr[f] = inv * (sc[f] - a - xhat * b);
        }
      }
    }
  });
  if (!parameters) return;
  for (int64_t f = 0; f < features; ++f) {
    double sum_gamma = 0, sum_beta = 0;
    for (int64_t block = 0; block < blocks; ++block) {
      sum_gamma += partial[static_cast<size_t>(block * 2 * features + f)];
      sum_beta += partial[static_cast<size_t>(block * 2 * features + features + f)];
    }
    if (dgamma != nullptr) dgamma[f] = static_cast<T>(sum_gamma);
    if (dbeta != nullptr) dbeta[f] = static_cast<T>(sum_beta);
  }
}

template void layer_norm_forward<float>(const float*, int64_t, int64_t, const float*, const float*,
                                        double, float*, float*, float*);
template void layer_norm_forward<double>(const double*, int64_t, int64_t, const double*,
                                         const double*, double, double*, double*, double*);
template void layer_norm_backward<float>(const float*, const float*, int64_t, int64_t, const float*,
                                         const float*, const float*, float*, float*, float*);
template void layer_norm_backward<double>(const double*, const double*, int64_t, int64_t,
                                          const double*, const double*, const double*, double*,
                                          double*, double*);

}  // namespace tandem::ops::cpu
