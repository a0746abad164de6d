// CUDA elementwise kernels: unary maps, broadcasting binary maps, the select of where and dtype
// conversion, with the math of the shared TANDEM_HD functors (ops/kernels/functors.h) and the
// functor x dtype list of ops/kernels/op_list.h, so the CPU and CUDA backends support the same
// combinations.
#include "tandem/ops/cuda/cuda_kernels.h"
#include "tandem/ops/cuda/device_utils.cuh"
#include "tandem/ops/kernels/op_list.h"

namespace tandem::ops::cuda {

namespace {

template <typename F, typename T, typename R>
__global__ void unary_kernel(F f, int64_t n, const T* x, R* y) {
  // No __restrict__: y may alias x (in-place ops); each element is read before it is written
  // by the same thread.
  using C = compute_type_t<T>;
  for (int64_t i = grid_start<int64_t>(); i < n; i += grid_step<int64_t>())
    y[i] = static_cast<R>(f(C(x[i])));
}

/// A BroadcastPlan in a form a kernel can take by value.
struct BroadcastArgs {
  int64_t numel = 0, inner = 1;
  int rank = 0;  ///< outer dimensions in use
  bool a_inner = true, b_inner = true;
  int64_t outer[kMaxBroadcastDims] = {};
  int64_t a_strides[kMaxBroadcastDims] = {};
  int64_t b_strides[kMaxBroadcastDims] = {};
};

/// One contiguous run (equal shapes, or a scalar operand): no index arithmetic.
template <typename F, typename T, typename R>
__global__ void binary_flat_kernel(F f, int64_t n, bool a_inner, bool b_inner, const T* a,
                                   const T* b, R* y) {
  using C = compute_type_t<T>;
  for (int64_t i = grid_start<int64_t>(); i < n; i += grid_step<int64_t>())
    y[i] = static_cast<R>(f(C(a[a_inner ? i : 0]), C(b[b_inner ? i : 0])));
}

/// The general walk: output element i is (outer index, column); each operand's offset is its
/// strides dotted with the outer index, plus the column when it advances along the run.
template <typename I, typename F, typename T, typename R>
__global__ void binary_strided_kernel(F f, BroadcastArgs s, const T* a, const T* b, R* y) {
  const I n = static_cast<I>(s.numel), inner = static_cast<I>(s.inner);
  for (I i = grid_start<I>(); i < n; i += grid_step<I>()) {
    I row = i / inner;
    const I col = i - row * inner;
    I a_offset = s.a_inner ? col : I(0), b_offset = s.b_inner ? col : I(0);
    // Unrolled over the fixed maximum so the plan's arrays stay in parameter space (a
    // runtime-indexed loop would copy them to local memory).
#pragma unroll
    for (int k = kMaxBroadcastDims - 1; k >= 0; --k) {
      if (k < s.rank) {
        const I d = static_cast<I>(s.outer[k]);
        const I index = row % d;
        row /= d;
        a_offset += index * static_cast<I>(s.a_strides[k]);
        b_offset += index * static_cast<I>(s.b_strides[k]);
      }
    }
    using C = compute_type_t<T>;
    y[i] = static_cast<R>(f(C(a[a_offset]), C(b[b_offset])));
  }
}

/// A SelectPlan in a form a kernel can take by value (operand 0: the condition).
struct SelectArgs {
  static constexpr int kOperands = 3;
  int64_t numel = 0, inner = 1;
  int rank = 0;  ///< outer dimensions in use
  bool advances[kOperands] = {true, true, true};
  int64_t outer[kMaxBroadcastDims] = {};
  int64_t strides[kOperands][kMaxBroadcastDims] = {};
};

/// One contiguous run of a select: no index arithmetic.
template <typename F, typename T>
__global__ void select_flat_kernel(F f, int64_t n, bool c_inner, bool a_inner, bool b_inner,
                                   const bool* c, const T* a, const T* b, T* y) {
  for (int64_t i = grid_start<int64_t>(); i < n; i += grid_step<int64_t>())
    y[i] = f(c[c_inner ? i : 0], a[a_inner ? i : 0], b[b_inner ? i : 0]);
}

/// The general walk of a select, as binary_strided_kernel's.
template <typename I, typename F, typename T>
__global__ void select_strided_kernel(F f, SelectArgs s, const bool* c, const T* a, const T* b,
                                      T* y) {
  const I n = static_cast<I>(s.numel), inner = static_cast<I>(s.inner);
  for (I i = grid_start<I>(); i < n; i += grid_step<I>()) {
    I row = i / inner;
    const I col = i - row * inner;
    I offset[SelectArgs::kOperands];
#pragma unroll
    for (int j = 0; j < SelectArgs::kOperands; ++j) offset[j] = s.advances[j] ? col : I(0);
#pragma unroll
    for (int k = kMaxBroadcastDims - 1; k >= 0; --k) {
      if (k < s.rank) {
        const I d = static_cast<I>(s.outer[k]);
        const I index = row % d;
        row /= d;
#pragma unroll
        for (int j = 0; j < SelectArgs::kOperands; ++j)
          offset[j] += index * static_cast<I>(s.strides[j][k]);
      }
    }
    y[i] = f(c[offset[0]], a[offset[1]], b[offset[2]]);
  }
}

template <typename S, typename D>
__global__ void cast_kernel(int64_t n, const S* x, D* y) {
  for (int64_t i = grid_start<int64_t>(); i < n; i += grid_step<int64_t>())
    y[i] = static_cast<D>(x[i]);
}

template <typename T>
__global__ void fill_kernel(int64_t n, T value, T* y) {
  for (int64_t i = grid_start<int64_t>(); i < n; i += grid_step<int64_t>()) y[i] = value;
}

}  // namespace

template <typename F, typename T, typename R>
void unary(const F& f, int64_t n, const T* x, R* y, cudaStream_t stream) {
  if (n <= 0) return;
  unary_kernel<<<blocks_for(n), kThreads, 0, stream>>>(f, n, x, y);
  TANDEM_CUDA_LAUNCH_CHECK();
}

template <typename F, typename T, typename R>
void binary(const F& f, const kernels::BroadcastPlan& plan, const T* a, const T* b, R* y,
            cudaStream_t stream) {
  const int64_t n = plan.numel;
  if (n <= 0) return;
  if (plan.outer.empty()) {
    binary_flat_kernel<<<blocks_for(n), kThreads, 0, stream>>>(f, n, plan.a_inner, plan.b_inner, a,
                                                               b, y);
    TANDEM_CUDA_LAUNCH_CHECK();
    return;
  }
  TANDEM_CHECK(plan.outer.size() <= static_cast<size_t>(kMaxBroadcastDims),
               "binary op: the broadcast needs ", plan.outer.size(),
               " collapsed dimensions; the CUDA kernels support ", kMaxBroadcastDims);
  BroadcastArgs args;
  args.numel = n;
  args.inner = plan.inner;
  args.rank = static_cast<int>(plan.outer.size());
  args.a_inner = plan.a_inner;
  args.b_inner = plan.b_inner;
  for (int k = 0; k < args.rank; ++k) {
    args.outer[k] = plan.outer[k];
    args.a_strides[k] = plan.a_strides[k];
    args.b_strides[k] = plan.b_strides[k];
  }
  // Operand offsets never exceed the output's element count (broadcast operands are smaller),
  // so a 32-bit walk is exact whenever the output fits.
  if (fits_32bit(n)) {
    binary_strided_kernel<uint32_t><<<blocks_for(n), kThreads, 0, stream>>>(f, args, a, b, y);
  } else {
    binary_strided_kernel<int64_t><<<blocks_for(n), kThreads, 0, stream>>>(f, args, a, b, y);
  }
  TANDEM_CUDA_LAUNCH_CHECK();
}

template <typename F, typename T>
void select(const F& f, const kernels::SelectPlan& plan, const bool* condition, const T* a,
            const T* b, T* y, cudaStream_t stream) {
  const int64_t n = plan.numel;
  if (n <= 0) return;
  if (plan.outer.empty()) {
    select_flat_kernel<<<blocks_for(n), kThreads, 0, stream>>>(
        f, n, plan.advances[0], plan.advances[1], plan.advances[2], condition, a, b, y);
    TANDEM_CUDA_LAUNCH_CHECK();
    return;
  }
  TANDEM_CHECK(plan.outer.size() <= static_cast<size_t>(kMaxBroadcastDims),
               "where: the broadcast needs ", plan.outer.size(),
               " collapsed dimensions; the CUDA kernels support ", kMaxBroadcastDims);
  SelectArgs args;
  args.numel = n;
  args.inner = plan.inner;
  args.rank = static_cast<int>(plan.outer.size());
  for (int j = 0; j < SelectArgs::kOperands; ++j) args.advances[j] = plan.advances[j];
  for (int k = 0; k < args.rank; ++k) {
    args.outer[k] = plan.outer[k];
    for (int j = 0; j < SelectArgs::kOperands; ++j) args.strides[j][k] = plan.strides[j][k];
  }
  // As in binary: operand offsets stay below the output's element count.
  if (fits_32bit(n)) {
    select_strided_kernel<uint32_t>
        <<<blocks_for(n), kThreads, 0, stream>>>(f, args, condition, a, b, y);
  } else {
    select_strided_kernel<int64_t>
        <<<blocks_for(n), kThreads, 0, stream>>>(f, args, condition, a, b, y);
  }
  TANDEM_CUDA_LAUNCH_CHECK();
}

void cast(DType from, DType to, int64_t n, const void* x, void* y, cudaStream_t stream) {
  if (n <= 0) return;
  dispatch_dtype(from, [&]<typename S>() {
    dispatch_dtype(to, [&]<typename D>() {
      cast_kernel<<<blocks_for(n), kThreads, 0, stream>>>(n, static_cast<const S*>(x),
                                                          static_cast<D*>(y));
    });
  });
  TANDEM_CUDA_LAUNCH_CHECK();
}

void fill(DType dtype, int64_t n, double value, void* y, cudaStream_t stream) {
  if (n <= 0) return;
  dispatch_dtype(dtype, [&]<typename T>() {
    // Converted on the host exactly as Tensor::fill_ converts it.
    fill_kernel<<<blocks_for(n), kThreads, 0, stream>>>(n, static_cast<T>(value),
                                                        static_cast<T*>(y));
  });
  TANDEM_CUDA_LAUNCH_CHECK();
}

// ---- instantiations: the functor x dtype list of ops/kernels/op_list.h ----------------------

#define TANDEM_CUDA_UNARY(F, T) \
  template void unary<kernels::F, T, T>(const kernels::F&, int64_t, const T*, T*, cudaStream_t);
#define TANDEM_CUDA_PREDICATE(F, T)                                                     \
  template void unary<kernels::F, T, bool>(const kernels::F&, int64_t, const T*, bool*, \
                                           cudaStream_t);
#define TANDEM_CUDA_SELECT(F, T)                                                                  \
  template void select<kernels::F, T>(const kernels::F&, const kernels::SelectPlan&, const bool*, \
                                      const T*, const T*, T*, cudaStream_t);
#define TANDEM_CUDA_BINARY(F, T)                                                           \
  template void binary<kernels::F, T, T>(const kernels::F&, const kernels::BroadcastPlan&, \
                                         const T*, const T*, T*, cudaStream_t);
#define TANDEM_CUDA_COMPARISON(F, T)                                                          \
  template void binary<kernels::F, T, bool>(const kernels::F&, const kernels::BroadcastPlan&, \
                                            const T*, const T*, bool*, cudaStream_t);
#define TANDEM_CUDA_FLOATING_UNARY(F) TANDEM_ANY_FLOATING_TYPES(TANDEM_CUDA_UNARY, F)
#define TANDEM_CUDA_NUMERIC_UNARY(F) TANDEM_ANY_NUMERIC_TYPES(TANDEM_CUDA_UNARY, F)
#define TANDEM_CUDA_FLOATING_BINARY(F) TANDEM_ANY_FLOATING_TYPES(TANDEM_CUDA_BINARY, F)
#define TANDEM_CUDA_NUMERIC_BINARY(F) TANDEM_ANY_NUMERIC_TYPES(TANDEM_CUDA_BINARY, F)
#define TANDEM_CUDA_ALL_COMPARISON(F) TANDEM_EVERY_TYPE(TANDEM_CUDA_COMPARISON, F)
#define TANDEM_CUDA_ALL_PREDICATE(F) TANDEM_EVERY_TYPE(TANDEM_CUDA_PREDICATE, F)
#define TANDEM_CUDA_ALL_SELECT(F) TANDEM_EVERY_TYPE(TANDEM_CUDA_SELECT, F)

TANDEM_FLOATING_UNARY_FUNCTORS(TANDEM_CUDA_FLOATING_UNARY)
TANDEM_NUMERIC_UNARY_FUNCTORS(TANDEM_CUDA_NUMERIC_UNARY)
TANDEM_FLOATING_BINARY_FUNCTORS(TANDEM_CUDA_FLOATING_BINARY)
TANDEM_NUMERIC_BINARY_FUNCTORS(TANDEM_CUDA_NUMERIC_BINARY)
TANDEM_COMPARISON_FUNCTORS(TANDEM_CUDA_ALL_COMPARISON)
TANDEM_PREDICATE_FUNCTORS(TANDEM_CUDA_ALL_PREDICATE)
TANDEM_SELECT_FUNCTORS(TANDEM_CUDA_ALL_SELECT)

}  // namespace tandem::ops::cuda
