// [cuda] tests of 16-bit compute on a GPU (bfloat16 and float16): matmul with every transpose,
// the fused dense layer forward (bias, ReLU) and backward, conv2d forward and backward, each
// against the CPU's 16-bit kernels, which sum in float32 and round once, as cuBLASLt does here;
// and the optimizer updates, which take float32 gradients (the gradient of a cast) on both
// devices. Without a GPU each test WARNs why it was skipped and passes.
#include <algorithm>
#include <array>
#include <catch2/catch.hpp>
#include <cmath>
#include <string>
#include <vector>

#include "support/require_gpu.h"
#include "tandem/tandem.h"
#include "tandem/tensor/device_runtime.h"

namespace {

using namespace tandem;
using ops::FusedActivation;
using ops::Padding;

const Device kGpu = Device::cuda(0);
const std::array<DType, 2> kHalfTypes{DType::kBFloat16, DType::kFloat16};

/// Uniform in [-1, 1) rounded to `dtype`, on the CPU (Philox: the same numbers on every run).
Tensor random(const Shape& shape, uint64_t seed, DType dtype) {
  Generator generator(seed);
  return ops::cast(Tensor::uniform(shape, generator, -1.0, 1.0, DType::kFloat32), dtype);
}

/// Two units in the last place of the 16-bit type: both devices sum in float32 and round once,
/// but in different orders, so a float32 sum that lands near a rounding boundary may round to
/// either neighbour.
double tolerance(DType dtype) { return dtype == DType::kBFloat16 ? 2.0 / 128 : 2.0 / 1024; }

/// Requires the CUDA result `gpu` to match the CPU's `cpu` (same shape and dtype):
/// |gpu - cpu| <= rtol * max(|cpu|, max |cpu|), i.e. relative to the tensor's scale where an
/// element cancels to near zero.
void require_close(const Tensor& gpu, const Tensor& cpu, const std::string& what) {
  INFO(what);
  REQUIRE(gpu.defined());
  REQUIRE(cpu.defined());
  REQUIRE(gpu.device() == kGpu);
  REQUIRE(gpu.shape() == cpu.shape());
  REQUIRE(gpu.dtype() == cpu.dtype());
  const double rtol = tolerance(cpu.dtype());
  const std::vector<double> got = gpu.to_vector<double>(), want = cpu.to_vector<double>();
  double scale = 0.0;
  for (double w : want) scale = std::max(scale, std::abs(w));
  REQUIRE(scale > 0.0);  // a result of zeros would prove nothing
  for (size_t i = 0; i < want.size(); ++i) {
    const double g = got[i], w = want[i];
    if (!(std::abs(g - w) <= rtol * std::max(std::abs(w), scale))) {
      FAIL_CHECK("element " << i << " of " << want.size() << " (shape " << cpu.shape() << ", "
                            << cpu.dtype() << "): CUDA " << g << ", CPU " << w << ", rtol "
                            << rtol);
      return;
    }
  }
}

/// The output of f(inputs) and the gradients of sum(f(inputs) * weight) for every input.
struct Run {
  Tensor output;
  std::vector<Tensor> gradients;
};

template <typename F>
Run run(const F& f, const std::vector<Tensor>& inputs, const Tensor& weight) {
  GradientTape tape;
  for (const Tensor& x : inputs) tape.watch(x);
  Run r;
  r.output = f(inputs);
  r.gradients = tape.gradient(ops::mul(r.output, weight), inputs);
  return r;
}

/// Runs f on the CPU inputs and on their GPU copies; requires the outputs and the gradients of
/// every input (named by `names`) to match.
template <typename F>
void check_forward_backward(const std::string& what, const F& f,
                            const std::vector<Tensor>& cpu_inputs,
                            const std::vector<std::string>& names) {
  std::vector<Tensor> gpu_inputs;
  for (const Tensor& x : cpu_inputs) gpu_inputs.push_back(x.to(kGpu));
  const Tensor probe = f(cpu_inputs);
  const Tensor weight = random(probe.shape(), /*seed=*/977, probe.dtype());
  const Run want = run(f, cpu_inputs, weight);
  const Run got = run(f, gpu_inputs, weight.to(kGpu));
  require_close(got.output, want.output, what + ": forward");
  for (size_t i = 0; i < cpu_inputs.size(); ++i)
    require_close(got.gradients[i], want.gradients[i], what + ": gradient of " + names[i]);
}

}  // namespace

TEST_CASE("CUDA 16-bit matmul matches the CPU for every transpose", "[cuda][half][matmul]") {
  TANDEM_REQUIRE_GPU();
  // Odd sizes (rows of odd byte length), and a long sum that invites split-K on the GPU.
  const std::vector<std::array<int64_t, 3>> sizes{{37, 29, 53}, {8, 16, 4096}, {1, 1, 1}};
  for (DType dtype : kHalfTypes) {
    for (const auto& [m, n, k] : sizes) {
      for (bool transpose_a : {false, true}) {
        for (bool transpose_b : {false, true}) {
          const std::string what = std::string(dtype_name(dtype)) + " m=" + std::to_string(m) +
                                   " n=" + std::to_string(n) + " k=" + std::to_string(k) +
                                   (transpose_a ? " A^T" : "") + (transpose_b ? " B^T" : "");
          const Tensor a = random(transpose_a ? Shape{k, m} : Shape{m, k}, /*seed=*/1, dtype);
          const Tensor b = random(transpose_b ? Shape{n, k} : Shape{k, n}, /*seed=*/2, dtype);
          const Tensor want = ops::matmul(a, b, transpose_a, transpose_b);
          const Tensor got = ops::matmul(a.to(kGpu), b.to(kGpu), transpose_a, transpose_b);
          require_close(got, want, what);
          // The CPU's 16-bit result is the float32 product rounded once.
          const Tensor f32 = ops::matmul(ops::cast(a, DType::kFloat32),
                                         ops::cast(b, DType::kFloat32), transpose_a, transpose_b);
          require_close(got, ops::cast(f32, dtype), what + " against float32");
        }
      }
    }
  }
}

TEST_CASE("CUDA 16-bit matmul backward matches the CPU", "[cuda][half][matmul]") {
  TANDEM_REQUIRE_GPU();
  for (DType dtype : kHalfTypes) {
    const auto f = [](const std::vector<Tensor>& in) { return ops::matmul(in[0], in[1]); };
    check_forward_backward(std::string(dtype_name(dtype)) + " matmul", f,
                           {random(Shape{19, 33}, 3, dtype), random(Shape{33, 21}, 4, dtype)},
                           {"a", "b"});
  }
}

TEST_CASE("CUDA 16-bit dense forward and backward match the CPU", "[cuda][half][dense]") {
  TANDEM_REQUIRE_GPU();
  for (DType dtype : kHalfTypes) {
    const Tensor x = random(Shape{45, 70}, 5, dtype), kernel = random(Shape{70, 34}, 6, dtype);
    const Tensor bias = random(Shape{34}, 7, dtype);
    for (FusedActivation activation : {FusedActivation::kRelu, FusedActivation::kLinear}) {
      const bool relu = activation == FusedActivation::kRelu;
      const std::string what =
          std::string(dtype_name(dtype)) + (relu ? " dense+bias+relu" : " dense+bias");
      check_forward_backward(what,
                             [activation](const std::vector<Tensor>& in) {
                               return ops::dense(in[0], in[1], in[2], activation);
                             },
                             {x, kernel, bias}, {"x", "kernel", "bias"});
      check_forward_backward(what + " (no bias)",
                             [activation](const std::vector<Tensor>& in) {
                               return ops::dense(in[0], in[1], Tensor(), activation);
                             },
                             {x, kernel}, {"x", "kernel"});
    }
  }
}

TEST_CASE("CUDA 16-bit dense with a misaligned bias still matches the CPU", "[cuda][half][dense]") {
  TANDEM_REQUIRE_GPU();
  // A bias starting 2 bytes into its storage: cuBLASLt may have no bias epilogue for it, and the
  // forward then runs in float32 scratch; either way the result is the CPU's.
  for (DType dtype : kHalfTypes) {
    const Tensor x = random(Shape{16, 24}, 8, dtype), kernel = random(Shape{24, 40}, 9, dtype);
    const Tensor storage = random(Shape{41}, 10, dtype);
    const Tensor want = ops::dense(x, kernel, storage.view_as(Shape{40}, dtype_size(dtype)),
                                   FusedActivation::kRelu);
    const Tensor gpu_storage = storage.to(kGpu);
    const Tensor got =
        ops::dense(x.to(kGpu), kernel.to(kGpu), gpu_storage.view_as(Shape{40}, dtype_size(dtype)),
                   FusedActivation::kRelu);
    require_close(got, want, std::string(dtype_name(dtype)) + " misaligned bias");
  }
}

TEST_CASE("CUDA 16-bit conv2d forward and backward match the CPU", "[cuda][half][conv]") {
  TANDEM_REQUIRE_GPU();
  struct Case {
    Shape x, kernel;
    std::array<int64_t, 2> strides;
    Padding padding;
  };
  const std::vector<Case> cases{{Shape{2, 9, 11, 3}, Shape{3, 3, 3, 8}, {1, 1}, Padding::kSame},
                                {Shape{3, 10, 8, 5}, Shape{3, 2, 5, 6}, {2, 2}, Padding::kValid},
                                {Shape{1, 7, 7, 4}, Shape{5, 5, 4, 3}, {2, 1}, Padding::kSame}};
  for (DType dtype : kHalfTypes) {
    for (size_t c = 0; c < cases.size(); ++c) {
      const Case& k = cases[c];
      const Tensor x = random(k.x, 11 + c, dtype), kernel = random(k.kernel, 21 + c, dtype);
      const Tensor bias = random(Shape{k.kernel[3]}, 31 + c, dtype);
      for (FusedActivation activation : {FusedActivation::kRelu, FusedActivation::kLinear}) {
        const std::string what = std::string(dtype_name(dtype)) + " conv2d case " +
                                 std::to_string(c) +
                                 (activation == FusedActivation::kRelu ? " relu" : " linear");
        check_forward_backward(what,
                               [&k, activation](const std::vector<Tensor>& in) {
                                 return ops::conv2d(in[0], in[1], in[2], k.strides, k.padding,
                                                    activation);
                               },
                               {x, kernel, bias}, {"x", "kernel", "bias"});
      }
    }
  }
}

TEST_CASE("CUDA optimizer updates take float32 gradients of 16-bit compute, as the CPU",
          "[cuda][half][optim]") {
  TANDEM_REQUIRE_GPU();
  // Under mixed precision the variables are float32 and their gradients come back float32 (the
  // gradient of the cast to the compute dtype): a dense layer in bfloat16 on each device, its
  // kernel's gradient through the cast, then one Adam step on each device.
  const Tensor x = random(Shape{12, 20}, 41, DType::kBFloat16);
  const Tensor w0 = ops::cast(random(Shape{20, 6}, 42, DType::kBFloat16), DType::kFloat32);
  const ops::AdamStep step{
      .alpha = 1e-2, .one_minus_beta_1 = 0.1, .one_minus_beta_2 = 1e-3, .epsilon = 1e-7};
  std::vector<Tensor> gradients;
  for (Device device : {Device::cpu(), kGpu}) {
    const Tensor w = w0.to(device);
    GradientTape tape;
    tape.watch(w);
    const Tensor y =
        ops::dense(x.to(device), ops::cast(w, DType::kBFloat16), Tensor(), FusedActivation::kRelu);
    gradients.push_back(
        tape.gradient(ops::sum(ops::cast(y, DType::kFloat32)), std::vector<Tensor>{w})[0]);
    REQUIRE(gradients.back().dtype() == DType::kFloat32);
  }
  // The float32 gradients hold the bfloat16 products' sums, rounded once on each device.
  const std::vector<double> g_cpu = gradients[0].to_vector<double>();
  const std::vector<double> g_gpu = gradients[1].to_vector<double>();
  double scale = 0.0;
  for (double g : g_cpu) scale = std::max(scale, std::abs(g));
  REQUIRE(scale > 0.0);
  for (size_t i = 0; i < g_cpu.size(); ++i) {
    INFO("gradient element " << i << ": CUDA " << g_gpu[i] << ", CPU " << g_cpu[i]);
    REQUIRE(std::abs(g_gpu[i] - g_cpu[i]) <= tolerance(DType::kBFloat16) * scale);
  }

  // The same float32 gradient on both devices: the fused update agrees to float32 rounding.
  std::vector<Tensor> updated;
  for (Device device : {Device::cpu(), kGpu}) {
    Tensor w = w0.to(device).clone();
    Tensor m = Tensor::zeros(w0.shape(), DType::kFloat32, device);
    Tensor v = Tensor::zeros(w0.shape(), DType::kFloat32, device);
    ops::adam_update_(w, gradients[0].to(device), m, v, step);
    updated.push_back(w);
    // A 16-bit gradient for a float32 variable is refused on both devices, naming both dtypes:
    // no CPU path passes one, so neither does the multi-tensor kernel take one.
    Tensor w2 = w0.to(device).clone();
    REQUIRE_THROWS_WITH(
        ops::adam_update_(w2, ops::cast(gradients[0].to(device), DType::kBFloat16), m, v, step),
        Catch::Contains("adam_update_") && Catch::Contains("bfloat16") &&
            Catch::Contains("float32"));
  }
  const std::vector<double> cpu = updated[0].to_vector<double>();
  const std::vector<double> gpu = updated[1].to_vector<double>();
  for (size_t i = 0; i < cpu.size(); ++i) {
    INFO("element " << i << ": CUDA " << gpu[i] << ", CPU " << cpu[i]);
    REQUIRE(std::abs(gpu[i] - cpu[i]) <= 1e-6 * std::max(1.0, std::abs(cpu[i])));
  }
}
