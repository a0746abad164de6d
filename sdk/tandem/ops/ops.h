// Every tensor op, forward and backward. Each op checks its arguments (naming the shapes),
// runs on the device of its inputs (dispatched in ops/internal/dispatch.h) and records itself on
// active gradient tapes (ops/recording.h) when one of its inputs is tracked.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <vector>

#include "tandem/tensor/random.h"
#include "tandem/tensor/tensor.h"

namespace tandem::ops {

// ---- elementwise, with numpy broadcasting -------------------------------------------------
/// a + b (same dtype; shapes broadcast, as numpy's).
Tensor add(const Tensor& a, const Tensor& b);
/// a - b (same dtype; shapes broadcast).
Tensor sub(const Tensor& a, const Tensor& b);
/// a * b (same dtype; shapes broadcast).
Tensor mul(const Tensor& a, const Tensor& b);
/// a / b (same dtype; shapes broadcast).
Tensor div(const Tensor& a, const Tensor& b);
/// Elementwise max/min (gradient goes to the larger/smaller; ties to `a`).
Tensor maximum(const Tensor& a, const Tensor& b);
/// Elementwise minimum (gradient to the smaller; ties to `a`).
Tensor minimum(const Tensor& a, const Tensor& b);
/// Scalar forms: the scalar takes a's dtype.
Tensor add(const Tensor& a, double b);
/// a * b with the scalar b in a's dtype.
Tensor mul(const Tensor& a, double b);
/// The shape two operands broadcast to; raises naming both shapes when incompatible.
Shape broadcast_shapes(const Shape& a, const Shape& b);
/// Sums `x` down to `shape` (the reverse of broadcasting; used by backward passes).
Tensor sum_to(const Tensor& x, const Shape& shape);

/// -x.
Tensor neg(const Tensor& x);
/// |x|.
Tensor abs(const Tensor& x);
/// e^x.
Tensor exp(const Tensor& x);
/// Natural logarithm (-inf at 0, NaN below).
Tensor log(const Tensor& x);
/// log(1 + x), accurate for small x.
Tensor log1p(const Tensor& x);
/// Square root (NaN below 0).
Tensor sqrt(const Tensor& x);
/// x * x.
Tensor square(const Tensor& x);
/// x raised to the scalar `exponent`.
Tensor pow(const Tensor& x, double exponent);
/// Clamps to [low, high]; the gradient passes where low <= x <= high.
Tensor clip(const Tensor& x, double low, double high);

// ---- activations --------------------------------------------------------------------------
/// max(x, 0).
Tensor relu(const Tensor& x);
/// 1 / (1 + e^-x).
Tensor sigmoid(const Tensor& x);
/// Hyperbolic tangent.
Tensor tanh(const Tensor& x);
/// GELU; exact (erf) by default as in Keras, or the tanh approximation.
Tensor gelu(const Tensor& x, bool approximate = false);
/// e^x / sum(e^x) along `axis` (negative counts from the end), computed stably.
Tensor softmax(const Tensor& x, int64_t axis = -1);
/// log(softmax(x)) along `axis`, computed stably.
Tensor log_softmax(const Tensor& x, int64_t axis = -1);

// ---- reductions ---------------------------------------------------------------------------
/// Sum of all elements (rank 0).
Tensor sum(const Tensor& x);
/// Sum along `axis` (negative counts from the end); `keepdims` keeps it with size 1.
Tensor sum(const Tensor& x, int64_t axis, bool keepdims = false);
/// Mean of all elements (rank 0).
Tensor mean(const Tensor& x);
/// Mean along `axis`; `keepdims` keeps it with size 1.
Tensor mean(const Tensor& x, int64_t axis, bool keepdims = false);
/// Largest element (rank 0).
Tensor max(const Tensor& x);
/// Largest element along `axis`; `keepdims` keeps it with size 1.
Tensor max(const Tensor& x, int64_t axis, bool keepdims = false);
/// Index of the maximum along `axis` (first on ties), int64.
Tensor argmax(const Tensor& x, int64_t axis = -1);

// ---- shape ops ----------------------------------------------------------------------------
/// The same elements in `shape` (same element count; one dim may be -1, inferred).
Tensor reshape(const Tensor& x, const Shape& shape);
/// [N, d1, d2, ...] -> [N, d1 * d2 * ...].
Tensor flatten(const Tensor& x);
/// Reverses the two axes of a matrix.
Tensor transpose(const Tensor& x);
/// General permutation of the axes (out.shape[i] = x.shape[perm[i]]).
Tensor transpose(const Tensor& x, const std::vector<int64_t>& perm);
/// Joins along `axis` (0 only for now); shapes must agree elsewhere.
Tensor concat(const std::vector<Tensor>& xs, int64_t axis = 0);
/// Rows [begin, end) along axis 0 (a view).
Tensor slice(const Tensor& x, int64_t begin, int64_t end);
/// Entries [begin, end) along `axis` (negative counts from the end), as x[..., begin:end, ...]:
/// a view when every axis before it has size 1, else a copy (one block per index of the axes
/// before it). Its gradient is zero outside the slice.
Tensor slice(const Tensor& x, int64_t axis, int64_t begin, int64_t end);
/// Consecutive slices along `axis` of the given sizes (adding up to the axis), as tf.split.
std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t axis);
/// `parts` equal slices along `axis` (which must divide evenly), as tf.split with a count.
std::vector<Tensor> split(const Tensor& x, int64_t parts, int64_t axis);
/// The lower triangle of the last two axes, the rest zero: x[..., i, j] where j - i <=
/// `diagonal`, as numpy.tril and keras.ops.tril (0: the main diagonal and below). Of a ones
/// matrix it is the causal mask; differentiable (the gradient is the triangle of the output's).
Tensor tril(const Tensor& x, int64_t diagonal = 0);

// ---- comparison and logic (not differentiable), selection and conversion ------------------
// The comparisons take two tensors of one dtype (any: bfloat16 and float16 compare exactly, in
// float32), broadcast as numpy does and return bool; they never record on a tape. A comparison
// with a NaN is false, except not_equal (IEEE 754, as NumPy and TensorFlow). The scalar forms
// give the scalar a's dtype, as add(a, double) does; for an integer or bool tensor a scalar
// that dtype cannot hold exactly (0.5, or 300 for uint8) raises rather than comparing against a
// rounded value.
/// Elementwise a == b with broadcasting, as bool.
Tensor equal(const Tensor& a, const Tensor& b);
/// Elementwise a != b, as bool (true where either is NaN).
Tensor not_equal(const Tensor& a, const Tensor& b);
/// Elementwise a > b, as bool.
Tensor greater(const Tensor& a, const Tensor& b);
/// Elementwise a >= b, as bool.
Tensor greater_equal(const Tensor& a, const Tensor& b);
/// Elementwise a < b, as bool.
Tensor less(const Tensor& a, const Tensor& b);
/// Elementwise a <= b, as bool.
Tensor less_equal(const Tensor& a, const Tensor& b);
/// a == b for every element of a, the scalar b taking a's dtype.
Tensor equal(const Tensor& a, double b);
/// a != b for every element of a, the scalar b taking a's dtype.
Tensor not_equal(const Tensor& a, double b);
/// a > b for every element of a, the scalar b taking a's dtype.
Tensor greater(const Tensor& a, double b);
/// a >= b for every element of a, the scalar b taking a's dtype.
Tensor greater_equal(const Tensor& a, double b);
/// a < b for every element of a, the scalar b taking a's dtype.
Tensor less(const Tensor& a, double b);
/// a <= b for every element of a, the scalar b taking a's dtype.
Tensor less_equal(const Tensor& a, double b);
// The logical ops read truth values (the bools the comparisons return, or any dtype: nonzero is
// true, NaN included, as cast to bool reads it) and return bool; the two-operand forms
// broadcast and need one dtype.
/// Elementwise a AND b, as bool.
Tensor logical_and(const Tensor& a, const Tensor& b);
/// Elementwise a OR b, as bool.
Tensor logical_or(const Tensor& a, const Tensor& b);
/// Elementwise NOT x (true where x is zero), as bool.
Tensor logical_not(const Tensor& x);
/// Elementwise select, tf.where with three arguments: x where `condition` is true (nonzero),
/// else y; the three broadcast together (numpy). x and y share a dtype (any), which the result
/// has; the condition may be of any dtype. Differentiable in x and y: the gradient goes to x
/// where the condition holds and to y elsewhere (summed back over broadcast dimensions); the
/// condition gets none.
Tensor where(const Tensor& condition, const Tensor& x, const Tensor& y);
/// Converts to `dtype` (differentiable between floating types).
Tensor cast(const Tensor& x, DType dtype);
/// [N] integer labels -> [N, depth] one-hot of `dtype`; labels out of range raise.
Tensor one_hot(const Tensor& labels, int64_t depth, DType dtype = DType::kFloat32);

// ---- linear algebra -----------------------------------------------------------------------
/// op(a) @ op(b), op = transpose of the last two axes when the flag is set: a [..., M, K] and
/// b [..., K, N] (with the flags, [..., K, M] and [..., N, K]) -> [..., M, N]. The dimensions
/// before the last two are batch dimensions and broadcast as numpy's (np.matmul): a [B, H, T, D]
/// with b [B, H, D, T], or a [B, T, C] with one matrix b [C, N] (one GEMM over all B * T rows).
/// A broadcast operand's gradient is summed over the batch dimensions it repeated along. Both
/// operands have rank 2 or more. float32 goes through oneDNN (CPU) or cuBLAS (CUDA); bfloat16
/// and float16 sum the products in float32 and round the result once (oneDNN or float32
/// emulation on the CPU, cuBLASLt on CUDA).
Tensor matmul(const Tensor& a, const Tensor& b, bool transpose_a = false, bool transpose_b = false);

// ---- fused layers -------------------------------------------------------------------------
/// The activations ops::dense and ops::conv2d apply in their own pass (others follow them as
/// separate ops).
enum class FusedActivation { kLinear, kRelu };
/// act(x @ kernel + bias): x [M, K], kernel [K, N], bias [N] (undefined: no bias) -> [M, N].
/// One pass over the output: on the CPU, float32 is one oneDNN matmul whose bias and ReLU are
/// applied to the accumulator; on CUDA, one cuBLASLt matmul with a bias and ReLU epilogue. Its
/// backward masks the output gradient and sums the bias gradient in one pass, then runs the
/// kernel GEMM, and the input GEMM only when a tape tracked x when the op ran (a first layer's
/// input needs none). float64 equals relu(add(matmul(x, kernel), bias)) bitwise; float32 may
/// differ in the last bits, as oneDNN's (or cuBLASLt's) matmul kernel sums the products in
/// another order than matmul's. bfloat16 and float16 apply the bias and the ReLU to the
/// float32 sums and round the output once, on either device.
Tensor dense(const Tensor& x, const Tensor& kernel, const Tensor& bias = Tensor(),
             FusedActivation activation = FusedActivation::kLinear);
/// act(a + b) with numpy broadcasting in one pass, as a residual block ends: with kRelu it
/// equals relu(add(a, b)) bitwise, forward and backward, without the intermediate sum (its
/// backward keeps only the output). kLinear is add(a, b). kRelu needs a floating dtype.
Tensor add(const Tensor& a, const Tensor& b, FusedActivation activation);

// ---- losses -------------------------------------------------------------------------------
/// Per-example -log softmax(logits)[label]: logits [N, C], labels [N] int32/int64 -> [N]; or
/// any leading dimensions, logits [..., C] and labels [...] -> [...] (a language model's
/// [B, T, V] logits and [B, T] next tokens). Fused and numerically stable; labels outside
/// [0, C) raise naming the value.
Tensor sparse_softmax_cross_entropy(const Tensor& logits, const Tensor& labels);

// ---- convolution and pooling (NHWC) -------------------------------------------------------
/// Keras's padding: kValid (no padding) or kSame (output size ceil(input / stride)).
enum class Padding { kValid, kSame };
/// x [N, H, W, Cin], kernel [KH, KW, Cin, Cout] -> [N, OH, OW, Cout]: conv2d with no bias,
/// linear.
Tensor conv2d(const Tensor& x, const Tensor& kernel, std::array<int64_t, 2> strides = {1, 1},
              Padding padding = Padding::kValid);
/// act(conv2d(x, kernel) + bias), bias [Cout] (undefined: no bias), as one recorded node. On the
/// CPU, float32 runs oneDNN's convolution primitives: the bias and the ReLU are applied to the
/// accumulator; the backward masks the output gradient, then computes the kernel and bias
/// gradients in one primitive and the input gradient in another, which runs only when a tape
/// tracked x when the op ran (a first layer's input needs none). float64 (and float32 on CUDA)
/// run im2col and GEMM as the unfused ops did, and equal relu(add(conv2d(x, kernel), bias))
/// bitwise; float32 on the CPU may differ from im2col and GEMM in the last bits, as oneDNN's
/// kernels sum the products in another order. bfloat16 and float16 sum in float32 and round
/// each result once (on CUDA: im2col and one cuBLASLt matmul whose epilogue adds the bias and
/// applies the ReLU).
Tensor conv2d(const Tensor& x, const Tensor& kernel, const Tensor& bias,
              std::array<int64_t, 2> strides, Padding padding,
              FusedActivation activation = FusedActivation::kLinear);
/// Whether float32 CPU convolutions that oneDNN's Winograd kernels take (3x3 windows, stride 1,
/// SAME padding, input and output channels multiples of 16) run on them, forward and both
/// backwards: on by default (TANDEM_CONV_WINOGRAD=0 at start-up turns it off). They multiply
/// 2.25x less than the direct kernels and round differently (relative differences of ~1e-6 in
/// the outputs); set it off for results that do not depend on which kernels oneDNN has.
void set_winograd_convolutions(bool enabled);
/// Whether float32 CPU convolutions may run Winograd kernels (set_winograd_convolutions).
bool winograd_convolutions();
/// Max pooling over windows of `pool_size` (SAME pads with -inf, as TensorFlow).
Tensor max_pool2d(const Tensor& x, std::array<int64_t, 2> pool_size, std::array<int64_t, 2> strides,
                  Padding padding = Padding::kValid);
/// Average pooling over windows of `pool_size`: each window's mean over the inputs inside the
/// input (TensorFlow's SAME counts only those). 16-bit inputs are summed in float32.
Tensor avg_pool2d(const Tensor& x, std::array<int64_t, 2> pool_size, std::array<int64_t, 2> strides,
                  Padding padding = Padding::kValid);
/// Output spatial size for one dimension.
int64_t conv_output_size(int64_t input, int64_t window, int64_t stride, Padding padding);

/// Batch normalization in training mode over the rows of x [rows, channels]: mean and biased
/// variance per channel (written to `mean` and `variance`, untracked), and
/// y = (x - mean) / sqrt(variance + epsilon) * gamma + beta (gamma, beta [channels], or undefined
/// for 1 and 0), with one backward for x, gamma and beta; `relu`: max(y, 0) in the same pass,
/// its gradient in the backward's (the same values as ops::relu after it). CPU, float32 or
/// float64 only (batch_norm_supported); sums in double. nn::BatchNormalization uses it when it
/// can.
Tensor batch_norm(const Tensor& x, const Tensor& gamma, const Tensor& beta, double epsilon,
                  Tensor& mean, Tensor& variance, bool relu = false);
/// Whether batch_norm takes x.
bool batch_norm_supported(const Tensor& x);

/// Layer normalization over the last axis of x [rows, features]: per row
/// y = (x - mean) / sqrt(variance + epsilon) * gamma + beta, the variance biased (gamma, beta
/// [features], or undefined for 1 and 0), with one backward for x, gamma and beta. CPU, float32
/// or float64 only (layer_norm_supported); sums in double. nn::LayerNormalization uses it when
/// it can.
Tensor layer_norm(const Tensor& x, const Tensor& gamma, const Tensor& beta, double epsilon);
/// Whether layer_norm takes x.
bool layer_norm_supported(const Tensor& x);

/// Embedding lookup: table [rows, width] gathered by `indices` (int32 or int64, any shape, each
/// in [0, rows): raises naming the first that is not; on a GPU that check waits for the stream)
/// -> [indices..., width]. The table's gradient is dense [rows, width], each index's gradient
/// row added into its table row in the order of the indices (CPU and CUDA give the same sums).
/// 16-bit tables gather in their dtype; their gradient goes through float32.
Tensor embedding(const Tensor& table, const Tensor& indices);

// ---- attention ----------------------------------------------------------------------------
/// scaled_dot_product_attention's options (use designated initializers: `{.causal = true}`).
struct AttentionOptions {
  /// Query i attends key j only when j <= i: the lower triangle from the top-left corner, as
  /// Keras's use_causal_mask and PyTorch's is_causal.
  bool causal = false;
  /// Optional mask broadcastable to [..., Tq, Tk]: query i attends key j where it is true
  /// (nonzero, any dtype), as Keras's attention_mask. Both masks apply when both are given.
  Tensor mask{};
  /// Dropout on the attention probabilities (Keras's MultiHeadAttention dropout): 0 for none.
  double dropout_rate = 0.0;
  /// The stream the dropout mask comes from; needed when dropout_rate > 0. It draws what
  /// ops::dropout would for the [..., Tq, Tk] probabilities, so the two compute the same mask.
  Generator* generator = nullptr;
  /// The factor of the scores; 1 / sqrt(D) when unset.
  std::optional<double> scale{};
};
/// softmax(q k^T * scale, masked) v along the keys: q [..., Tq, D], k [..., Tk, D],
/// v [..., Tk, Dv] -> [..., Tq, Dv], the leading dimensions equal. One fused op on the CPU: the
/// keys are walked in tiles with an online softmax, so no [Tq, Tk] matrix is kept and memory
/// grows linearly with the sequence; under `causal`, tiles entirely above the diagonal are
/// skipped; the backward recomputes each tile's probabilities from the row's log-sum-exp the
/// forward kept. A query row with no key to attend outputs zeros (and passes no gradient).
/// float64 computes in double, float32 and the 16-bit types in float32 (the output rounded
/// once). On CUDA it runs as the composed ops (matmul, mask, softmax, dropout, matmul), whose
/// memory grows with Tq * Tk.
Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                    const AttentionOptions& options = {});

// ---- random -------------------------------------------------------------------------------
/// Inverted dropout: keeps each element with probability 1 - rate and scales it by
/// 1 / (1 - rate); the mask comes from `generator` (Philox), so replicas with the same
/// stream drop the same elements. Identity when !training or rate == 0.
Tensor dropout(const Tensor& x, double rate, Generator& generator, bool training = true);

// ---- in place (not recorded on tapes; for optimizers, accumulators and collectives) -------
/// dst += alpha * src (same shape).
void add_(Tensor& dst, const Tensor& src, double alpha = 1.0);
/// dst *= factor.
void scale_(Tensor& dst, double factor);

// ---- numerics checks (not recorded) ---------------------------------------------------------
/// NaN and infinite elements of a floating-point tensor (integer tensors have none).
struct NonFinite {
  /// NaN elements.
  int64_t nan = 0;
  /// Infinite elements (either sign).
  int64_t inf = 0;
  /// Every non-finite element.
  int64_t total() const { return nan + inf; }
};
/// Counts them: one device pass (sum of x * 0, NaN exactly when an element is not finite) and,
/// only when that finds one, a host copy to count NaN and Inf apart.
NonFinite count_non_finite(const Tensor& x);

}  // namespace tandem::ops
