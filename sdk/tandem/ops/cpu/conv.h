// CPU kernels behind ops::conv2d: the fused forward y = act(conv(x, w) + bias) and the two halves
// of its backward (kernel and bias gradients; input gradient). Inputs and outputs NHWC, kernels
// HWIO ([KH, KW, C, filters]), all contiguous; the window geometry is the op's (ConvGeometry).
#pragma once

#include <cstdint>

#include "tandem/core/half.h"
#include "tandem/ops/cpu/nn_kernels.h"

namespace tandem::ops::cpu {

/// y [N, OH, OW, filters] = act(conv(x, w) + bias), act = ReLU when `relu`, else the identity;
/// `bias` may be null. float32 runs oneDNN's convolution primitive with the bias and the ReLU
/// applied to the accumulator (primitives cached per geometry, epilogue and thread budget);
/// float64, and float32 without oneDNN, run im2col, cpu::gemm and one epilogue pass, as
/// cpu::dense does.
void conv2d(const ConvGeometry& g, int64_t filters, const float* x, const float* w,
            const float* bias, bool relu, float* y);
void conv2d(const ConvGeometry& g, int64_t filters, const double* x, const double* w,
            const double* bias, bool relu, double* y);

/// The kernel gradient dw [KH, KW, C, filters] of a convolution of x whose output gradient is
/// dy [N, OH, OW, filters] (an activation's mask already applied) and, when `db` is not null,
/// the bias gradient db [filters] = the sum of dy over N, OH and OW. float32 runs oneDNN's
/// backward-weights primitive; float64 (and float32 without oneDNN) im2col and cpu::gemm, with
/// db summed as cpu::sum sums.
void conv2d_backward_weights(const ConvGeometry& g, int64_t filters, const float* x,
                             const float* dy, float* dw, float* db);
void conv2d_backward_weights(const ConvGeometry& g, int64_t filters, const double* x,
                             const double* dy, double* dw, double* db);

/// The input gradient dx [N, H, W, C] (overwritten) of a convolution with kernel w whose output
/// gradient is dy. float32 runs oneDNN's backward-data primitive; float64 (and float32 without
/// oneDNN) cpu::gemm and col2im.
void conv2d_backward_data(const ConvGeometry& g, int64_t filters, const float* dy, const float* w,
                          float* dx);
void conv2d_backward_data(const ConvGeometry& g, int64_t filters, const double* dy, const double* w,
                          double* dx);

/// The same three in 16 bits, summed in float32 and rounded once: bfloat16 on oneDNN's
/// bfloat16 primitives where it makes them (AVX-512 CPUs; natively with AVX512-BF16 or AMX);
/// float16, and bfloat16 elsewhere, widened to float32 (emulated: no faster than float32).
void conv2d(const ConvGeometry& g, int64_t filters, const bfloat16* x, const bfloat16* w,
            const bfloat16* bias, bool relu, bfloat16* y);
void conv2d(const ConvGeometry& g, int64_t filters, const float16* x, const float16* w,
            const float16* bias, bool relu, float16* y);
void conv2d_backward_weights(const ConvGeometry& g, int64_t filters, const bfloat16* x,
                             const bfloat16* dy, bfloat16* dw, bfloat16* db);
void conv2d_backward_weights(const ConvGeometry& g, int64_t filters, const float16* x,
                             const float16* dy, float16* dw, float16* db);
void conv2d_backward_data(const ConvGeometry& g, int64_t filters, const bfloat16* dy,
                          const bfloat16* w, bfloat16* dx);
void conv2d_backward_data(const ConvGeometry& g, int64_t filters, const float16* dy,
                          const float16* w, float16* dx);

/// Whether float32 convolutions that oneDNN's Winograd kernels take (3x3, stride 1, SAME,
/// channel counts multiples of 16) run on them: on unless set off, or TANDEM_CONV_WINOGRAD=0 at
/// start-up (ops::set_winograd_convolutions).
bool winograd_convolutions();
void set_winograd_convolutions(bool enabled);

}  // namespace tandem::ops::cpu
