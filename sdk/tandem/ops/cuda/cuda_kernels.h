// The CUDA kernels behind every op, as host functions on raw device pointers: each mirrors the
// CPU kernel of the same name in ops/cpu/*.h, with the stream to run on as the last argument.
// Called from the ops layer only (CUDA builds, through ops/internal/dispatch.h), under a
// DeviceGuard for the tensors' device.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "tandem/core/dtype.h"
#include "tandem/ops/cpu/nn_kernels.h"
#include "tandem/ops/kernels/broadcast.h"
#include "tandem/ops/kernels/functors.h"
#include "tandem/ops/kernels/optimizer_functors.h"

namespace tandem::ops::cuda {

// Every launcher is asynchronous on `stream` (unless it says otherwise) and ends with a launch
// check, so a bad launch raises tandem::Error at the call; faults inside a kernel surface at
// the next synchronising call. Pointers are device pointers of the current device.

// ---- elementwise (ops/cuda/elementwise.cu); functor x dtype pairs of ops/kernels/op_list.h --

/// y[i] = f(x[i]) for i < n, of type R (T, or bool for a predicate); y may alias x.
template <typename F, typename T, typename R>
void unary(const F& f, int64_t n, const T* x, R* y, cudaStream_t stream);

/// y = f(a, b) walked as `plan` says (numpy broadcasting); y may alias a when a is not
/// broadcast. Plans with more than kMaxBroadcastDims outer dimensions raise.
template <typename F, typename T, typename R>
void binary(const F& f, const kernels::BroadcastPlan& plan, const T* a, const T* b, R* y,
            cudaStream_t stream);
inline constexpr int kMaxBroadcastDims = 8;

/// y = f(condition, a, b) walked as `plan` says (where); the elements of a and b pass to f
/// unwidened. Plans with more than kMaxBroadcastDims outer dimensions raise.
template <typename F, typename T>
void select(const F& f, const kernels::SelectPlan& plan, const bool* condition, const T* a,
            const T* b, T* y, cudaStream_t stream);

/// y[i] = x[i] converted from `from` to `to` (nonzero -> true for bool).
void cast(DType from, DType to, int64_t n, const void* x, void* y, cudaStream_t stream);

/// y[i] = value converted to `dtype`, for i < n. Asynchronous, unlike a fill through a host
/// copy (a pageable cudaMemcpy waits for the device), so scalars and zeros cost no sync.
void fill(DType dtype, int64_t n, double value, void* y, cudaStream_t stream);

// ---- fused optimizer updates (ops/cuda/optimizer_updates.cu) ------------------------------

/// Slots an update rule may keep per variable (kernels::*Update<T>::kSlots).
inline constexpr int kMaxUpdateSlots = 2;

/// The tensors of one variable in a multi-tensor optimizer update: the variable, its gradient
/// and up to kMaxUpdateSlots slots (null past the update's slot count), each of `numel`
/// elements.
template <typename T>
struct UpdateOperands {
  T* variable;
  const T* gradient;
  T* slots[kMaxUpdateSlots];
  int64_t numel;
};

/// Elements one block updates in a multi-tensor launch: a large variable spreads over many
/// blocks, a bias takes one.
inline constexpr int64_t kUpdateChunk = int64_t{1} << 16;
/// Variables one multi-tensor launch takes. Their pointers and sizes travel as kernel
/// arguments (no device table to allocate or upload), which stay under the 4 KiB limit.
inline constexpr int kMaxUpdateTensors = 64;

// f(w[i], g[i], slots[i]...) for every element of every variable of `operands`, in place on
// the variables and their slots (as the CPU loop cpu::optimizer_update per variable): one
// launch per kMaxUpdateTensors variables. F is a rule of TANDEM_FUSED_UPDATE_RULES for T, float
// or double. Returns the launches issued.
template <typename F, typename T>
int optimizer_update(const F& f, const std::vector<UpdateOperands<T>>& operands,
                     cudaStream_t stream);

// ---- reductions and softmax (ops/cuda/reduce.cu); x viewed as [outer, n, inner] -----------

/// y[o, i] = sum_k x[o, k, i], accumulated in double (floating) or int64 (integers).
template <typename T>
void sum(const T* x, int64_t outer, int64_t n, int64_t inner, T* y, cudaStream_t stream);

/// y[o, i] = max_k x[o, k, i] and argmax[o, i] = the first k reaching it; n >= 1. Either
/// output may be null.
template <typename T>
void max(const T* x, int64_t outer, int64_t n, int64_t inner, T* y, int64_t* argmax,
         cudaStream_t stream);

/// dx[o, k, i] = g[o, i] where k == argmax[o, i], else 0 (dx is overwritten).
template <typename T>
void scatter_argmax(const T* g, const int64_t* argmax, int64_t outer, int64_t n, int64_t inner,
                    T* dx, cudaStream_t stream);

/// Softmax (or log-softmax when `log`) over n; n >= 1.
template <typename T>
void softmax(const T* x, int64_t outer, int64_t n, int64_t inner, bool log, T* y,
             cudaStream_t stream);

/// loss[r] = logsumexp(logits[r, :]) - logits[r, labels[r]] for r < batch (labels checked by
/// the caller; a label outside [0, classes) gives NaN rather than a stray read).
template <typename T, typename L>
void sparse_softmax_cross_entropy(const T* logits, const L* labels, int64_t batch, int64_t classes,
                                  T* loss, cudaStream_t stream);

/// The fused backward: dlogits[r, k] = grad_loss[r] * (softmax(logits[r, :])[k] - (k == label)).
template <typename T, typename L>
void sparse_softmax_cross_entropy_backward(const T* logits, const L* labels, const T* grad_loss,
                                           int64_t batch, int64_t classes, T* dlogits,
                                           cudaStream_t stream);

// ---- data movement (ops/cuda/shape_ops.cu) ------------------------------------------------

/// y = x with its axes permuted (y.dims[i] = dims[perm[i]]), elements of 1, 4 or 8 bytes.
void transpose(size_t element_size, const std::vector<int64_t>& dims,
               const std::vector<int64_t>& perm, const void* x, void* y, cudaStream_t stream);

/// Index of the first label outside [0, depth), or -1 when all are valid. Synchronous: it
/// waits for `stream` to read the answer back (a few microseconds plus the queued work).
template <typename L>
int64_t first_invalid_label(const L* labels, int64_t n, int64_t depth, cudaStream_t stream);

/// y [n, depth] = one-hot rows of labels (all valid).
template <typename L, typename T>
void one_hot(const L* labels, int64_t n, int64_t depth, T* y, cudaStream_t stream);

/// Copies n bytes between device buffers, ordered on `stream` (concat, clone in op bodies).
void copy(void* dst, const void* src, size_t n, cudaStream_t stream);

// ---- the dense layer's forward through cuBLASLt (ops/cuda/dense.cpp) ------------------------

/// y[m, n] = act(x[m, k] kernel[k, n] + bias[n]), row-major, with the bias (null: none) and
/// the ReLU (`relu`) optional. float32 is one cublasLtMatmul whose epilogue adds the bias and
/// applies the ReLU, in the math mode gemm uses (full float32 unless TF32 is allowed); float64,
/// and a float32 case cuBLASLt has no algorithm for, is gemm followed by the bias and the ReLU
/// in place on y. bfloat16 and float16 are one cublasLtMatmul summing in float32 with the same
/// epilogue on the float32 accumulator (the bias in the 16-bit type, as cuBLASLt requires),
/// y rounded once, as ops::cpu::dense; where cuBLASLt fuses no epilogue for the case, the
/// product, bias and ReLU run in float32 scratch and y is rounded once all the same.
template <typename T>
void dense_forward(int64_t m, int64_t n, int64_t k, const T* x, const T* kernel, const T* bias,
                   bool relu, T* y, cudaStream_t stream);

// ---- GEMM through cuBLAS and cuBLASLt (ops/cuda/gemm.cpp) ---------------------------------

/// C = alpha * op(A) @ op(B) + beta * C, row-major, with op(A) [m, k] and op(B) [k, n], as
/// ops::cpu::gemm. float32 is cublasSgemm with full float32 math unless TF32 is allowed
/// (tandem::cuda::set_allow_tf32); float64 is cublasDgemm. beta == 0 never reads C.
void gemm(bool transpose_a, bool transpose_b, int64_t m, int64_t n, int64_t k, float alpha,
          const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
          int64_t ldc, cudaStream_t stream);
void gemm(bool transpose_a, bool transpose_b, int64_t m, int64_t n, int64_t k, double alpha,
          const double* a, int64_t lda, const double* b, int64_t ldb, double beta, double* c,
          int64_t ldc, cudaStream_t stream);

/// C = op(A) @ op(B) of 16-bit matrices, overwriting C, as ops::cpu::matmul: the products summed
/// in float32 (tensor cores, CUBLAS_COMPUTE_32F) and C rounded once to its type, the inputs'
/// 16-bit type or float32. One cublasLtMatmul (split-K partial sums kept in float32), or
/// cublasGemmEx where cuBLASLt has no algorithm. k == 0 writes zeros.
void gemm(bool transpose_a, bool transpose_b, int64_t m, int64_t n, int64_t k, const bfloat16* a,
          int64_t lda, const bfloat16* b, int64_t ldb, bfloat16* c, int64_t ldc,
          cudaStream_t stream);
void gemm(bool transpose_a, bool transpose_b, int64_t m, int64_t n, int64_t k, const bfloat16* a,
          int64_t lda, const bfloat16* b, int64_t ldb, float* c, int64_t ldc, cudaStream_t stream);
void gemm(bool transpose_a, bool transpose_b, int64_t m, int64_t n, int64_t k, const float16* a,
          int64_t lda, const float16* b, int64_t ldb, float16* c, int64_t ldc, cudaStream_t stream);
void gemm(bool transpose_a, bool transpose_b, int64_t m, int64_t n, int64_t k, const float16* a,
          int64_t lda, const float16* b, int64_t ldb, float* c, int64_t ldc, cudaStream_t stream);

// ---- convolution, pooling, dropout (ops/cuda/nn_kernels.cu); as ops/cpu/nn_kernels.h ------

using ConvGeometry = cpu::ConvGeometry;

/// x [N, H, W, C] -> cols [N * OH * OW, KH * KW * C] (zeros where the window is padding).
template <typename T>
void im2col(const ConvGeometry& g, const T* x, T* cols, cudaStream_t stream);
/// The adjoint of im2col into dx [N, H, W, C] (overwritten). Each input element gathers the
/// cols entries that read it, in the CPU's order: no atomics, the same sums as the CPU. C is T,
/// or float for a 16-bit dx: the sums then run in float32 and dx is rounded once.
template <typename C, typename T>
void col2im(const ConvGeometry& g, const C* cols, T* dx, cudaStream_t stream);

/// y [N, OH, OW, C] = window maxima; argmax = flat input index of each (-1 for a window of
/// padding only); ties keep the first, a NaN wins and stays, as the CPU kernel.
template <typename T>
void max_pool2d_forward(const ConvGeometry& g, const T* x, T* y, int64_t* argmax,
                        cudaStream_t stream);
/// dx (overwritten) receives dy at each window's argmax, gathered per input element in output
/// order (the CPU's summation order, without atomics).
template <typename T>
void max_pool2d_backward(const ConvGeometry& g, const T* dy, const int64_t* argmax, T* dx,
                         cudaStream_t stream);

/// y [N, OH, OW, C] = window means over the inputs inside the input, as the CPU kernel.
template <typename T>
void avg_pool2d_forward(const ConvGeometry& g, const T* x, T* y, cudaStream_t stream);
/// dx (overwritten): dy / count of each window containing the input, gathered in output order.
template <typename T>
void avg_pool2d_backward(const ConvGeometry& g, const T* dy, T* dx, cudaStream_t stream);

/// y [n, width] = table rows indices[0..n) (checked by the caller).
template <typename T, typename L>
void embedding_forward(const T* table, int64_t width, const L* indices, int64_t n, T* y,
                       cudaStream_t stream);
/// dtable [rows, width] (overwritten): dy's rows added into the rows their indices name, in the
/// order of the indices (the CPU's sums, without atomics).
template <typename T, typename L>
void embedding_backward(const T* dy, const L* indices, int64_t n, int64_t rows, int64_t width,
                        T* dtable, cudaStream_t stream);

/// mask[i] = 1 / (1 - rate) when kept, else 0: lane i % 4 of Philox block first_block + i / 4
/// of (seed, stream_id), kept when its uniform float >= rate. Bit-identical to the CPU mask.
template <typename T>
void dropout_mask(int64_t n, double rate, uint64_t seed, uint64_t stream_id, uint64_t first_block,
                  T* mask, cudaStream_t stream);

}  // namespace tandem::ops::cuda
