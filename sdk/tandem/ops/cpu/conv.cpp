// CPU convolution: im2col / col2im over NHWC inputs (the data movement that turns a 2-D
// convolution into one GEMM and its adjoint into another), the convolution and its backward on
// them (float64, and float32 without oneDNN), and the dispatch of float32 to oneDNN's primitives.
#include "tandem/ops/cpu/conv.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <memory>
#include <string_view>
#include <type_traits>
#include <vector>

#include "tandem/ops/cpu/dense.h"
#include "tandem/ops/cpu/nn_kernels.h"
#include "tandem/ops/cpu/reduce.h"
#include "tandem/ops/cpu/widen.h"

#if TANDEM_WITH_ONEDNN
#include "tandem/ops/cpu/onednn.h"
#endif

namespace tandem::ops::cpu {
namespace {

std::atomic<bool>& winograd_flag() {
  static std::atomic<bool> flag{[] {
    const char* value = std::getenv("TANDEM_CONV_WINOGRAD");
    return value == nullptr || std::string_view(value) != "0";
  }()};
  return flag;
}

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

namespace {

/// Uninitialised storage for the columns of g.
template <typename T>
std::unique_ptr<T[]> columns(const ConvGeometry& g) {
  return std::make_unique_for_overwrite<T[]>(static_cast<size_t>(im2col_rows(g) * im2col_depth(g)));
}

/// True when no dimension is empty: oneDNN is asked about such convolutions only.
[[maybe_unused]] bool has_work(const ConvGeometry& g, int64_t filters) {
  return g.batch > 0 && g.in_h > 0 && g.in_w > 0 && g.channels > 0 && g.out_h > 0 && g.out_w > 0 &&
         filters > 0;
}

// The im2col path. Each step is the call the unfused ops made before (im2col, then cpu::gemm with
// the same arguments, then the epilogue as a separate add and ReLU would round it), so float64
// results are theirs bit for bit.

template <typename T>
void im2col_conv2d(const ConvGeometry& g, int64_t filters, const T* x, const T* w, const T* bias,
                   bool relu, T* y) {
  const int64_t rows = im2col_rows(g), depth = im2col_depth(g);
  if (rows == 0 || filters == 0) return;
  const std::unique_ptr<T[]> cols = columns<T>(g);
  if (depth > 0) im2col(g, x, cols.get());
  // y [rows, filters] = act(cols [rows, depth] @ w [depth, filters] + bias).
  dense(rows, filters, depth, cols.get(), w, bias, relu, y);
}

template <typename T>
void im2col_conv2d_backward_weights(const ConvGeometry& g, int64_t filters, const T* x, const T* dy,
                                    T* dw, T* db) {
  const int64_t rows = im2col_rows(g), depth = im2col_depth(g);
  if (filters == 0) return;
  if (depth > 0) {
    // dw [depth, filters] = cols^T @ dy; no rows (an empty batch) gives zeros.
    const std::unique_ptr<T[]> cols = columns<T>(g);
    if (rows > 0) im2col(g, x, cols.get());
    gemm(true, false, depth, filters, rows, T(1), cols.get(), depth, dy, filters, T(0), dw,
         filters);
  }
  if (db == nullptr) return;
  if (rows == 0)
    std::fill_n(db, filters, T(0));
  else
    sum(dy, 1, rows, filters, db);
}

template <typename T>
void im2col_conv2d_backward_data(const ConvGeometry& g, int64_t filters, const T* dy, const T* w,
                                 T* dx) {
  const int64_t rows = im2col_rows(g), depth = im2col_depth(g);
  if (g.batch * g.in_h * g.in_w * g.channels == 0) return;
  // dx = col2im(dy [rows, filters] @ w^T).
  const std::unique_ptr<T[]> dcols = columns<T>(g);
  gemm(false, true, rows, depth, filters, T(1), dy, filters, w, filters, T(0), dcols.get(), depth);
  col2im(g, dcols.get(), dx);
}

}  // namespace

void conv2d(const ConvGeometry& g, int64_t filters, const float* x, const float* w,
            const float* bias, bool relu, float* y) {
#if TANDEM_WITH_ONEDNN
  if (has_work(g, filters)) return onednn::conv2d(g, filters, x, w, bias, relu, y);
#endif
  im2col_conv2d(g, filters, x, w, bias, relu, y);
}

void conv2d(const ConvGeometry& g, int64_t filters, const double* x, const double* w,
            const double* bias, bool relu, double* y) {
  im2col_conv2d(g, filters, x, w, bias, relu, y);
}

void conv2d_backward_weights(const ConvGeometry& g, int64_t filters, const float* x,
                             const float* dy, float* dw, float* db) {
#if TANDEM_WITH_ONEDNN
  if (has_work(g, filters)) return onednn::conv2d_backward_weights(g, filters, x, dy, dw, db);
#endif
  im2col_conv2d_backward_weights(g, filters, x, dy, dw, db);
}

void conv2d_backward_weights(const ConvGeometry& g, int64_t filters, const double* x,
                             const double* dy, double* dw, double* db) {
  im2col_conv2d_backward_weights(g, filters, x, dy, dw, db);
}

void conv2d_backward_data(const ConvGeometry& g, int64_t filters, const float* dy, const float* w,
                          float* dx) {
#if TANDEM_WITH_ONEDNN
  if (has_work(g, filters)) return onednn::conv2d_backward_data(g, filters, dy, w, dx);
#endif
  im2col_conv2d_backward_data(g, filters, dy, w, dx);
}

void conv2d_backward_data(const ConvGeometry& g, int64_t filters, const double* dy, const double* w,
                          double* dx) {
  im2col_conv2d_backward_data(g, filters, dy, w, dx);
}

// ---- 16 bits ---------------------------------------------------------------------------------

namespace {

int64_t input_size(const ConvGeometry& g) { return g.batch * g.in_h * g.in_w * g.channels; }
int64_t output_size(const ConvGeometry& g, int64_t filters) {
  return g.batch * g.out_h * g.out_w * filters;
}
int64_t kernel_size(const ConvGeometry& g, int64_t filters) {
  return g.window_h * g.window_w * g.channels * filters;
}

/// Whether a 16-bit call runs on oneDNN's bfloat16 primitives (else it is widened to float32).
template <typename H>
bool native_bf16(const ConvGeometry& g, int64_t filters) {
#if TANDEM_WITH_ONEDNN
  if constexpr (std::is_same_v<H, bfloat16>)
    return has_work(g, filters) && onednn::has_bf16_convolutions();
#endif
  (void)g;
  (void)filters;
  return false;
}

template <typename H>
void conv2d_16(const ConvGeometry& g, int64_t filters, const H* x, const H* w, const H* bias,
               bool relu, H* y) {
#if TANDEM_WITH_ONEDNN
  if constexpr (std::is_same_v<H, bfloat16>)
    if (native_bf16<H>(g, filters)) return onednn::conv2d(g, filters, x, w, bias, relu, y);
#endif
  const FloatBuffer y32(output_size(g, filters));  // written whole by conv2d
  conv2d(g, filters, widen(x, input_size(g)).data(), widen(w, kernel_size(g, filters)).data(),
         widen(bias, filters).data(), relu, y32.data());
  narrow(y32, y);
}

template <typename H>
void conv2d_backward_weights_16(const ConvGeometry& g, int64_t filters, const H* x, const H* dy,
                                H* dw, H* db) {
#if TANDEM_WITH_ONEDNN
  if constexpr (std::is_same_v<H, bfloat16>)
    if (native_bf16<H>(g, filters))
      return onednn::conv2d_backward_weights(g, filters, x, dy, dw, db);
#endif
  const FloatBuffer dw32(kernel_size(g, filters)), db32(db != nullptr ? filters : 0);
  std::fill(dw32.data(), dw32.data() + dw32.size(), 0.0f);
  std::fill(db32.data(), db32.data() + db32.size(), 0.0f);
  conv2d_backward_weights(g, filters, widen(x, input_size(g)).data(),
                          widen(dy, output_size(g, filters)).data(), dw32.data(), db32.data());
  narrow(dw32, dw);
  if (db != nullptr) narrow(db32, db);
}

template <typename H>
void conv2d_backward_data_16(const ConvGeometry& g, int64_t filters, const H* dy, const H* w,
                             H* dx) {
#if TANDEM_WITH_ONEDNN
  if constexpr (std::is_same_v<H, bfloat16>)
    if (native_bf16<H>(g, filters)) return onednn::conv2d_backward_data(g, filters, dy, w, dx);
#endif
  const FloatBuffer dx32(input_size(g));
  std::fill(dx32.data(), dx32.data() + dx32.size(), 0.0f);
  conv2d_backward_data(g, filters, widen(dy, output_size(g, filters)).data(),
                       widen(w, kernel_size(g, filters)).data(), dx32.data());
  narrow(dx32, dx);
}

}  // namespace

void conv2d(const ConvGeometry& g, int64_t filters, const bfloat16* x, const bfloat16* w,
            const bfloat16* bias, bool relu, bfloat16* y) {
  conv2d_16(g, filters, x, w, bias, relu, y);
}
void conv2d(const ConvGeometry& g, int64_t filters, const float16* x, const float16* w,
            const float16* bias, bool relu, float16* y) {
  conv2d_16(g, filters, x, w, bias, relu, y);
}
void conv2d_backward_weights(const ConvGeometry& g, int64_t filters, const bfloat16* x,
                             const bfloat16* dy, bfloat16* dw, bfloat16* db) {
  conv2d_backward_weights_16(g, filters, x, dy, dw, db);
}
void conv2d_backward_weights(const ConvGeometry& g, int64_t filters, const float16* x,
                             const float16* dy, float16* dw, float16* db) {
  conv2d_backward_weights_16(g, filters, x, dy, dw, db);
}
void conv2d_backward_data(const ConvGeometry& g, int64_t filters, const bfloat16* dy,
                          const bfloat16* w, bfloat16* dx) {
  conv2d_backward_data_16(g, filters, dy, w, dx);
}
void conv2d_backward_data(const ConvGeometry& g, int64_t filters, const float16* dy,
                          const float16* w, float16* dx) {
  conv2d_backward_data_16(g, filters, dy, w, dx);
}

bool winograd_convolutions() { return winograd_flag().load(std::memory_order_relaxed); }

void set_winograd_convolutions(bool enabled) {
  winograd_flag().store(enabled, std::memory_order_relaxed);
}

}  // namespace tandem::ops::cpu
