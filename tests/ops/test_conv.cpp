// The fused conv2d op, act(conv(x, kernel) + bias), forward and backward against the im2col
// composition it replaced (im2col, matmul, add, relu; col2im for the input gradient) over
// several shapes, strides and paddings: float64 bitwise, float32 (oneDNN's primitives) bitwise
// on inputs whose sums are exact and within the summation-order bound otherwise; finite
// differences; one recorded node and no input gradient for an untracked input; errors. The
// shapes oneDNN's Winograd kernels take: within their error bound of the exact result, and within
// the summation-order bound once they are turned off.
#include <algorithm>
#include <array>
#include <catch2/catch.hpp>
#include <cmath>
#include <sstream>
#include <string>
#include <vector>

#include "ops/gradcheck.h"
#include "ops/ops_testing.h"
#include "support/node_recorder.h"
#include "tandem/ops/cpu/nn_kernels.h"

using namespace tandem;
using tandem::ops::cpu::ConvGeometry;
using tandem::testing::check_gradients;
using tandem::testing::NodeRecorder;
using tandem::testing::random_tensor;
using tandem::testing::require_close;
using tandem::testing::values;

namespace {

struct ConvCase {
  Shape x, kernel;
  std::array<int64_t, 2> strides;
  ops::Padding padding;
};

std::string describe(const ConvCase& c) {
  std::ostringstream out;
  out << "x " << c.x << ", kernel " << c.kernel << ", strides [" << c.strides[0] << ", "
      << c.strides[1] << "], " << (c.padding == ops::Padding::kSame ? "SAME" : "VALID");
  return out.str();
}

// Square and rectangular kernels and strides, SAME with odd and even total padding, strides
// larger than the kernel, a kernel larger than the input (SAME), 1x1 kernels, one input
// channel (a first layer), and the sample's two layers.
const std::vector<ConvCase> kCases = {
    {{2, 7, 6, 3}, {3, 3, 3, 4}, {1, 1}, ops::Padding::kValid},
    {{2, 7, 6, 3}, {3, 3, 3, 4}, {1, 1}, ops::Padding::kSame},
    {{2, 7, 6, 3}, {3, 3, 3, 4}, {2, 2}, ops::Padding::kValid},
    {{2, 7, 6, 3}, {3, 3, 3, 4}, {2, 2}, ops::Padding::kSame},
    {{1, 5, 8, 2}, {2, 3, 2, 5}, {2, 1}, ops::Padding::kSame},
    {{1, 9, 9, 2}, {2, 2, 2, 3}, {3, 3}, ops::Padding::kValid},
    {{1, 2, 2, 3}, {3, 3, 3, 2}, {1, 1}, ops::Padding::kSame},
    {{2, 6, 7, 16}, {1, 1, 16, 3}, {2, 2}, ops::Padding::kSame},
    // 1x1 windows with strides over input channels that are not a multiple of oneDNN's channel
    // block: its strided 1x1 backward-weights kernel overran its workspace here (wrong kernel
    // gradients with 2 threads, heap corruption), so Tandem gathers the pixels itself.
    {{16, 8, 8, 4}, {1, 1, 4, 8}, {2, 2}, ops::Padding::kSame},
    {{16, 8, 8, 2}, {1, 1, 2, 8}, {2, 2}, ops::Padding::kValid},
    {{8, 7, 9, 7}, {1, 1, 7, 16}, {2, 3}, ops::Padding::kSame},
    {{3, 9, 9, 1}, {3, 3, 1, 8}, {1, 1}, ops::Padding::kValid},
    {{4, 28, 28, 1}, {3, 3, 1, 32}, {1, 1}, ops::Padding::kValid},
    {{4, 13, 13, 32}, {3, 3, 32, 64}, {1, 1}, ops::Padding::kValid},
};

/// The geometry by TensorFlow's rules, written out here rather than taken from the op.
ConvGeometry geometry(const ConvCase& c) {
  ConvGeometry g{};
  g.batch = c.x[0];
  g.in_h = c.x[1];
  g.in_w = c.x[2];
  g.channels = c.x[3];
  g.window_h = c.kernel[0];
  g.window_w = c.kernel[1];
  g.stride_h = c.strides[0];
  g.stride_w = c.strides[1];
  g.out_h = ops::conv_output_size(g.in_h, g.window_h, g.stride_h, c.padding);
  g.out_w = ops::conv_output_size(g.in_w, g.window_w, g.stride_w, c.padding);
  if (c.padding == ops::Padding::kSame) {
    g.pad_top = std::max<int64_t>((g.out_h - 1) * g.stride_h + g.window_h - g.in_h, 0) / 2;
    g.pad_left = std::max<int64_t>((g.out_w - 1) * g.stride_w + g.window_w - g.in_w, 0) / 2;
  }
  return g;
}

Tensor im2col(const Tensor& x, const ConvGeometry& g) {
  Tensor cols = Tensor::zeros({ops::cpu::im2col_rows(g), ops::cpu::im2col_depth(g)}, x.dtype());
  if (cols.numel() == 0) return cols;
  if (x.dtype() == DType::kFloat32)
    ops::cpu::im2col(g, x.data<float>(), cols.data<float>());
  else
    ops::cpu::im2col(g, x.data<double>(), cols.data<double>());
  return cols;
}

Tensor col2im(const Tensor& cols, const ConvGeometry& g) {
  Tensor dx = Tensor::zeros({g.batch, g.in_h, g.in_w, g.channels}, cols.dtype());
  if (dx.numel() == 0) return dx;
  if (cols.dtype() == DType::kFloat32)
    ops::cpu::col2im(g, cols.data<float>(), dx.data<float>());
  else
    ops::cpu::col2im(g, cols.data<double>(), dx.data<double>());
  return dx;
}

/// The output of a convolution and the gradients of sum(y * upstream).
struct Result {
  Tensor y, x, kernel, bias;
};

/// The composition the op replaced, run by hand (no tape): im2col, matmul, add, relu; and
/// backward the ReLU mask, matmul for the kernel, a sum for the bias, matmul and col2im for x.
Result reference(const ConvCase& c, const Tensor& x, const Tensor& kernel, const Tensor& bias,
                 bool relu, const Tensor& upstream) {
  const ConvGeometry g = geometry(c);
  const int64_t rows = ops::cpu::im2col_rows(g), depth = ops::cpu::im2col_depth(g);
  const int64_t filters = c.kernel[3];
  const Tensor cols = im2col(x, g);
  const Tensor kernel_matrix = kernel.reshape({depth, filters});
  Result r;
  r.y = ops::matmul(cols, kernel_matrix);
  if (bias.defined()) r.y = ops::add(r.y, bias);
  if (relu) r.y = ops::relu(r.y);
  Tensor dz = upstream.reshape({rows, filters}).clone();
  if (relu) {
    const std::vector<double> y = values(r.y), g_values = values(dz);
    std::vector<double> masked(y.size());
    for (size_t i = 0; i < y.size(); ++i) masked[i] = y[i] > 0 ? g_values[i] : 0.0;
    dz = ops::cast(Tensor::from_vector<double>(masked, dz.shape()), x.dtype());
  }
  r.y = r.y.reshape({g.batch, g.out_h, g.out_w, filters});
  r.kernel = ops::matmul(cols, dz, /*transpose_a=*/true).reshape(kernel.shape());
  if (bias.defined()) r.bias = ops::sum(dz, /*axis=*/0);
  r.x = col2im(ops::matmul(dz, kernel_matrix, false, /*transpose_b=*/true), g);
  return r;
}

/// The fused op through a tape that watches x only when `track_x`.
Result fused(const ConvCase& c, const Tensor& x, const Tensor& kernel, const Tensor& bias,
             bool relu, const Tensor& upstream, bool track_x = true) {
  GradientTape tape;
  if (track_x) tape.watch(x);
  tape.watch(kernel);
  if (bias.defined()) tape.watch(bias);
  Result r;
  r.y = ops::conv2d(x, kernel, bias, c.strides, c.padding,
                    relu ? ops::FusedActivation::kRelu : ops::FusedActivation::kLinear);
  const std::vector<Tensor> g =
      tape.gradient(ops::sum(ops::mul(r.y, upstream)), std::vector<Tensor>{x, kernel, bias});
  r.x = g[0];
  r.kernel = g[1];
  r.bias = g[2];
  return r;
}

/// Every element equal (== on values: a ReLU may give -0 where the other gives +0).
void require_equal(const Tensor& actual, const Tensor& expected) {
  REQUIRE(actual.defined() == expected.defined());
  if (!actual.defined()) return;
  REQUIRE(actual.shape() == expected.shape());
  REQUIRE(actual.dtype() == expected.dtype());
  require_close(actual, expected, /*rtol=*/0.0, /*atol=*/0.0);
}

void require_equal(const Result& got, const Result& want) {
  require_equal(got.y, want.y);
  require_equal(got.x, want.x);
  require_equal(got.kernel, want.kernel);
  require_equal(got.bias, want.bias);
}

/// x rounded to a multiple of 1/8 (|x| < 1 stays below 1).
Tensor eighths(const Tensor& x) {
  std::vector<float> v = x.to_vector<float>();
  for (float& e : v) e = std::round(e * 8.0f) / 8.0f;
  return Tensor::from_vector<float>(v, x.shape());
}

/// Output shape of a case.
Shape output_shape(const ConvCase& c) {
  const ConvGeometry g = geometry(c);
  return {g.batch, g.out_h, g.out_w, c.kernel[3]};
}

/// |got - want| <= 2 gamma(terms) magnitude per element, gamma(n) = n u / (1 - n u) with
/// u = 2^-24: two float32 sums of the same `terms` terms in different orders each lie within
/// gamma(terms) * sum|term| of the exact value (Higham, Accuracy and Stability of Numerical
/// Algorithms, 3.1), so they differ by at most twice that. `magnitude` holds sum|term|.
void require_within_order_bound(const Tensor& got, const Tensor& want, const Tensor& magnitude,
                                int64_t terms) {
  const std::vector<double> a = values(got), b = values(want), m = values(magnitude);
  REQUIRE(a.size() == b.size());
  REQUIRE(a.size() == m.size());
  const double u = std::ldexp(1.0, -24), n = static_cast<double>(terms);
  const double gamma = n * u / (1.0 - n * u);
  size_t bad = 0;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::abs(a[i] - b[i]) > 2.0 * gamma * m[i]) ++bad;
  CHECK(bad == 0);
}

Tensor abs64(const Tensor& t) { return ops::cast(ops::abs(t), DType::kFloat64); }

}  // namespace

TEST_CASE("float64 conv2d equals the im2col composition bitwise, forward and backward",
          "[cpu][ops][conv]") {
  for (const ConvCase& c : kCases) {
    for (const bool with_bias : {true, false}) {
      for (const bool relu : {true, false}) {
        INFO(describe(c) << (with_bias ? " + bias" : "") << (relu ? ", relu" : ", linear"));
        const Tensor x = random_tensor(c.x, /*seed=*/1);
        const Tensor kernel = random_tensor(c.kernel, /*seed=*/2);
        const Tensor bias = with_bias ? random_tensor({c.kernel[3]}, /*seed=*/3) : Tensor();
        const Tensor upstream = random_tensor(output_shape(c), /*seed=*/4);
        require_equal(fused(c, x, kernel, bias, relu, upstream),
                      reference(c, x, kernel, bias, relu, upstream));
      }
    }
  }
}

TEST_CASE("float32 conv2d on oneDNN equals the composition when every sum is exact",
          "[cpu][ops][conv]") {
  // Inputs that are multiples of 1/8 below 1 make every product a multiple of 1/64 below 1, so
  // every partial sum here (at most a few thousand terms) is exact in float32: any summation
  // order gives the same bits, and what is compared is the geometry, the epilogue, the ReLU
  // mask and which gradient goes where.
  for (const ConvCase& c : kCases) {
    for (const bool with_bias : {true, false}) {
      for (const bool relu : {true, false}) {
        INFO(describe(c) << (with_bias ? " + bias" : "") << (relu ? ", relu" : ", linear"));
        const Tensor x = eighths(random_tensor(c.x, /*seed=*/5, DType::kFloat32));
        const Tensor kernel = eighths(random_tensor(c.kernel, /*seed=*/6, DType::kFloat32));
        const Tensor bias = with_bias
                                ? eighths(random_tensor({c.kernel[3]}, /*seed=*/7, DType::kFloat32))
                                : Tensor();
        const Tensor upstream = eighths(random_tensor(output_shape(c), 8, DType::kFloat32));
        require_equal(fused(c, x, kernel, bias, relu, upstream),
                      reference(c, x, kernel, bias, relu, upstream));
      }
    }
  }
}

TEST_CASE("float32 conv2d stays within the summation-order bound of the composition",
          "[cpu][ops][conv]") {
  // Linear, so that both sides' gradients see the same upstream (a ReLU mask could differ
  // where an output is within rounding of 0); the mask is checked by the exact test above.
  for (const ConvCase& c : kCases) {
    INFO(describe(c) << " + bias");
    const Tensor x = random_tensor(c.x, /*seed=*/9, DType::kFloat32);
    const Tensor kernel = random_tensor(c.kernel, /*seed=*/10, DType::kFloat32);
    const Tensor bias = random_tensor({c.kernel[3]}, /*seed=*/11, DType::kFloat32);
    const Tensor upstream = random_tensor(output_shape(c), /*seed=*/12, DType::kFloat32);
    const Result got = fused(c, x, kernel, bias, /*relu=*/false, upstream);
    const Result want = reference(c, x, kernel, bias, /*relu=*/false, upstream);
    // sum|term| of each result: the same composition in float64 on absolute values.
    const Result magnitude =
        reference(c, abs64(x), abs64(kernel), abs64(bias), false, abs64(upstream));
    const ConvGeometry g = geometry(c);
    const int64_t depth = ops::cpu::im2col_depth(g), rows = ops::cpu::im2col_rows(g);
    require_within_order_bound(got.y, want.y, magnitude.y, depth + 1);
    require_within_order_bound(got.kernel, want.kernel, magnitude.kernel, rows);
    require_within_order_bound(got.bias, want.bias, magnitude.bias, rows);
    require_within_order_bound(got.x, want.x, magnitude.x, g.window_h * g.window_w * c.kernel[3]);
  }
}

TEST_CASE("gradients of the fused conv2d", "[cpu][ops][grad][conv]") {
  const Tensor x = random_tensor({2, 5, 6, 2}, /*seed=*/20);
  const Tensor kernel = random_tensor({3, 2, 2, 3}, /*seed=*/21);
  const Tensor bias = random_tensor({3}, /*seed=*/22);
  for (const bool relu : {true, false}) {
    const auto activation = relu ? ops::FusedActivation::kRelu : ops::FusedActivation::kLinear;
    for (const ops::Padding padding : {ops::Padding::kValid, ops::Padding::kSame}) {
      for (const std::array<int64_t, 2> strides :
           {std::array<int64_t, 2>{1, 1}, std::array<int64_t, 2>{2, 1}}) {
        INFO((relu ? "relu " : "linear ") << (padding == ops::Padding::kSame ? "SAME" : "VALID")
                                          << " strides " << strides[0] << "x" << strides[1]);
        check_gradients(
            [&](const std::vector<Tensor>& in) {
              return ops::conv2d(in[0], in[1], in[2], strides, padding, activation);
            },
            {x, kernel, bias});
      }
    }
  }
}

TEST_CASE("conv2d records one node and no input gradient for an untracked input",
          "[cpu][ops][conv]") {
  const ConvCase c = kCases[1];
  for (const DType dtype : {DType::kFloat32, DType::kFloat64}) {
    INFO(dtype);
    // Exact sums in float32 (see above), so that gradients can be compared bitwise.
    auto input = [&](const Shape& shape, uint64_t seed) {
      const Tensor t = random_tensor(shape, seed, dtype);
      return dtype == DType::kFloat64 ? t : eighths(t);
    };
    const Tensor x = input(c.x, /*seed=*/30);
    const Tensor kernel = input(c.kernel, /*seed=*/31);
    const Tensor bias = input({c.kernel[3]}, /*seed=*/32);
    const Tensor upstream = input(output_shape(c), /*seed=*/33);
    const Result want = reference(c, x, kernel, bias, /*relu=*/true, upstream);

    // A first layer: only the kernel and the bias are tracked.
    {
      NodeRecorder recorder({kernel, bias});
      ops::conv2d(x, kernel, bias, c.strides, c.padding, ops::FusedActivation::kRelu);
      REQUIRE(recorder.ops() == std::vector<std::string>{"conv2d"});
      std::vector<Tensor> grads;
      {
        ops::NoRecordGuard no_record;
        grads = recorder.backward(0)({upstream});
      }
      REQUIRE(grads.size() == 3);
      REQUIRE_FALSE(grads[0].defined());  // the backward-data pass did not run
      require_equal(grads[1], want.kernel);
      require_equal(grads[2], want.bias);
    }
    // Through a tape: the untracked input has no gradient and the others are right.
    const Result got = fused(c, x, kernel, bias, /*relu=*/true, upstream, /*track_x=*/false);
    REQUIRE_FALSE(got.x.defined());
    require_equal(got.kernel, want.kernel);
    require_equal(got.bias, want.bias);
  }
}

TEST_CASE("conv2d handles an empty batch and inputs without channels", "[cpu][ops][conv]") {
  for (const DType dtype : {DType::kFloat32, DType::kFloat64}) {
    INFO(dtype);
    const Tensor kernel = random_tensor({3, 3, 2, 4}, /*seed=*/40, dtype);
    const Tensor bias = random_tensor({4}, /*seed=*/41, dtype);
    // No images: an empty output, zero kernel and bias gradients.
    const ConvCase empty_batch{{0, 5, 5, 2}, {3, 3, 2, 4}, {1, 1}, ops::Padding::kSame};
    const Tensor none = Tensor::zeros({0, 5, 5, 2}, dtype);
    const Result r =
        fused(empty_batch, none, kernel, bias, true, Tensor::zeros({0, 5, 5, 4}, dtype));
    REQUIRE(r.y.shape() == Shape{0, 5, 5, 4});
    require_close(r.kernel, std::vector<double>(kernel.numel(), 0.0), 0, 0);
    require_close(r.bias, std::vector<double>(4, 0.0), 0, 0);
    REQUIRE(r.x.shape() == none.shape());
    // No input channels: the output is act(bias) everywhere.
    const Tensor bias_only =
        ops::conv2d(Tensor::zeros({2, 4, 4, 0}, dtype), Tensor::zeros({3, 3, 0, 4}, dtype), bias,
                    {1, 1}, ops::Padding::kValid, ops::FusedActivation::kRelu);
    REQUIRE(bias_only.shape() == Shape{2, 2, 2, 4});
    require_equal(bias_only, ops::add(Tensor::zeros({2, 2, 2, 4}, dtype), ops::relu(bias)));
  }
}

TEST_CASE("conv2d refuses mismatched shapes and dtypes, naming the op and the shapes",
          "[cpu][ops][conv]") {
  const Tensor x = Tensor::ones({2, 7, 6, 3}, DType::kFloat64);
  const Tensor kernel = Tensor::ones({3, 3, 3, 4}, DType::kFloat64);
  const std::array<int64_t, 2> s{1, 1};
  const auto valid = ops::Padding::kValid;
  REQUIRE_THROWS_WITH(ops::conv2d(x, kernel, Tensor::ones({3}, DType::kFloat64), s, valid),
                      Catch::Contains("conv2d") && Catch::Contains("bias of shape [3]") &&
                          Catch::Contains("[3, 3, 3, 4]"));
  REQUIRE_THROWS_WITH(
      ops::conv2d(x, kernel, Tensor::ones({4}, DType::kFloat32), s, valid),
      Catch::Contains("conv2d") && Catch::Contains("float32") && Catch::Contains("float64"));
  REQUIRE_THROWS_WITH(
      ops::conv2d(x, Tensor::ones({3, 3, 2, 4}, DType::kFloat64), Tensor(), s, valid),
      Catch::Contains("conv2d") && Catch::Contains("[2, 7, 6, 3]") &&
          Catch::Contains("[3, 3, 2, 4]"));
  REQUIRE_THROWS_WITH(ops::conv2d(Tensor::ones({2, 7, 6, 3}, DType::kInt32),
                                  Tensor::ones({3, 3, 3, 4}, DType::kInt32)),
                      Catch::Contains("conv2d") && Catch::Contains("int32"));
  REQUIRE_THROWS_WITH(ops::conv2d(x, Tensor::ones({8, 3, 3, 4}, DType::kFloat64),
                                  Tensor::ones({4}, DType::kFloat64), s, valid),
                      Catch::Contains("conv2d") && Catch::Contains("VALID"));
}

TEST_CASE("float32 3x3 SAME convolutions of 16k channels: Winograd within its bound, or direct",
          "[cpu][ops][conv]") {
  // The shapes oneDNN's Winograd kernels take: 16 channels (used in place) and 32 (reordered).
  const std::vector<ConvCase> cases = {
      {{2, 8, 8, 16}, {3, 3, 16, 16}, {1, 1}, ops::Padding::kSame},
      {{2, 7, 6, 32}, {3, 3, 32, 16}, {1, 1}, ops::Padding::kSame},
      {{3, 5, 9, 16}, {3, 3, 16, 32}, {1, 1}, ops::Padding::kSame},
  };
  struct Restore {
    bool was = ops::winograd_convolutions();
    ~Restore() { ops::set_winograd_convolutions(was); }
  } restore;
  for (const bool winograd : {true, false}) {
    ops::set_winograd_convolutions(winograd);
    REQUIRE(ops::winograd_convolutions() == winograd);
    for (const ConvCase& c : cases) {
      INFO(describe(c) << " + bias, " << (winograd ? "Winograd allowed" : "direct"));
      const Tensor x = random_tensor(c.x, /*seed=*/21, DType::kFloat32);
      const Tensor kernel = random_tensor(c.kernel, /*seed=*/22, DType::kFloat32);
      const Tensor bias = random_tensor({c.kernel[3]}, /*seed=*/23, DType::kFloat32);
      const Tensor upstream = random_tensor(output_shape(c), /*seed=*/24, DType::kFloat32);
      const Result got = fused(c, x, kernel, bias, /*relu=*/false, upstream);
      const Result magnitude =
          reference(c, abs64(x), abs64(kernel), abs64(bias), false, abs64(upstream));
      const ConvGeometry g = geometry(c);
      const int64_t rows = ops::cpu::im2col_rows(g);
      if (winograd) {
        // Winograd F(4x4, 3x3) rounds in its transforms too: within 2^-17 of sum|term| of the
        // exact float64 result (the largest seen here is ~2^-20).
        const Result exact = reference(
            c, ops::cast(x, DType::kFloat64), ops::cast(kernel, DType::kFloat64),
            ops::cast(bias, DType::kFloat64), false, ops::cast(upstream, DType::kFloat64));
        const auto within = [](const Tensor& a, const Tensor& b, const Tensor& m) {
          const std::vector<double> av = values(a), bv = values(b), mv = values(m);
          REQUIRE(av.size() == bv.size());
          double worst = 0;
          for (size_t i = 0; i < av.size(); ++i)
            worst = std::max(worst, std::abs(av[i] - bv[i]) / std::max(mv[i], 1e-30));
          INFO("largest |got - exact| / sum|term| = " << worst);
          CHECK(worst <= std::ldexp(1.0, -17));
        };
        within(got.y, exact.y, magnitude.y);
        within(got.kernel, exact.kernel, magnitude.kernel);
        within(got.bias, exact.bias, magnitude.bias);
        within(got.x, exact.x, magnitude.x);
      } else {
        const Result want = reference(c, x, kernel, bias, /*relu=*/false, upstream);
        require_within_order_bound(got.y, want.y, magnitude.y, ops::cpu::im2col_depth(g) + 1);
        require_within_order_bound(got.kernel, want.kernel, magnitude.kernel, rows);
        require_within_order_bound(got.bias, want.bias, magnitude.bias, rows);
        require_within_order_bound(got.x, want.x, magnitude.x, 9 * c.kernel[3]);
      }
    }
  }
}
