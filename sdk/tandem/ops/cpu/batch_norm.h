// CPU kernels of batch normalization in training mode over x [rows, channels] (ops::batch_norm).
#pragma once

#include <cstdint>

namespace tandem::ops::cpu {

/// mean, variance (biased) and inverse = 1 / sqrt(variance + epsilon) per channel over the rows
/// of x, and y = (x - mean) * inverse * gamma + beta (gamma, beta: nullptr for 1 and 0), then
/// max(y, 0) when `relu`.
template <typename T>
void batch_norm_forward(const T* x, int64_t rows, int64_t channels, const T* gamma, const T* beta,
                        double epsilon, bool relu, T* y, T* mean, T* variance, T* inverse);
/// The gradients of batch_norm_forward's y with respect to x (dx), gamma and beta given dy and
/// the forward's mean and inverse; nullptr skips an output. `relu_output`: the forward's y when
/// it applied the ReLU (dy counts where it is > 0), else nullptr.
template <typename T>
void batch_norm_backward(const T* x, const T* dy, const T* relu_output, int64_t rows,
                         int64_t channels, const T* gamma, const T* mean, const T* inverse, T* dx,
                         T* dgamma, T* dbeta);

}  // namespace tandem::ops::cpu
