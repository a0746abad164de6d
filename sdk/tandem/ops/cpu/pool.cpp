// 2-D max and average pooling over NHWC inputs. Max pooling runs in two passes that run across
// channels in vector lanes: the forward keeps only the window maxima; the backward finds each
// window's first maximum again by comparing the input with the output, and routes the gradient
// there. No index is stored, and no lane waits on a branch (a maximum decided by a branch per
// element mispredicts on real data). Built with -fno-trapping-math (CMakeLists.txt), without which
// GCC keeps the comparisons of the backward in branches; the results are the same either way.
#include <algorithm>
#include <limits>
#include <vector>

#include "tandem/core/half.h"
#include "tandem/ops/cpu/half_convert.h"
#include "tandem/ops/cpu/nn_kernels.h"

namespace tandem::ops::cpu {
namespace {

// Below this many elements visited a parallel region costs more than it saves.
constexpr int64_t kParallelMinElements = int64_t{1} << 15;

/// The input rows (or columns) [begin, end) of window `out` that lie inside the input: padding
/// positions are left out of the window rather than read as -inf, so they never win.
struct WindowRange {
  int64_t begin, end;
  bool empty() const { return begin >= end; }
};
WindowRange window_range(int64_t out, int64_t stride, int64_t pad, int64_t window, int64_t input) {
  const int64_t first = out * stride - pad;
  return {std::max<int64_t>(first, 0), std::min(first + window, input)};
}

/// best = v where v is larger, per channel. Strict > keeps the first maximum on ties (as
/// TensorFlow); a NaN replaces a number but not an earlier NaN, so NaN propagates instead of
/// hiding behind the max.
template <typename T>
void keep_larger(int64_t channels, const T* __restrict v, T* __restrict best) {
  if constexpr (is_half_v<T>) {
    // Compared as floats, selected as bits: the loop stays free of struct copies and vectorizes.
#pragma omp simd
    for (int64_t c = 0; c < channels; ++c) {
      const float a = static_cast<float>(v[c]), b = static_cast<float>(best[c]);
      const bool take = (a > b) | ((a != a) & (b == b));
      best[c].bits = take ? v[c].bits : best[c].bits;
    }
  } else {
#pragma omp simd
    for (int64_t c = 0; c < channels; ++c) {
      const T a = v[c], b = best[c];
      const bool take = (a > b) | ((a != a) & (b == b));
      best[c] = take ? a : b;
    }
  }
}

/// For each channel whose gradient is still pending: when v is the window's maximum (equal to
/// it, or both NaN), dx += pending and nothing is pending any more. Scanning the window in the
/// forward's order thus finds the input the forward kept.
template <typename T>
void route_to_maximum(int64_t channels, const T* __restrict v, const T* __restrict maximum,
                      T* __restrict pending, T* __restrict dx) {
#pragma omp simd
  for (int64_t c = 0; c < channels; ++c) {
    const T a = v[c], m = maximum[c], p = pending[c];
    const bool hit = (a == m) | ((a != a) & (m != m));
    dx[c] = dx[c] + (hit ? p : T(0));
    pending[c] = hit ? T(0) : p;
  }
}

}  // namespace

template <typename T>
void max_pool2d_forward(const ConvGeometry& g, const T* x, T* y) {
  const int64_t channels = g.channels;
  const int64_t output_rows = g.batch * g.out_h;
  const int64_t work = output_rows * g.out_w * g.window_h * g.window_w * channels;
  auto pixel = [&](int64_t n, int64_t ih, int64_t iw) {
    return x + ((n * g.in_h + ih) * g.in_w + iw) * channels;
  };
  // Each output pixel is written by one iteration only, so output rows run in parallel.
#pragma omp parallel for schedule(static) if (work >= kParallelMinElements)
  for (int64_t nh = 0; nh < output_rows; ++nh) {
    const int64_t n = nh / g.out_h;
    const WindowRange rows = window_range(nh % g.out_h, g.stride_h, g.pad_top, g.window_h, g.in_h);
    for (int64_t ow = 0; ow < g.out_w; ++ow) {
      const WindowRange cols = window_range(ow, g.stride_w, g.pad_left, g.window_w, g.in_w);
      T* best = y + (nh * g.out_w + ow) * channels;
      if (rows.empty() || cols.empty()) {
        // A window made only of padding (never with TF's SAME): -inf, and no gradient.
        std::fill_n(best, channels,
                    static_cast<T>(-std::numeric_limits<compute_type_t<T>>::infinity()));
        continue;
      }
      // Start from the window's first input; comparing it again below changes nothing.
      std::copy_n(pixel(n, rows.begin, cols.begin), channels, best);
      for (int64_t ih = rows.begin; ih < rows.end; ++ih)
        for (int64_t iw = cols.begin; iw < cols.end; ++iw)
          keep_larger(channels, pixel(n, ih, iw), best);
    }
  }
}

namespace {

/// The backward on float32 or float64 values.
template <typename T>
void max_pool2d_backward_typed(const ConvGeometry& g, const T* x, const T* y, const T* dy, T* dx) {
  const int64_t channels = g.channels;
  const int64_t image_in = g.in_h * g.in_w * channels;
  const int64_t work =
      g.batch * (image_in + g.out_h * g.out_w * g.window_h * g.window_w * channels);
  auto offset = [&](int64_t n, int64_t ih, int64_t iw) {
    return ((n * g.in_h + ih) * g.in_w + iw) * channels;
  };
  // Overlapping windows can route several outputs to one input, but only within an image:
  // images are independent, so they run in parallel and each accumulates in output order.
#pragma omp parallel if (work >= kParallelMinElements)
  {
    std::vector<T> pending(static_cast<size_t>(channels));
#pragma omp for schedule(static)
    for (int64_t n = 0; n < g.batch; ++n) {
      std::fill_n(dx + n * image_in, image_in, T(0));
      for (int64_t oh = 0; oh < g.out_h; ++oh) {
        const WindowRange rows = window_range(oh, g.stride_h, g.pad_top, g.window_h, g.in_h);
        for (int64_t ow = 0; ow < g.out_w; ++ow) {
          const WindowRange cols = window_range(ow, g.stride_w, g.pad_left, g.window_w, g.in_w);
          const int64_t o = ((n * g.out_h + oh) * g.out_w + ow) * channels;
          std::copy_n(dy + o, channels, pending.data());
          for (int64_t ih = rows.begin; ih < rows.end; ++ih)
            for (int64_t iw = cols.begin; iw < cols.end; ++iw)
              route_to_maximum(channels, x + offset(n, ih, iw), y + o, pending.data(),
                               dx + offset(n, ih, iw));
        }
      }
    }
  }
}

}  // namespace

namespace {

/// route_to_maximum on 16-bit inputs: `maximum`, `pending` and `dx` are float32 (the window's
/// maximum widened once per output pixel, the gradient summed in float32).
template <typename H>
inline void route_to_maximum_half(int64_t channels, const H* __restrict v,
                                  const float* __restrict maximum, float* __restrict pending,
                                  float* __restrict dx) {
#pragma omp simd
  for (int64_t c = 0; c < channels; ++c) {
    const float a = static_cast<float>(v[c]), m = maximum[c], p = pending[c];
    const bool hit = (a == m) | ((a != a) & (m != m));
    dx[c] = dx[c] + (hit ? p : 0.0f);
    pending[c] = hit ? 0.0f : p;
  }
}

/// The backward on 16-bit values: routed as in float32, each image's input gradient summed in
/// a float32 buffer of the thread's and rounded once (no widened copies of whole tensors).
template <typename H>
void max_pool2d_backward_half(const ConvGeometry& g, const H* x, const H* y, const H* dy, H* dx) {
  const int64_t channels = g.channels;
  const int64_t image_in = g.in_h * g.in_w * channels;
  const int64_t work =
      g.batch * (image_in + g.out_h * g.out_w * g.window_h * g.window_w * channels);
  auto offset = [&](int64_t ih, int64_t iw) { return (ih * g.in_w + iw) * channels; };
#pragma omp parallel if (work >= kParallelMinElements)
  {
    std::vector<float> pending(static_cast<size_t>(channels));
    std::vector<float> maximum(static_cast<size_t>(channels));
    std::vector<float> image(static_cast<size_t>(image_in));
#pragma omp for schedule(static)
    for (int64_t n = 0; n < g.batch; ++n) {
      std::fill(image.begin(), image.end(), 0.0f);
      for (int64_t oh = 0; oh < g.out_h; ++oh) {
        const WindowRange rows = window_range(oh, g.stride_h, g.pad_top, g.window_h, g.in_h);
        for (int64_t ow = 0; ow < g.out_w; ++ow) {
          const WindowRange cols = window_range(ow, g.stride_w, g.pad_left, g.window_w, g.in_w);
          const int64_t o = ((n * g.out_h + oh) * g.out_w + ow) * channels;
          for (int64_t c = 0; c < channels; ++c) {
            pending[static_cast<size_t>(c)] = static_cast<float>(dy[o + c]);
            maximum[static_cast<size_t>(c)] = static_cast<float>(y[o + c]);
          }
          for (int64_t ih = rows.begin; ih < rows.end; ++ih)
            for (int64_t iw = cols.begin; iw < cols.end; ++iw)
              route_to_maximum_half(channels, x + n * image_in + offset(ih, iw), maximum.data(),
                                    pending.data(), image.data() + offset(ih, iw));
        }
      }
      convert(image.data(), dx + n * image_in, image_in);
    }
  }
}

}  // namespace

template <typename T>
void max_pool2d_backward(const ConvGeometry& g, const T* x, const T* y, const T* dy, T* dx) {
  if constexpr (is_half_v<T>) {
    max_pool2d_backward_half(g, x, y, dy, dx);
  } else {
    max_pool2d_backward_typed(g, x, y, dy, dx);
  }
}

template void max_pool2d_forward<float>(const ConvGeometry&, const float*, float*);
template void max_pool2d_forward<double>(const ConvGeometry&, const double*, double*);
template void max_pool2d_backward<float>(const ConvGeometry&, const float*, const float*,
                                         const float*, float*);
template void max_pool2d_backward<double>(const ConvGeometry&, const double*, const double*,
                                          const double*, double*);
template void max_pool2d_forward<bfloat16>(const ConvGeometry&, const bfloat16*, bfloat16*);
template void max_pool2d_forward<float16>(const ConvGeometry&, const float16*, float16*);
template void max_pool2d_backward<bfloat16>(const ConvGeometry&, const bfloat16*, const bfloat16*,
                                            const bfloat16*, bfloat16*);
template void max_pool2d_backward<float16>(const ConvGeometry&, const float16*, const float16*,
                                           const float16*, float16*);

// ---- average pooling ------------------------------------------------------------------------

template <typename T>
void avg_pool2d_forward(const ConvGeometry& g, const T* x, T* y) {
  const int64_t channels = g.channels;
  const int64_t output_rows = g.batch * g.out_h;
  const int64_t work = output_rows * g.out_w * g.window_h * g.window_w * channels;
#pragma omp parallel for schedule(static) if (work >= kParallelMinElements)
  for (int64_t nh = 0; nh < output_rows; ++nh) {
    const int64_t n = nh / g.out_h;
    const WindowRange rows = window_range(nh % g.out_h, g.stride_h, g.pad_top, g.window_h, g.in_h);
    for (int64_t ow = 0; ow < g.out_w; ++ow) {
      const WindowRange cols = window_range(ow, g.stride_w, g.pad_left, g.window_w, g.in_w);
      T* out = y + (nh * g.out_w + ow) * channels;
      std::fill_n(out, channels, T(0));
      // Rows, then columns, as the CUDA kernel adds them.
      for (int64_t ih = rows.begin; ih < rows.end; ++ih)
        for (int64_t iw = cols.begin; iw < cols.end; ++iw) {
          const T* v = x + ((n * g.in_h + ih) * g.in_w + iw) * channels;
#pragma omp simd
          for (int64_t c = 0; c < channels; ++c) out[c] += v[c];
        }
      const int64_t count =
          std::max<int64_t>(rows.end - rows.begin, 0) * std::max<int64_t>(cols.end - cols.begin, 0);
      // A window of padding only (never with TF's SAME) averages nothing: 0.
      const T divisor = static_cast<T>(std::max<int64_t>(count, 1));
#pragma omp simd
      for (int64_t c = 0; c < channels; ++c) out[c] /= divisor;
    }
  }
}

template <typename T>
void avg_pool2d_backward(const ConvGeometry& g, const T* dy, T* dx) {
  const int64_t channels = g.channels;
  const int64_t image_in = g.in_h * g.in_w * channels;
  const int64_t work = g.batch * g.out_h * g.out_w * g.window_h * g.window_w * channels;
  std::vector<T> share;
  // Windows overlap within an image, never across images: images run in parallel, and each
  // input gathers its windows' shares in output order (the order the CUDA kernel adds them).
#pragma omp parallel for schedule(static) if (work >= kParallelMinElements) private(share)
  for (int64_t n = 0; n < g.batch; ++n) {
    share.resize(static_cast<size_t>(channels));
    T* image = dx + n * image_in;
    std::fill_n(image, image_in, T(0));
    for (int64_t oh = 0; oh < g.out_h; ++oh) {
      const WindowRange rows = window_range(oh, g.stride_h, g.pad_top, g.window_h, g.in_h);
      for (int64_t ow = 0; ow < g.out_w; ++ow) {
        const WindowRange cols = window_range(ow, g.stride_w, g.pad_left, g.window_w, g.in_w);
        if (rows.empty() || cols.empty()) continue;
        const T divisor = static_cast<T>((rows.end - rows.begin) * (cols.end - cols.begin));
        const T* d = dy + ((n * g.out_h + oh) * g.out_w + ow) * channels;
#pragma omp simd
        for (int64_t c = 0; c < channels; ++c) share[c] = d[c] / divisor;
        for (int64_t ih = rows.begin; ih < rows.end; ++ih)
          for (int64_t iw = cols.begin; iw < cols.end; ++iw) {
            T* out = image + (ih * g.in_w + iw) * channels;
#pragma omp simd
            for (int64_t c = 0; c < channels; ++c) out[c] += share[c];
          }
      }
    }
  }
}

template void avg_pool2d_forward<float>(const ConvGeometry&, const float*, float*);
template void avg_pool2d_forward<double>(const ConvGeometry&, const double*, double*);
template void avg_pool2d_backward<float>(const ConvGeometry&, const float*, float*);
template void avg_pool2d_backward<double>(const ConvGeometry&, const double*, double*);

}  // namespace tandem::ops::cpu
