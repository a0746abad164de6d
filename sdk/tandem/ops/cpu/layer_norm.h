// CPU kernels of layer normalization over the last axis of x [rows, features]
// (ops::layer_norm).
#pragma once

#include <cstdint>

namespace tandem::ops::cpu {

/// Per row: mean, inverse = 1 / sqrt(biased variance + epsilon), and
/// y = (x - mean) * inverse * gamma + beta (gamma, beta [features]: nullptr for 1 and 0). Sums
/// in double.
template <typename T>
void layer_norm_forward(const T* x, int64_t rows, int64_t features, const T* gamma, const T* beta,
                        double epsilon, T* y, T* mean, T* inverse);

/// The gradients of layer_norm_forward's y with respect to x (dx), gamma and beta given dy and
/// the forward's mean and inverse; nullptr skips dgamma or dbeta. dgamma and dbeta add the rows
/// in fixed blocks, then the blocks in order: the same bits for any thread count.
template <typename T>
void layer_norm_backward(const T* x, const T* dy, int64_t rows, int64_t features, const T* gamma,
                         const T* mean, const T* inverse, T* dx, T* dgamma, T* dbeta);

}  // namespace tandem::ops::cpu
