// im2col / col2im over NHWC inputs: the data movement that turns a 2-D convolution into one
// GEMM (forward) and its adjoint (the input gradient).
#include <algorithm>

#include "tandem/ops/cpu/nn_kernels.h"

namespace tandem::ops::cpu {
namespace {

// Below this many elements moved a parallel region costs more than it saves.
constexpr int64_t kParallelMinElements = int64_t{1} << 15;

/// The kernel columns [begin, end) of a window starting at input column `first` (may be
/// negative) that fall inside the input; begin == end when none do.
struct ColumnRange {
  int64_t begin, end;
};
ColumnRange columns_inside(const ConvGeometry& g, int64_t first) {
  const int64_t begin = std::clamp<int64_t>(-first, 0, g.window_w);
  const int64_t end = std::clamp<int64_t>(g.in_w - first, begin, g.window_w);
  return {begin, end};
}

}  // namespace

template <typename T>
void im2col(const ConvGeometry& g, const T* x, T* cols) {
  const int64_t row_size = g.window_h * g.window_w * g.channels;
  const int64_t output_rows = g.batch * g.out_h;
  const int64_t work = output_rows * g.out_w * row_size;
  // In NHWC the kernel columns of one kernel row read one contiguous run of the input, so
  // each (output pixel, kernel row) is one copy plus the zeros of the padding at either end.
  // Every cols row is written by exactly one iteration, so output rows run in parallel.
#pragma omp parallel for schedule(static) if (work >= kParallelMinElements)
  for (int64_t nh = 0; nh < output_rows; ++nh) {
    const int64_t n = nh / g.out_h;
    const int64_t oh = nh % g.out_h;
    T* out = cols + nh * g.out_w * row_size;
    for (int64_t ow = 0; ow < g.out_w; ++ow) {
      const int64_t first_w = ow * g.stride_w - g.pad_left;
      const ColumnRange inside = columns_inside(g, first_w);
      for (int64_t kh = 0; kh < g.window_h; ++kh, out += g.window_w * g.channels) {
        const int64_t ih = oh * g.stride_h - g.pad_top + kh;
        if (ih < 0 || ih >= g.in_h || inside.begin == inside.end) {
          std::fill_n(out, g.window_w * g.channels, T(0));
          continue;
        }
        const T* in = x + ((n * g.in_h + ih) * g.in_w + first_w + inside.begin) * g.channels;
        std::fill(out, out + inside.begin * g.channels, T(0));
        std::copy_n(in, (inside.end - inside.begin) * g.channels, out + inside.begin * g.channels);
        std::fill(out + inside.end * g.channels, out + g.window_w * g.channels, T(0));
      }
    }
  }
}

template <typename T>
void col2im(const ConvGeometry& g, const T* cols, T* dx) {
  const int64_t row_size = g.window_h * g.window_w * g.channels;
  const int64_t input_rows = g.batch * g.in_h;
  const int64_t work = input_rows * g.in_w * g.channels * g.window_h * g.window_w;
  // Each input row (n, ih) collects, in a fixed order, what the cols entries of every output
  // row that reads it contribute. Input rows are thus independent: they run in parallel
  // without atomics, and the result is the same for every thread count.
#pragma omp parallel for schedule(static) if (work >= kParallelMinElements)
  for (int64_t nh = 0; nh < input_rows; ++nh) {
    const int64_t n = nh / g.in_h;
    const int64_t ih = nh % g.in_h;
    T* dx_row = dx + nh * g.in_w * g.channels;
    std::fill_n(dx_row, g.in_w * g.channels, T(0));
    for (int64_t kh = 0; kh < g.window_h; ++kh) {
      // Output row oh reads input row ih through kernel row kh when oh * stride = ih + pad - kh.
      const int64_t shifted = ih + g.pad_top - kh;
      if (shifted < 0 || shifted % g.stride_h != 0) continue;
      const int64_t oh = shifted / g.stride_h;
      if (oh >= g.out_h) continue;
      for (int64_t ow = 0; ow < g.out_w; ++ow) {
        const int64_t first_w = ow * g.stride_w - g.pad_left;
        const ColumnRange inside = columns_inside(g, first_w);
        if (inside.begin == inside.end) continue;
        // The kernel row's in-range columns map onto one contiguous run of dx_row.
        const T* src = cols + ((n * g.out_h + oh) * g.out_w + ow) * row_size +
                       (kh * g.window_w + inside.begin) * g.channels;
        T* dst = dx_row + (first_w + inside.begin) * g.channels;
        const int64_t run = (inside.end - inside.begin) * g.channels;
        for (int64_t i = 0; i < run; ++i) dst[i] += src[i];
      }
    }
  }
}

template void im2col<float>(const ConvGeometry&, const float*, float*);
template void im2col<double>(const ConvGeometry&, const double*, double*);
template void col2im<float>(const ConvGeometry&, const float*, float*);
template void col2im<double>(const ConvGeometry&, const double*, double*);

}  // namespace tandem::ops::cpu
