// Kernel-level tests of ops/cpu/nn_kernels.h against naive reference loops on random data:
// GEMM, im2col/col2im (adjointness and convolution), max pooling and the dropout mask.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "tandem/core/build_info.h"
#include "tandem/core/cpu_isa.h"
#include "tandem/core/error.h"
#include "tandem/core/threading.h"
#include "tandem/ops/cpu/nn_kernels.h"
#include "tandem/tensor/philox.h"

namespace {

using tandem::ops::cpu::ConvGeometry;

template <typename T>
std::vector<T> random_vector(size_t n, uint32_t seed) {
  std::mt19937 engine(seed);
  std::uniform_real_distribution<double> uniform(-1.0, 1.0);
  std::vector<T> v(n);
  for (T& x : v) x = static_cast<T>(uniform(engine));
  return v;
}

/// Restores the calling thread's compute-thread count when it goes out of scope.
class ThreadCountGuard {
 public:
  explicit ThreadCountGuard(int threads) : saved_(tandem::compute_threads()) {
    tandem::set_compute_threads(threads);
  }
  ~ThreadCountGuard() { tandem::set_compute_threads(saved_); }

 private:
  int saved_;
};

// ---- GEMM -------------------------------------------------------------------------------------

struct GemmCase {
  bool transpose_a, transpose_b;
  int64_t m, n, k;
  int64_t lda, ldb, ldc;
};

/// A case with the given transposes and leading dimensions padded beyond the stored width.
GemmCase make_case(bool transpose_a, bool transpose_b, int64_t m, int64_t n, int64_t k) {
  return {transpose_a, transpose_b, m, n, k, (transpose_a ? m : k) + 3, (transpose_b ? k : n) + 5,
          n + 7};
}

/// Stored rows of A and B (row-major): op(A) is [m, k], A is [k, m] when transposed.
int64_t a_rows(const GemmCase& c) { return c.transpose_a ? c.k : c.m; }
int64_t b_rows(const GemmCase& c) { return c.transpose_b ? c.n : c.k; }

/// C = alpha * op(A) @ op(B) + beta * C in long double, the obvious way.
template <typename T>
std::vector<T> naive_gemm(const GemmCase& g, T alpha, const std::vector<T>& a,
                          const std::vector<T>& b, T beta, std::vector<T> c) {
  for (int64_t i = 0; i < g.m; ++i) {
    for (int64_t j = 0; j < g.n; ++j) {
      long double sum = 0;
      for (int64_t p = 0; p < g.k; ++p) {
        const T av = g.transpose_a ? a[p * g.lda + i] : a[i * g.lda + p];
        const T bv = g.transpose_b ? b[j * g.ldb + p] : b[p * g.ldb + j];
        sum += static_cast<long double>(av) * bv;
      }
      T& out = c[i * g.ldc + j];
      out = static_cast<T>(alpha * sum +
                           (beta == T(0) ? 0.0L : static_cast<long double>(beta) * out));
    }
  }
  return c;
}

template <typename T>
void check_gemm(const GemmCase& g, T alpha, T beta, double tolerance, uint32_t seed) {
  const auto a = random_vector<T>(a_rows(g) * g.lda, seed);
  const auto b = random_vector<T>(b_rows(g) * g.ldb, seed + 1);
  const auto c0 = random_vector<T>(g.m * g.ldc, seed + 2);
  const auto expected = naive_gemm(g, alpha, a, b, beta, c0);
  auto c = c0;
  tandem::ops::cpu::gemm(g.transpose_a, g.transpose_b, g.m, g.n, g.k, alpha, a.data(), g.lda,
                         b.data(), g.ldb, beta, c.data(), g.ldc);
  for (int64_t i = 0; i < g.m; ++i) {
    for (int64_t j = 0; j < g.ldc; ++j) {
      const size_t at = i * g.ldc + j;
      INFO("ta=" << g.transpose_a << " tb=" << g.transpose_b << " m=" << g.m << " n=" << g.n
                 << " k=" << g.k << " i=" << i << " j=" << j);
      if (j < g.n) {
        REQUIRE(std::abs(c[at] - expected[at]) <= tolerance * (1.0 + std::abs(expected[at])));
      } else {
        REQUIRE(c[at] == c0[at]);  // the padding between rows is never written
      }
    }
  }
}

template <typename T>
void check_gemm_shapes(double tolerance) {
  uint32_t seed = 10;
  for (const bool transpose_a : {false, true}) {
    for (const bool transpose_b : {false, true}) {
      check_gemm<T>(make_case(transpose_a, transpose_b, 37, 29, 53), T(1.5), T(-0.5), tolerance,
                    seed++);
      check_gemm<T>(make_case(transpose_a, transpose_b, 1, 7, 3), T(1), T(0), tolerance, seed++);
      check_gemm<T>(make_case(transpose_a, transpose_b, 9, 1, 300), T(-2), T(1), tolerance, seed++);
      // Several tiles in every dimension, with ragged edges, on the parallel path.
      check_gemm<T>(make_case(transpose_a, transpose_b, 131, 301, 261), T(0.75), T(0.25), tolerance,
                    seed++);
    }
  }
}

}  // namespace

TEST_CASE("gemm float32 matches a naive loop for every transpose, odd sizes and strides",
          "[cpu][ops]") {
  check_gemm_shapes<float>(/*tolerance=*/1e-4);
}

TEST_CASE("gemm float64 matches a naive loop for every transpose, odd sizes and strides",
          "[cpu][ops]") {
  check_gemm_shapes<double>(/*tolerance=*/1e-12);
}

TEST_CASE("gemm float32 with B rows a power of two apart: copied to a padded stride on AVX2",
          "[cpu][ops]") {
  using tandem::CpuIsa;
  using tandem::ops::cpu::gemm_b_copy_stride;
  // The decision: only a B read as stored, rows 512 or more floats apart and a power of two, at
  // least 8 rows of A, where oneDNN takes its AVX2 path.
  const bool copies = tandem::build_info().onednn && tandem::cpu_isa() < CpuIsa::kAvx512Core;
  CHECK(gemm_b_copy_stride(false, 16, 1024) == (copies ? 1040 : 0));
  CHECK(gemm_b_copy_stride(false, 8, 512) == (copies ? 528 : 0));
  CHECK(gemm_b_copy_stride(true, 16, 1024) == 0);
  CHECK(gemm_b_copy_stride(false, 7, 1024) == 0);
  CHECK(gemm_b_copy_stride(false, 16, 1000) == 0);
  CHECK(gemm_b_copy_stride(false, 16, 256) == 0);
  CHECK(gemm_b_copy_stride(false, 16, 1536) == 0);
  // The results, whichever path runs: B as wide as its stride, and narrower (the copy takes
  // only the stored columns), for every transpose of A; C's padding is never written.
  uint32_t seed = 100;
  for (const bool transpose_a : {false, true}) {
    for (const int64_t n : {int64_t{1024}, int64_t{1000}, int64_t{512}}) {
      const int64_t ldb = n == 512 ? 512 : 1024;
      GemmCase g{transpose_a, false, 16, n, 45, (transpose_a ? 16 : 45) + 3, ldb, n + 7};
      check_gemm<float>(g, 1.25f, 0.5f, /*tolerance=*/1e-4, seed++);
      g.m = 8;
      check_gemm<float>(g, 1.0f, 0.0f, /*tolerance=*/1e-4, seed++);
    }
  }
}

TEMPLATE_TEST_CASE("gemm keeps the BLAS conventions for empty sizes, beta 0 and alpha 0",
                   "[cpu][ops]", float, double) {
  using T = TestType;
  const T nan = std::numeric_limits<T>::quiet_NaN();
  const auto a = random_vector<T>(6 * 4, 1);
  const auto b = random_vector<T>(4 * 5, 2);

  SECTION("beta == 0 overwrites C, NaN included") {
    std::vector<T> c(6 * 5, nan);
    tandem::ops::cpu::gemm(false, false, 6, 5, 4, T(1), a.data(), 4, b.data(), 5, T(0), c.data(),
                           5);
    const GemmCase packed{false, false, 6, 5, 4, /*lda=*/4, /*ldb=*/5, /*ldc=*/5};
    const auto expected = naive_gemm<T>(packed, T(1), a, b, T(0), std::vector<T>(30));
    for (size_t i = 0; i < c.size(); ++i) REQUIRE(c[i] == Approx(expected[i]).epsilon(1e-5));
  }
  SECTION("k == 0 scales C by beta") {
    std::vector<T> c(6 * 5, T(3));
    // As from a [6, 0] tensor, whose leading dimension is 0.
    tandem::ops::cpu::gemm(false, false, 6, 5, 0, T(1), a.data(), /*lda=*/0, b.data(), 5, T(0.5),
                           c.data(), 5);
    for (const T v : c) REQUIRE(v == T(1.5));
    tandem::ops::cpu::gemm(true, true, 6, 5, 0, T(1), a.data(), 6, b.data(), 1, T(0), c.data(), 5);
    for (const T v : c) REQUIRE(v == T(0));
  }
  SECTION("m == 0 or n == 0 touches nothing") {
    std::vector<T> c(6 * 5, T(3));
    tandem::ops::cpu::gemm(false, false, 0, 5, 4, T(1), a.data(), 4, b.data(), 5, T(0), c.data(),
                           5);
    tandem::ops::cpu::gemm(false, false, 6, 0, 4, T(1), a.data(), 4, b.data(), 1, T(0), c.data(),
                           1);
    for (const T v : c) REQUIRE(v == T(3));
  }
  SECTION("a leading dimension smaller than the stored width raises, naming the shapes") {
    std::vector<T> c(6 * 5);
    REQUIRE_THROWS_WITH(tandem::ops::cpu::gemm(false, false, 6, 5, 4, T(1), a.data(), 3, b.data(),
                                               5, T(0), c.data(), 5),
                        Catch::Contains("op(A) [6, 4]") && Catch::Contains("lda=3"));
  }
}

TEST_CASE("gemm float64 skips A and B when alpha == 0 and ignores the thread count", "[cpu][ops]") {
  const GemmCase g = make_case(true, false, 150, 270, 140);
  const auto a = random_vector<double>(a_rows(g) * g.lda, 3);
  const auto b = random_vector<double>(b_rows(g) * g.ldb, 4);
  const auto c0 = random_vector<double>(g.m * g.ldc, 5);
  auto run = [&](int threads) {
    ThreadCountGuard guard(threads);
    auto c = c0;
    tandem::ops::cpu::gemm(g.transpose_a, g.transpose_b, g.m, g.n, g.k, 0.5, a.data(), g.lda,
                           b.data(), g.ldb, 2.0, c.data(), g.ldc);
    return c;
  };
  // Each C tile is summed by one thread in a fixed order: bitwise equal for 1 and 2 threads.
  REQUIRE(run(1) == run(2));

  std::vector<double> nan_a(a.size(), std::numeric_limits<double>::quiet_NaN());
  auto c = c0;
  tandem::ops::cpu::gemm(g.transpose_a, g.transpose_b, g.m, g.n, g.k, 0.0, nan_a.data(), g.lda,
                         b.data(), g.ldb, 2.0, c.data(), g.ldc);
  for (int64_t i = 0; i < g.m; ++i) {
    for (int64_t j = 0; j < g.n; ++j) REQUIRE(c[i * g.ldc + j] == 2.0 * c0[i * g.ldc + j]);
  }
}

// ---- im2col / col2im ---------------------------------------------------------------------------

namespace {

/// TensorFlow's geometry: VALID has no padding; SAME gives ceil(in / stride) outputs and puts
/// the smaller half of the padding on top/left.
ConvGeometry geometry(int64_t batch, int64_t in_h, int64_t in_w, int64_t channels, int64_t window_h,
                      int64_t window_w, int64_t stride_h, int64_t stride_w, bool same) {
  ConvGeometry g{};
  g.batch = batch;
  g.in_h = in_h;
  g.in_w = in_w;
  g.channels = channels;
  g.window_h = window_h;
  g.window_w = window_w;
  g.stride_h = stride_h;
  g.stride_w = stride_w;
  if (same) {
    g.out_h = (in_h + stride_h - 1) / stride_h;
    g.out_w = (in_w + stride_w - 1) / stride_w;
    g.pad_top = std::max<int64_t>((g.out_h - 1) * stride_h + window_h - in_h, 0) / 2;
    g.pad_left = std::max<int64_t>((g.out_w - 1) * stride_w + window_w - in_w, 0) / 2;
  } else {
    g.out_h = (in_h - window_h) / stride_h + 1;
    g.out_w = (in_w - window_w) / stride_w + 1;
  }
  return g;
}

std::vector<ConvGeometry> conv_geometries() {
  std::vector<ConvGeometry> all;
  for (const bool same : {false, true}) {
    for (const int64_t stride : {1, 2}) {
      all.push_back(geometry(2, 7, 6, 3, 3, 3, stride, stride, same));
      all.push_back(geometry(3, 8, 9, 2, 2, 4, stride, 1, same));
      all.push_back(geometry(1, 5, 5, 1, 5, 1, 1, stride, same));
    }
  }
  return all;
}

int64_t input_size(const ConvGeometry& g) { return g.batch * g.in_h * g.in_w * g.channels; }
int64_t cols_size(const ConvGeometry& g) {
  return g.batch * g.out_h * g.out_w * g.window_h * g.window_w * g.channels;
}

template <typename T>
double dot(const std::vector<T>& a, const std::vector<T>& b) {
  double sum = 0;
  for (size_t i = 0; i < a.size(); ++i) sum += static_cast<double>(a[i]) * b[i];
  return sum;
}

std::string describe(const ConvGeometry& g) {
  return tandem::detail::str_cat("in [", g.batch, ", ", g.in_h, ", ", g.in_w, ", ", g.channels,
                                 "] window ", g.window_h, "x", g.window_w, " stride ", g.stride_h,
                                 "x", g.stride_w, " pad ", g.pad_top, ",", g.pad_left, " out ",
                                 g.out_h, "x", g.out_w);
}

}  // namespace

TEMPLATE_TEST_CASE("col2im is the adjoint of im2col", "[cpu][ops]", float, double) {
  using T = TestType;
  uint32_t seed = 100;
  for (const ConvGeometry& g : conv_geometries()) {
    INFO(describe(g));
    const auto x = random_vector<T>(input_size(g), seed++);
    const auto c = random_vector<T>(cols_size(g), seed++);
    std::vector<T> im2col_x(cols_size(g));
    std::vector<T> col2im_c(input_size(g), T(42));  // col2im overwrites
    tandem::ops::cpu::im2col(g, x.data(), im2col_x.data());
    tandem::ops::cpu::col2im(g, c.data(), col2im_c.data());
    const double lhs = dot(col2im_c, x);
    const double rhs = dot(c, im2col_x);
    REQUIRE(std::abs(lhs - rhs) <= (std::is_same_v<T, float> ? 1e-4 : 1e-12) * (1 + std::abs(rhs)));
  }
}

TEMPLATE_TEST_CASE("im2col + gemm equals a direct convolution", "[cpu][ops]", float, double) {
  using T = TestType;
  const int64_t out_channels = 4;
  uint32_t seed = 200;
  for (const ConvGeometry& g : conv_geometries()) {
    INFO(describe(g));
    const auto x = random_vector<T>(input_size(g), seed++);
    const int64_t patch = g.window_h * g.window_w * g.channels;
    const auto kernel = random_vector<T>(patch * out_channels, seed++);  // [KH, KW, Cin, Cout]
    const int64_t rows = g.batch * g.out_h * g.out_w;
    std::vector<T> cols(rows * patch);
    std::vector<T> y(rows * out_channels);
    tandem::ops::cpu::im2col(g, x.data(), cols.data());
    tandem::ops::cpu::gemm(false, false, rows, out_channels, patch, T(1), cols.data(), patch,
                           kernel.data(), out_channels, T(0), y.data(), out_channels);

    for (int64_t n = 0; n < g.batch; ++n) {
      for (int64_t oh = 0; oh < g.out_h; ++oh) {
        for (int64_t ow = 0; ow < g.out_w; ++ow) {
          for (int64_t co = 0; co < out_channels; ++co) {
            double sum = 0;
            for (int64_t kh = 0; kh < g.window_h; ++kh) {
              for (int64_t kw = 0; kw < g.window_w; ++kw) {
                for (int64_t ci = 0; ci < g.channels; ++ci) {
                  const int64_t ih = oh * g.stride_h - g.pad_top + kh;
                  const int64_t iw = ow * g.stride_w - g.pad_left + kw;
                  if (ih < 0 || ih >= g.in_h || iw < 0 || iw >= g.in_w) continue;
                  sum +=
                      static_cast<double>(x[((n * g.in_h + ih) * g.in_w + iw) * g.channels + ci]) *
                      kernel[((kh * g.window_w + kw) * g.channels + ci) * out_channels + co];
                }
              }
            }
            const T got = y[((n * g.out_h + oh) * g.out_w + ow) * out_channels + co];
            REQUIRE(std::abs(got - sum) <=
                    (std::is_same_v<T, float> ? 1e-5 : 1e-13) * (1 + std::abs(sum)));
          }
        }
      }
    }
  }
}

// ---- max pooling -------------------------------------------------------------------------------

namespace {

/// Naive pooling: first maximum over the in-range window entries, -inf / -1 if there are none.
template <typename T>
void naive_pool(const ConvGeometry& g, const std::vector<T>& x, std::vector<T>& y,
                std::vector<int64_t>& argmax) {
  for (int64_t n = 0; n < g.batch; ++n) {
    for (int64_t oh = 0; oh < g.out_h; ++oh) {
      for (int64_t ow = 0; ow < g.out_w; ++ow) {
        for (int64_t c = 0; c < g.channels; ++c) {
          T best = -std::numeric_limits<T>::infinity();
          int64_t best_index = -1;
          for (int64_t kh = 0; kh < g.window_h; ++kh) {
            for (int64_t kw = 0; kw < g.window_w; ++kw) {
              const int64_t ih = oh * g.stride_h - g.pad_top + kh;
              const int64_t iw = ow * g.stride_w - g.pad_left + kw;
              if (ih < 0 || ih >= g.in_h || iw < 0 || iw >= g.in_w) continue;
              const int64_t index = ((n * g.in_h + ih) * g.in_w + iw) * g.channels + c;
              if (best_index < 0 || x[index] > best) {
                best = x[index];
                best_index = index;
              }
            }
          }
          const int64_t o = ((n * g.out_h + oh) * g.out_w + ow) * g.channels + c;
          y[o] = best;
          argmax[o] = best_index;
        }
      }
    }
  }
}

std::vector<ConvGeometry> pool_geometries() {
  std::vector<ConvGeometry> all;
  for (const bool same : {false, true}) {
    all.push_back(geometry(2, 6, 6, 3, 2, 2, 2, 2, same));
    all.push_back(geometry(2, 7, 5, 2, 3, 3, 2, 2, same));  // overlapping windows, ragged edge
    all.push_back(geometry(1, 5, 8, 4, 3, 2, 1, 3, same));
  }
  return all;
}

}  // namespace

TEMPLATE_TEST_CASE("max_pool2d forward and backward match naive loops", "[cpu][ops]", float,
                   double) {
  using T = TestType;
  uint32_t seed = 300;
  for (const ConvGeometry& g : pool_geometries()) {
    INFO(describe(g));
    const int64_t outputs = g.batch * g.out_h * g.out_w * g.channels;
    auto x = random_vector<T>(input_size(g), seed++);
    // Ties inside windows: a quarter of the inputs share one value.
    for (size_t i = 0; i < x.size(); i += 4) x[i] = T(0.5);
    std::vector<T> y(outputs), expected_y(outputs);
    std::vector<int64_t> expected_argmax(outputs);
    tandem::ops::cpu::max_pool2d_forward(g, x.data(), y.data());
    naive_pool(g, x, expected_y, expected_argmax);
    REQUIRE(y == expected_y);

    // The gradient reaches each window's first maximum, added up in output order.
    const auto dy = random_vector<T>(outputs, seed++);
    std::vector<T> dx(input_size(g), T(7));  // backward overwrites
    std::vector<T> expected_dx(input_size(g), T(0));
    for (int64_t o = 0; o < outputs; ++o) expected_dx[expected_argmax[o]] += dy[o];
    tandem::ops::cpu::max_pool2d_backward(g, x.data(), y.data(), dy.data(), dx.data());
    REQUIRE(dx == expected_dx);
  }
}

TEST_CASE("max_pool2d: padding never wins, empty windows are -inf, ties go first, NaN wins",
          "[cpu][ops]") {
  // All inputs negative, so a padding value of 0 would win if padding were read.
  ConvGeometry g = geometry(1, 3, 3, 1, 2, 2, 1, 1, /*same=*/true);
  REQUIRE(g.pad_top == 0);
  std::vector<float> x = {-5, -4, -3, -2, -2, -6, -7, -8, -9};
  std::vector<float> y(9);
  tandem::ops::cpu::max_pool2d_forward(g, x.data(), y.data());
  REQUIRE(y == std::vector<float>{-2, -2, -3, -2, -2, -6, -7, -8, -9});
  // Output 0 sees -5 -4 / -2 -2: the first -2 (index 3) wins the tie and gets its gradient.
  std::vector<float> one_hot(9, 0.0f), dx(9);
  one_hot[0] = 1.0f;
  tandem::ops::cpu::max_pool2d_backward(g, x.data(), y.data(), one_hot.data(), dx.data());
  REQUIRE(dx == std::vector<float>{0, 0, 0, 1, 0, 0, 0, 0, 0});

  // A pad larger than the window (not TF geometry) leaves the first output row all padding:
  // -inf, and its gradient goes nowhere.
  ConvGeometry padded = g;
  padded.window_h = padded.window_w = 1;
  padded.pad_top = 1;
  padded.out_h = 4;
  std::vector<float> y2(12);
  tandem::ops::cpu::max_pool2d_forward(padded, x.data(), y2.data());
  for (int i = 0; i < 3; ++i) REQUIRE(y2[i] == -std::numeric_limits<float>::infinity());
  REQUIRE(y2[3] == x[0]);
  std::vector<float> dy(12, 1.0f);
  tandem::ops::cpu::max_pool2d_backward(padded, x.data(), y2.data(), dy.data(), dx.data());
  for (const float v : dx) REQUIRE(v == 1.0f);

  // A NaN wins its windows, and the first NaN gets the gradient.
  x[1] = x[4] = std::numeric_limits<float>::quiet_NaN();
  tandem::ops::cpu::max_pool2d_forward(g, x.data(), y.data());
  REQUIRE(std::isnan(y[0]));
  REQUIRE(std::isnan(y[1]));
  REQUIRE(std::isnan(y[3]));
  REQUIRE(y[2] == -3);
  tandem::ops::cpu::max_pool2d_backward(g, x.data(), y.data(), one_hot.data(), dx.data());
  REQUIRE(dx == std::vector<float>{0, 1, 0, 0, 0, 0, 0, 0, 0});
}

// ---- dropout -----------------------------------------------------------------------------------

TEST_CASE("dropout_mask keeps 1 - rate of the elements, scaled by 1 / (1 - rate)", "[cpu][ops]") {
  const int64_t n = 1 << 18;
  for (const double rate : {0.1, 0.5, 0.8}) {
    std::vector<float> mask(n);
    tandem::ops::cpu::dropout_mask(n, rate, /*seed=*/7, /*stream=*/3, /*first_block=*/11,
                                   mask.data());
    const float kept_value = static_cast<float>(1.0 / (1.0 - rate));
    int64_t kept = 0;
    for (const float v : mask) {
      REQUIRE((v == 0.0f || v == kept_value));
      kept += v != 0.0f;
    }
    // Binomial standard deviation sqrt(p (1 - p) / n) <= 0.001 here; allow 5 of them.
    INFO("rate " << rate << " kept " << kept);
    REQUIRE(std::abs(static_cast<double>(kept) / n - (1.0 - rate)) < 0.005);
  }
  std::vector<double> all(1001, -1.0);
  tandem::ops::cpu::dropout_mask(1000, 0.0, 1, 2, 3, all.data());
  for (int i = 0; i < 1000; ++i) REQUIRE(all[i] == 1.0);
  REQUIRE(all[1000] == -1.0);  // exactly n elements are written
}

TEST_CASE("dropout_mask is a function of (seed, stream, block) alone", "[cpu][ops]") {
  const int64_t n = 4099;  // not a multiple of 4
  const double rate = 0.3;
  auto mask = [&](uint64_t seed, uint64_t stream, uint64_t first_block, int64_t count) {
    std::vector<float> m(count);
    tandem::ops::cpu::dropout_mask(count, rate, seed, stream, first_block, m.data());
    return m;
  };
  const auto reference = mask(5, 9, 100, n);
  REQUIRE(mask(5, 9, 100, n) == reference);
  {
    ThreadCountGuard guard(1);
    REQUIRE(mask(5, 9, 100, n) == reference);
  }
  REQUIRE(mask(6, 9, 100, n) != reference);
  REQUIRE(mask(5, 10, 100, n) != reference);
  // Starting one block later is the same sequence shifted by four elements.
  const auto later = mask(5, 9, 101, n - 4);
  REQUIRE(std::equal(later.begin(), later.end(), reference.begin() + 4));
  // Element i is lane i % 4 of block first_block + i / 4.
  const float kept_value = static_cast<float>(1.0 / (1.0 - rate));
  for (const int64_t i : {0, 1, 2, 3, 17, 4098}) {
    const uint32_t bits = tandem::philox::block(5, 9, 100 + i / 4).v[i % 4];
    const bool keep = tandem::philox::to_unit_float(bits) >= rate;
    REQUIRE(reference[i] == (keep ? kept_value : 0.0f));
  }
  // float and double masks drop the same elements.
  std::vector<double> as_double(n);
  tandem::ops::cpu::dropout_mask(n, rate, 5, 9, 100, as_double.data());
  for (int64_t i = 0; i < n; ++i) REQUIRE((as_double[i] != 0.0) == (reference[i] != 0.0f));
}
