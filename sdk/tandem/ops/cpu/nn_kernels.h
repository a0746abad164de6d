// CPU kernels behind matmul, conv2d, max_pool2d, avg_pool2d and dropout (called from nn_ops.cpp
// only). Row-major throughout; leading dimensions are in elements.
#pragma once

#include <cstdint>

namespace tandem::ops::cpu {

/// C = alpha * op(A) @ op(B) + beta * C, with op(A) [m, k] and op(B) [k, n]. float32 runs
/// oneDNN's dnnl_sgemm (threads: the calling thread's compute_threads()).
void gemm(bool transpose_a, bool transpose_b, int64_t m, int64_t n, int64_t k, float alpha,
          const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
          int64_t ldc);
/// The same for float64 (a blocked loop; used by gradient checks).
void gemm(bool transpose_a, bool transpose_b, int64_t m, int64_t n, int64_t k, double alpha,
          const double* a, int64_t lda, const double* b, int64_t ldb, double beta, double* c,
          int64_t ldc);

/// The row stride to which the float32 GEMMs (gemm, and dense's matmul) copy a B read as
/// stored (not transposed) before oneDNN reads it, or 0 where oneDNN reads B in place. oneDNN
/// 2.6's AVX2 sgemm runs at about half speed when B's rows lie a power of two of at least
/// 2 KiB apart (a 1024-wide layer's kernel): every row of a k step then falls into the same
/// cache sets, and its AVX-512 path copies such a B while the AVX2 path does not (measured by
/// bench_gemm_cpu's large-MLP rows). The copy, 16 floats longer per row, costs one pass over B;
/// below 8 rows of A it would cost about what it saves.
int64_t gemm_b_copy_stride(bool transpose_b, int64_t m, int64_t ldb);
/// to[i * to_stride + j] = from[i * from_stride + j] for i < rows, j < columns (the threads of
/// the caller's budget).
void copy_rows(int64_t rows, int64_t columns, const float* from, int64_t from_stride, float* to,
               int64_t to_stride);

/// Geometry of a 2-D convolution or pooling window over an NHWC input.
struct ConvGeometry {
  int64_t batch, in_h, in_w, channels;  // input [N, H, W, C]
  int64_t window_h, window_w;           // kernel or pool size
  int64_t stride_h, stride_w;
  int64_t pad_top, pad_left;  // SAME padding before (TF: total / 2 on top/left)
  int64_t out_h, out_w;
};

/// The im2col matrix of g: one row per output pixel, one column per kernel tap and channel.
inline int64_t im2col_rows(const ConvGeometry& g) { return g.batch * g.out_h * g.out_w; }
inline int64_t im2col_depth(const ConvGeometry& g) { return g.window_h * g.window_w * g.channels; }

/// x [N, H, W, C] -> cols [N * OH * OW, KH * KW * C] (zeros where the window is padding).
template <typename T>
void im2col(const ConvGeometry& g, const T* x, T* cols);
/// The adjoint of im2col: accumulates cols back into dx [N, H, W, C] (dx is overwritten).
template <typename T>
void col2im(const ConvGeometry& g, const T* cols, T* dx);

/// y [N, OH, OW, C] = window maxima (padding never wins; SAME pads with -inf as TensorFlow; a
/// NaN wins; a window of padding only gives -inf).
template <typename T>
void max_pool2d_forward(const ConvGeometry& g, const T* x, T* y);
/// dx (overwritten, [N, H, W, C]) receives dy at each window's first maximum, found again by
/// comparing x with the forward's output y (the first input equal to it, or the first NaN when
/// it is NaN); several windows' gradients add up in output order.
template <typename T>
void max_pool2d_backward(const ConvGeometry& g, const T* x, const T* y, const T* dy, T* dx);

/// y [N, OH, OW, C] = window means over the inputs inside the input (TensorFlow's SAME counts
/// only those; a window of padding only gives 0). float32 and float64.
template <typename T>
void avg_pool2d_forward(const ConvGeometry& g, const T* x, T* y);
/// dx (overwritten, [N, H, W, C]): each input gathers dy / count of the windows that contain it,
/// in output order.
template <typename T>
void avg_pool2d_backward(const ConvGeometry& g, const T* dy, T* dx);

/// y [n, width] = table rows indices[0..n) (each index in [0, rows), checked by the caller).
template <typename T, typename L>
void embedding_forward(const T* table, int64_t width, const L* indices, int64_t n, T* y);
/// dtable [rows, width] (overwritten) = the sum of dy's rows into the rows their indices name,
/// added in the order of the indices.
template <typename T, typename L>
void embedding_backward(const T* dy, const L* indices, int64_t n, int64_t rows, int64_t width,
                        T* dtable);

/// mask[i] = 1 / (1 - rate) when kept, else 0; element i uses lane i % 4 of Philox block
/// (first_block + i / 4) of (seed, stream), kept when its uniform float >= rate.
template <typename T>
void dropout_mask(int64_t n, double rate, uint64_t seed, uint64_t stream, uint64_t first_block,
                  T* mask);

}  // namespace tandem::ops::cpu
