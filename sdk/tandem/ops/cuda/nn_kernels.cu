// CUDA kernels behind conv2d, max_pool2d, avg_pool2d, embedding and dropout: im2col / col2im, max
// and average pooling over NHWC inputs, embedding rows, and the Philox dropout mask. Backward
// passes gather per input element in the CPU kernels' order, so they need no atomics and give the
// CPU's sums bit for bit.
#include <algorithm>
#include <limits>

#include "tandem/ops/cuda/cuda_kernels.h"
#include "tandem/ops/cuda/device_utils.cuh"
#include "tandem/tensor/philox.h"

namespace tandem::ops::cuda {

namespace {

/// The geometry as kernel arguments in the index type I (int32 when every index fits).
template <typename I>
struct Geometry {
  I batch, in_h, in_w, channels, window_h, window_w, stride_h, stride_w, pad_top, pad_left, out_h,
      out_w;
};

template <typename I>
Geometry<I> narrow(const ConvGeometry& g) {
  return {static_cast<I>(g.batch),    static_cast<I>(g.in_h),     static_cast<I>(g.in_w),
          static_cast<I>(g.channels), static_cast<I>(g.window_h), static_cast<I>(g.window_w),
          static_cast<I>(g.stride_h), static_cast<I>(g.stride_w), static_cast<I>(g.pad_top),
          static_cast<I>(g.pad_left), static_cast<I>(g.out_h),    static_cast<I>(g.out_w)};
}

/// Signed 32-bit indices are safe when every index and the last grid-stride step stay below
/// 2^31 (int32 overflow is undefined, so keep a wide margin).
bool fits_int32(int64_t n) { return n < (int64_t{1} << 30); }

/// One thread per cols element [r, (kh, kw, c)].
template <typename I, typename T>
__global__ void im2col_kernel(Geometry<I> g, const T* x, T* cols) {
  const I row_size = g.window_h * g.window_w * g.channels;
  const I total = g.batch * g.out_h * g.out_w * row_size;
  for (I j = grid_start<I>(); j < total; j += grid_step<I>()) {
    const I r = j / row_size, e = j % row_size;
    const I c = e % g.channels, kw = (e / g.channels) % g.window_w;
    const I kh = e / (g.channels * g.window_w);
    const I ow = r % g.out_w, oh = (r / g.out_w) % g.out_h, n = r / (g.out_w * g.out_h);
    const I ih = oh * g.stride_h - g.pad_top + kh, iw = ow * g.stride_w - g.pad_left + kw;
    const bool inside = ih >= 0 && ih < g.in_h && iw >= 0 && iw < g.in_w;
    cols[j] = inside ? x[((n * g.in_h + ih) * g.in_w + iw) * g.channels + c] : T(0);
  }
}

/// One thread per dx element (n, ih, iw, c): the sum, in (kh, kw) order as ops::cpu::col2im,
/// of the cols entries that read it, accumulated in the cols' type C and rounded once to T.
template <typename I, typename C, typename T>
__global__ void col2im_kernel(Geometry<I> g, const C* cols, T* dx) {
  const I row_size = g.window_h * g.window_w * g.channels;
  const I total = g.batch * g.in_h * g.in_w * g.channels;
  for (I j = grid_start<I>(); j < total; j += grid_step<I>()) {
    const I c = j % g.channels, iw = (j / g.channels) % g.in_w;
    const I ih = (j / (g.channels * g.in_w)) % g.in_h, n = j / (g.channels * g.in_w * g.in_h);
    C sum = C(0);
    for (I kh = 0; kh < g.window_h; ++kh) {
      // Output row oh reads input row ih through kernel row kh when oh * stride = ih + pad - kh.
      const I sh = ih + g.pad_top - kh;
      if (sh < 0 || sh % g.stride_h != 0) continue;
      const I oh = sh / g.stride_h;
      if (oh >= g.out_h) continue;
      for (I kw = 0; kw < g.window_w; ++kw) {
        const I sw = iw + g.pad_left - kw;
        if (sw < 0 || sw % g.stride_w != 0) continue;
        const I ow = sw / g.stride_w;
        if (ow >= g.out_w) continue;
        sum += cols[((n * g.out_h + oh) * g.out_w + ow) * row_size +
                    (kh * g.window_w + kw) * g.channels + c];
      }
    }
    dx[j] = static_cast<T>(sum);
  }
}

/// One thread per output element; the window is scanned in ops::cpu::max_pool2d_forward's order
/// with its rules (padding skipped, first maximum kept, a NaN wins and stays).
template <typename I, typename T>
__global__ void max_pool_forward_kernel(Geometry<I> g, const T* x, T* y, int64_t* argmax) {
  const I total = g.batch * g.out_h * g.out_w * g.channels;
  for (I j = grid_start<I>(); j < total; j += grid_step<I>()) {
    const I c = j % g.channels, o = j / g.channels;
    const I ow = o % g.out_w, oh = (o / g.out_w) % g.out_h, n = o / (g.out_w * g.out_h);
    T best = -std::numeric_limits<T>::infinity();
    int64_t best_index = -1;
    for (I kh = 0; kh < g.window_h; ++kh) {
      const I ih = oh * g.stride_h - g.pad_top + kh;
      if (ih < 0 || ih >= g.in_h) continue;
      for (I kw = 0; kw < g.window_w; ++kw) {
        const I iw = ow * g.stride_w - g.pad_left + kw;
        if (iw < 0 || iw >= g.in_w) continue;
        const int64_t at = static_cast<int64_t>(((n * g.in_h + ih) * g.in_w + iw) * g.channels + c);
        const T v = x[at];
        if (best_index < 0 || (best == best && (v > best || v != v))) {
          best = v;
          best_index = at;
        }
      }
    }
    y[j] = best;
    argmax[j] = best_index;
  }
}

/// The output windows [oh_begin, oh_end) x [ow_begin, ow_end) that contain input pixel (ih, iw):
/// those with oh * stride - pad <= ih <= oh * stride - pad + window - 1 (and the same for w).
template <typename I>
struct Windows {
  I oh_begin, oh_end, ow_begin, ow_end;
};
template <typename I>
__device__ Windows<I> windows_containing(const Geometry<I>& g, I ih, I iw) {
  const I h_low = ih + g.pad_top - g.window_h + 1, w_low = iw + g.pad_left - g.window_w + 1;
  const I oh_last = (ih + g.pad_top) / g.stride_h, ow_last = (iw + g.pad_left) / g.stride_w;
  return {h_low <= 0 ? 0 : (h_low + g.stride_h - 1) / g.stride_h,
          oh_last + 1 < g.out_h ? oh_last + 1 : g.out_h,
          w_low <= 0 ? 0 : (w_low + g.stride_w - 1) / g.stride_w,
          ow_last + 1 < g.out_w ? ow_last + 1 : g.out_w};
}

/// One thread per dx element: the sum of dy over the windows that contain it and chose it, in
/// output order (the order ops::cpu::max_pool2d_backward adds them).
template <typename I, typename T>
__global__ void max_pool_backward_kernel(Geometry<I> g, const T* dy, const int64_t* argmax, T* dx) {
  const I total = g.batch * g.in_h * g.in_w * g.channels;
  for (I j = grid_start<I>(); j < total; j += grid_step<I>()) {
    const I c = j % g.channels, iw = (j / g.channels) % g.in_w;
    const I ih = (j / (g.channels * g.in_w)) % g.in_h, n = j / (g.channels * g.in_w * g.in_h);
    const Windows<I> w = windows_containing(g, ih, iw);
    T sum = T(0);
    for (I oh = w.oh_begin; oh < w.oh_end; ++oh) {
      for (I ow = w.ow_begin; ow < w.ow_end; ++ow) {
        const I o = ((n * g.out_h + oh) * g.out_w + ow) * g.channels + c;
        if (argmax[o] == static_cast<int64_t>(j)) sum += dy[o];
      }
    }
    dx[j] = sum;
  }
}

/// One thread per output element: the mean of the window's inputs inside the input, summed in
/// ops::cpu::avg_pool2d_forward's order (rows, then columns).
template <typename I, typename T>
__global__ void avg_pool_forward_kernel(Geometry<I> g, const T* x, T* y) {
  const I total = g.batch * g.out_h * g.out_w * g.channels;
  for (I j = grid_start<I>(); j < total; j += grid_step<I>()) {
    const I c = j % g.channels, o = j / g.channels;
    const I ow = o % g.out_w, oh = (o / g.out_w) % g.out_h, n = o / (g.out_w * g.out_h);
    T sum = T(0);
    I count = 0;
    for (I kh = 0; kh < g.window_h; ++kh) {
      const I ih = oh * g.stride_h - g.pad_top + kh;
      if (ih < 0 || ih >= g.in_h) continue;
      for (I kw = 0; kw < g.window_w; ++kw) {
        const I iw = ow * g.stride_w - g.pad_left + kw;
        if (iw < 0 || iw >= g.in_w) continue;
        sum += x[((n * g.in_h + ih) * g.in_w + iw) * g.channels + c];
        ++count;
      }
    }
    y[j] = sum / static_cast<T>(count > 0 ? count : 1);
  }
}

/// The number of inputs inside the input in window (oh, ow).
template <typename I>
__device__ I window_count(const Geometry<I>& g, I oh, I ow) {
  const I h0 = oh * g.stride_h - g.pad_top, w0 = ow * g.stride_w - g.pad_left;
  const I h = (h0 + g.window_h < g.in_h ? h0 + g.window_h : g.in_h) - (h0 > 0 ? h0 : I(0));
  const I w = (w0 + g.window_w < g.in_w ? w0 + g.window_w : g.in_w) - (w0 > 0 ? w0 : I(0));
  return h * w;
}

/// One thread per dx element: dy / count of every window that contains it, in output order
/// (the order ops::cpu::avg_pool2d_backward adds them).
template <typename I, typename T>
__global__ void avg_pool_backward_kernel(Geometry<I> g, const T* dy, T* dx) {
  const I total = g.batch * g.in_h * g.in_w * g.channels;
  for (I j = grid_start<I>(); j < total; j += grid_step<I>()) {
    const I c = j % g.channels, iw = (j / g.channels) % g.in_w;
    const I ih = (j / (g.channels * g.in_w)) % g.in_h, n = j / (g.channels * g.in_w * g.in_h);
    const Windows<I> w = windows_containing(g, ih, iw);
    T sum = T(0);
    for (I oh = w.oh_begin; oh < w.oh_end; ++oh)
      for (I ow = w.ow_begin; ow < w.ow_end; ++ow)
        sum += dy[((n * g.out_h + oh) * g.out_w + ow) * g.channels + c] /
               static_cast<T>(window_count(g, oh, ow));
    dx[j] = sum;
  }
}

/// One thread per output element.
template <typename T, typename L>
__global__ void embedding_forward_kernel(const T* table, int64_t width, const L* indices, int64_t n,
                                         T* y) {
  const int64_t total = n * width;
  for (int64_t j = grid_start<int64_t>(); j < total; j += grid_step<int64_t>())
    y[j] = table[static_cast<int64_t>(indices[j / width]) * width + j % width];
}

/// Thread (c, p) owns column c of the table rows r with r % parts == p: it zeroes them, then
/// walks every index in order and adds the gradients of its rows. Each table element is thus
/// summed by one thread, in the order of the indices, as the CPU does.
template <typename T, typename L>
__global__ void embedding_backward_kernel(const T* dy, const L* indices, int64_t n, int64_t rows,
                                          int64_t width, int64_t parts, T* dtable) {
  const int64_t total = width * parts;
  for (int64_t j = grid_start<int64_t>(); j < total; j += grid_step<int64_t>()) {
    const int64_t c = j % width, p = j / width;
    for (int64_t r = p; r < rows; r += parts) dtable[r * width + c] = T(0);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t r = static_cast<int64_t>(indices[i]);
      if (r % parts == p) dtable[r * width + c] += dy[i * width + c];
    }
  }
}

/// One thread per Philox block: four consecutive mask elements.
template <typename T>
__global__ void dropout_mask_kernel(int64_t n, double rate, T kept, uint64_t seed,
                                    uint64_t stream_id, uint64_t first_block, T* mask) {
  const int64_t blocks = (n + 3) / 4;
  for (int64_t b = grid_start<int64_t>(); b < blocks; b += grid_step<int64_t>()) {
    const philox::Block bits =
        philox::block(seed, stream_id, first_block + static_cast<uint64_t>(b));
#pragma unroll
    for (int lane = 0; lane < 4; ++lane) {
      const int64_t i = b * 4 + lane;
      // Compared in double, as ops::cpu::dropout_mask does, so both drop the same elements.
      const double u = philox::to_unit_float(bits.v[lane]);
      if (i < n) mask[i] = u >= rate ? kept : T(0);
    }
  }
}

/// Every index these kernels form is below the largest of the input, the cols matrix and the
/// pooled output (cols has at least as many elements as the output, the window being >= 1).
bool indices_fit_int32(const ConvGeometry& g) {
  const int64_t input = g.batch * g.in_h * g.in_w * g.channels;
  const int64_t cols = g.batch * g.out_h * g.out_w * g.window_h * g.window_w * g.channels;
  return fits_int32(std::max(input, cols));
}

/// Calls launch(geometry) with the geometry in int32 when the indices allow, else int64.
template <typename Launch>
void with_index_type(const ConvGeometry& g, const Launch& launch) {
  if (indices_fit_int32(g)) {
    launch(narrow<int32_t>(g));
  } else {
    launch(narrow<int64_t>(g));
  }
  TANDEM_CUDA_LAUNCH_CHECK();
}

}  // namespace

template <typename T>
void im2col(const ConvGeometry& g, const T* x, T* cols, cudaStream_t stream) {
  const int64_t total = g.batch * g.out_h * g.out_w * g.window_h * g.window_w * g.channels;
  if (total <= 0) return;
  with_index_type(g, [&](auto geometry) {
    im2col_kernel<<<blocks_for(total), kThreads, 0, stream>>>(geometry, x, cols);
  });
}

template <typename C, typename T>
void col2im(const ConvGeometry& g, const C* cols, T* dx, cudaStream_t stream) {
  const int64_t total = g.batch * g.in_h * g.in_w * g.channels;
  if (total <= 0) return;
  with_index_type(g, [&](auto geometry) {
    col2im_kernel<<<blocks_for(total), kThreads, 0, stream>>>(geometry, cols, dx);
  });
}

template <typename T>
void max_pool2d_forward(const ConvGeometry& g, const T* x, T* y, int64_t* argmax,
                        cudaStream_t stream) {
  const int64_t total = g.batch * g.out_h * g.out_w * g.channels;
  if (total <= 0) return;
  with_index_type(g, [&](auto geometry) {
    max_pool_forward_kernel<<<blocks_for(total), kThreads, 0, stream>>>(geometry, x, y, argmax);
  });
}

template <typename T>
void max_pool2d_backward(const ConvGeometry& g, const T* dy, const int64_t* argmax, T* dx,
                         cudaStream_t stream) {
  const int64_t total = g.batch * g.in_h * g.in_w * g.channels;
  if (total <= 0) return;
  with_index_type(g, [&](auto geometry) {
    max_pool_backward_kernel<<<blocks_for(total), kThreads, 0, stream>>>(geometry, dy, argmax, dx);
  });
}

template <typename T>
void avg_pool2d_forward(const ConvGeometry& g, const T* x, T* y, cudaStream_t stream) {
  const int64_t total = g.batch * g.out_h * g.out_w * g.channels;
  if (total <= 0) return;
  with_index_type(g, [&](auto geometry) {
    avg_pool_forward_kernel<<<blocks_for(total), kThreads, 0, stream>>>(geometry, x, y);
  });
}

template <typename T>
void avg_pool2d_backward(const ConvGeometry& g, const T* dy, T* dx, cudaStream_t stream) {
  const int64_t total = g.batch * g.in_h * g.in_w * g.channels;
  if (total <= 0) return;
  with_index_type(g, [&](auto geometry) {
    avg_pool_backward_kernel<<<blocks_for(total), kThreads, 0, stream>>>(geometry, dy, dx);
  });
}

template <typename T, typename L>
void embedding_forward(const T* table, int64_t width, const L* indices, int64_t n, T* y,
                       cudaStream_t stream) {
  const int64_t total = n * width;
  if (total <= 0) return;
  embedding_forward_kernel<<<blocks_for(total), kThreads, 0, stream>>>(table, width, indices, n, y);
  TANDEM_CUDA_LAUNCH_CHECK();
}

template <typename T, typename L>
void embedding_backward(const T* dy, const L* indices, int64_t n, int64_t rows, int64_t width,
                        T* dtable, cudaStream_t stream) {
  if (rows * width <= 0) return;
  // About 16k threads: enough parts of the rows to fill the GPU when the rows are narrow.
  const int64_t parts = std::clamp<int64_t>((int64_t{1} << 14) / std::max<int64_t>(width, 1), 1,
                                            std::max<int64_t>(rows, 1));
  embedding_backward_kernel<<<blocks_for(width * parts), kThreads, 0, stream>>>(
      dy, indices, n, rows, width, parts, dtable);
  TANDEM_CUDA_LAUNCH_CHECK();
}

template <typename T>
void dropout_mask(int64_t n, double rate, uint64_t seed, uint64_t stream_id, uint64_t first_block,
                  T* mask, cudaStream_t stream) {
  TANDEM_CHECK(rate >= 0.0 && rate <= 1.0, "dropout_mask: rate ", rate, " is outside [0, 1]");
  if (n <= 0) return;
  // Computed on the host exactly as the CPU kernel does; with rate == 1 nothing is kept, so
  // the infinite scale is never written.
  const T kept = static_cast<T>(1.0 / (1.0 - rate));
  dropout_mask_kernel<<<blocks_for((n + 3) / 4), kThreads, 0, stream>>>(
      n, rate, kept, seed, stream_id, first_block, mask);
  TANDEM_CUDA_LAUNCH_CHECK();
}

#define TANDEM_CUDA_NN(T)                                                                         \
  template void im2col<T>(const ConvGeometry&, const T*, T*, cudaStream_t);                       \
  template void col2im<T, T>(const ConvGeometry&, const T*, T*, cudaStream_t);                    \
  template void max_pool2d_forward<T>(const ConvGeometry&, const T*, T*, int64_t*, cudaStream_t); \
  template void max_pool2d_backward<T>(const ConvGeometry&, const T*, const int64_t*, T*,         \
                                       cudaStream_t);                                             \
  template void avg_pool2d_forward<T>(const ConvGeometry&, const T*, T*, cudaStream_t);           \
  template void avg_pool2d_backward<T>(const ConvGeometry&, const T*, T*, cudaStream_t);          \
  template void dropout_mask<T>(int64_t, double, uint64_t, uint64_t, uint64_t, T*, cudaStream_t);
TANDEM_CUDA_NN(float)
TANDEM_CUDA_NN(double)

#define TANDEM_CUDA_EMBEDDING(T, L)                                                              \
  template void embedding_forward<T, L>(const T*, int64_t, const L*, int64_t, T*, cudaStream_t); \
  template void embedding_backward<T, L>(const T*, const L*, int64_t, int64_t, int64_t, T*,      \
                                         cudaStream_t);
TANDEM_CUDA_EMBEDDING(float, int32_t)
TANDEM_CUDA_EMBEDDING(float, int64_t)
TANDEM_CUDA_EMBEDDING(double, int32_t)
TANDEM_CUDA_EMBEDDING(double, int64_t)
#undef TANDEM_CUDA_EMBEDDING

// The 16-bit convolution: cols in the 16-bit type forward, float32 input-gradient cols.
#define TANDEM_CUDA_NN_16(H)                                                \
  template void im2col<H>(const ConvGeometry&, const H*, H*, cudaStream_t); \
  template void col2im<float, H>(const ConvGeometry&, const float*, H*, cudaStream_t);
TANDEM_CUDA_NN_16(bfloat16)
TANDEM_CUDA_NN_16(float16)

}  // namespace tandem::ops::cuda
