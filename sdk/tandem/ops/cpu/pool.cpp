// 2-D max pooling over NHWC inputs: the forward pass records each maximum's flat input index,
// which the backward pass uses to route the gradient.
#include <algorithm>
#include <limits>

#include "tandem/ops/cpu/nn_kernels.h"

namespace tandem::ops::cpu {
namespace {

// Below this many elements visited a parallel region costs more than it saves.
constexpr int64_t kParallelMinElements = int64_t{1} << 15;

}  // namespace

template <typename T>
void max_pool2d_forward(const ConvGeometry& g, const T* x, T* y, int64_t* argmax) {
  const int64_t pixel = g.channels;
  const int64_t output_rows = g.batch * g.out_h;
  const int64_t work = output_rows * g.out_w * g.window_h * g.window_w * pixel;
  // Each output pixel is written by one iteration only, so output rows run in parallel.
#pragma omp parallel for schedule(static) if (work >= kParallelMinElements)
  for (int64_t nh = 0; nh < output_rows; ++nh) {
    const int64_t n = nh / g.out_h;
    const int64_t oh = nh % g.out_h;
    // Padding positions are left out of the window rather than read as -inf, so they never win.
    const int64_t first_h = oh * g.stride_h - g.pad_top;
    const int64_t h_begin = std::max<int64_t>(first_h, 0);
    const int64_t h_end = std::min(first_h + g.window_h, g.in_h);
    for (int64_t ow = 0; ow < g.out_w; ++ow) {
      const int64_t first_w = ow * g.stride_w - g.pad_left;
      const int64_t w_begin = std::max<int64_t>(first_w, 0);
      const int64_t w_end = std::min(first_w + g.window_w, g.in_w);
      T* best = y + (nh * g.out_w + ow) * pixel;
      int64_t* best_index = argmax + (nh * g.out_w + ow) * pixel;
      if (h_begin >= h_end || w_begin >= w_end) {
        // A window made only of padding (never with TF's SAME): -inf, and -1 for backward.
        std::fill_n(best, pixel, -std::numeric_limits<T>::infinity());
        std::fill_n(best_index, pixel, int64_t{-1});
        continue;
      }
      // Start from the window's first input; scanning it again below changes nothing.
      const int64_t first = ((n * g.in_h + h_begin) * g.in_w + w_begin) * pixel;
      for (int64_t c = 0; c < pixel; ++c) {
        best[c] = x[first + c];
        best_index[c] = first + c;
      }
      for (int64_t ih = h_begin; ih < h_end; ++ih) {
        for (int64_t iw = w_begin; iw < w_end; ++iw) {
          const int64_t base = ((n * g.in_h + ih) * g.in_w + iw) * pixel;
          for (int64_t c = 0; c < pixel; ++c) {
            const T v = x[base + c];
            const T current = best[c];
            // Strict > keeps the first maximum on ties (as TensorFlow); a NaN replaces a
            // number but not an earlier NaN, so NaN propagates instead of hiding behind the max.
            const bool take = v > current || (v != v && current == current);
            best[c] = take ? v : current;
            best_index[c] = take ? base + c : best_index[c];
          }
        }
      }
    }
  }
}

template <typename T>
void max_pool2d_backward(const ConvGeometry& g, const T* dy, const int64_t* argmax, T* dx) {
  const int64_t image_in = g.in_h * g.in_w * g.channels;
  const int64_t image_out = g.out_h * g.out_w * g.channels;
  const int64_t work = g.batch * (image_in + image_out);
  // Overlapping windows can route several outputs to one input, but only within an image:
  // images are independent, so they run in parallel and each accumulates in a fixed order.
#pragma omp parallel for schedule(static) if (work >= kParallelMinElements)
  for (int64_t n = 0; n < g.batch; ++n) {
    T* dx_image = dx + n * image_in;
    std::fill(dx_image, dx_image + image_in, T(0));
    const int64_t begin = n * image_out;
    for (int64_t o = begin; o < begin + image_out; ++o) {
      if (argmax[o] >= 0) dx[argmax[o]] += dy[o];
    }
  }
}

template void max_pool2d_forward<float>(const ConvGeometry&, const float*, float*, int64_t*);
template void max_pool2d_forward<double>(const ConvGeometry&, const double*, double*, int64_t*);
template void max_pool2d_backward<float>(const ConvGeometry&, const float*, const int64_t*, float*);
template void max_pool2d_backward<double>(const ConvGeometry&, const double*, const int64_t*,
                                          double*);

}  // namespace tandem::ops::cpu
