// Training-step time on one GPU: the sample MLP 784-256-128-10 (batch 64 and 256) and a large
// MLP 784-4096x4-10 (batch 1024), float32, forward + backward + SGD or Adam through Tandem's ops
// and optimizers; and the step's GEMMs through ops::matmul against a cuBLAS-only loop.
// bench/gpu_step_torch.py prints the same step table for PyTorch eager on the same GPU.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tandem/optim/adam.h"
#include "tandem/optim/sgd.h"
#include "tandem/tandem.h"
#include "tandem/tensor/device_runtime.h"
#include "timing.h"

// The cuBLAS-only baseline calls cuBLAS directly; bench/CMakeLists.txt defines this macro (and
// links CUDA::cublas) only when CUDA is built.
#ifdef TANDEM_BENCH_CUBLAS
#include <cublas_v2.h>
#include <cuda_runtime.h>
#endif

namespace {

namespace td = tandem;

constexpr int kWarmupSteps = 10;
constexpr int kTimedSteps = 60;  // the median is over these (the issue asks for >= 50)
constexpr double kGemmTarget = 0.85;

struct Config {
  std::string model;
  std::vector<int64_t> widths;  // input, hidden..., classes
  int64_t batch;
};

std::vector<Config> configs() {
  const std::vector<int64_t> sample = {784, 256, 128, 10};
  const std::vector<int64_t> large = {784, 4096, 4096, 4096, 4096, 10};
  return {{"mlp 784-256-128-10", sample, 64},
          {"mlp 784-256-128-10", sample, 256},
          {"mlp 784-4096x4-10", large, 1024}};
}

/// Dense layers y = x W + b with ReLU between them (nn::Dense's math), Glorot-uniform kernels
/// and zero biases, as variables on `device`.
struct Mlp {
  std::vector<td::Variable> kernels, biases, all;
  /// The compute dtype: float32, or bfloat16 (mixed_bfloat16: float32 variables cast to
  /// bfloat16 where they are read, so their gradients come back float32).
  td::DType compute = td::DType::kFloat32;

  Mlp(const std::vector<int64_t>& widths, td::Device device) {
    td::Generator generator(/*seed=*/42);
    for (size_t l = 0; l + 1 < widths.size(); ++l) {
      const int64_t in = widths[l], out = widths[l + 1];
      const double limit = std::sqrt(6.0 / static_cast<double>(in + out));
      kernels.emplace_back(td::detail::str_cat("dense_", l, "/kernel"),
                           td::Tensor::uniform({in, out}, generator, -limit, limit).to(device));
      biases.emplace_back(td::detail::str_cat("dense_", l, "/bias"),
                          td::Tensor::zeros({out}, td::DType::kFloat32, device));
      all.push_back(kernels.back());
      all.push_back(biases.back());
    }
  }

  td::Tensor forward(const td::Tensor& x) const {
    const auto read = [&](const td::Tensor& t) {
      return compute == t.dtype() ? t : td::ops::cast(t, compute);
    };
    td::Tensor h = read(x);
    for (size_t l = 0; l < kernels.size(); ++l) {
      h = td::ops::add(td::ops::matmul(h, read(kernels[l].value())), read(biases[l].value()));
      if (l + 1 < kernels.size()) h = td::ops::relu(h);
    }
    // The loss on float32 logits, as Keras's mixed policies compute it.
    return h.dtype() == td::DType::kFloat32 ? h : td::ops::cast(h, td::DType::kFloat32);
  }
};

struct StepTimes {
  double median_ms, p90_ms, pipelined_ms;
};

/// Per-step times with CUDA events around each step (each stop waits for the step), and the
/// mean of the same number of steps queued back to back with one wait at the end.
StepTimes time_steps(const std::function<void()>& step, td::Device device) {
  for (int i = 0; i < kWarmupSteps; ++i) step();
  td::synchronize(device);
  td::DeviceTimer timer(device);
  std::vector<double> ms;
  for (int i = 0; i < kTimedSteps; ++i) {
    timer.start();
    step();
    ms.push_back(timer.stop());
  }
  timer.start();
  for (int i = 0; i < kTimedSteps; ++i) step();
  const double pipelined = timer.stop() / kTimedSteps;
  std::sort(ms.begin(), ms.end());
  return {ms[ms.size() / 2], ms[ms.size() * 9 / 10], pipelined};
}

struct Gemm {
  bool transpose_a, transpose_b;
  int64_t m, n, k;
};

/// The GEMMs of one training step: per layer the forward Y = X W and the backward
/// dX = dY W^T and dW = X^T dY (the tape computes dX for the first layer too).
std::vector<Gemm> step_gemms(const Config& c) {
  std::vector<Gemm> gemms;
  for (size_t l = 0; l + 1 < c.widths.size(); ++l) {
    const int64_t in = c.widths[l], out = c.widths[l + 1];
    gemms.push_back({false, false, c.batch, out, in});
    gemms.push_back({false, true, c.batch, in, out});
    gemms.push_back({true, false, in, out, c.batch});
  }
  return gemms;
}

double gemm_flops(const std::vector<Gemm>& gemms) {
  double flops = 0;
  for (const Gemm& g : gemms) flops += 2.0 * static_cast<double>(g.m * g.n * g.k);
  return flops;
}

constexpr int kGemmRounds = 20;  // one sample runs the step's GEMM list this many times
constexpr int kGemmSamples = 7;  // median over samples

/// Milliseconds for one pass over `gemms` through ops::matmul (dispatch, output allocation
/// from the caching allocator, cuBLAS), median over samples.
double tandem_gemm_ms(const std::vector<Gemm>& gemms, td::Device device) {
  td::Generator generator(/*seed=*/7);
  std::vector<td::Tensor> a, b;
  for (const Gemm& g : gemms) {
    a.push_back(td::Tensor::uniform(g.transpose_a ? td::Shape{g.k, g.m} : td::Shape{g.m, g.k},
                                    generator, -1, 1)
                    .to(device));
    b.push_back(td::Tensor::uniform(g.transpose_b ? td::Shape{g.n, g.k} : td::Shape{g.k, g.n},
                                    generator, -1, 1)
                    .to(device));
  }
  auto pass = [&] {
    for (size_t i = 0; i < gemms.size(); ++i)
      td::ops::matmul(a[i], b[i], gemms[i].transpose_a, gemms[i].transpose_b);
  };
  for (int i = 0; i < 3; ++i) pass();
  td::DeviceTimer timer(device);
  std::vector<double> samples;
  for (int s = 0; s < kGemmSamples; ++s) {
    timer.start();
    for (int r = 0; r < kGemmRounds; ++r) pass();
    samples.push_back(timer.stop() / kGemmRounds);
  }
  std::sort(samples.begin(), samples.end());
  return samples[samples.size() / 2];
}

/// Median milliseconds per call of `fn` (queued back to back, CUDA events around a batch).
double op_ms(const std::function<void()>& fn, td::Device device) {
  for (int i = 0; i < 3; ++i) fn();
  td::DeviceTimer timer(device);
  std::vector<double> samples;
  for (int s = 0; s < kGemmSamples; ++s) {
    timer.start();
    for (int r = 0; r < kGemmRounds; ++r) fn();
    samples.push_back(timer.stop() / kGemmRounds);
  }
  std::sort(samples.begin(), samples.end());
  return samples[samples.size() / 2];
}

/// Memory-bound ops in GB/s (bytes read + written) against a device-to-device copy of the same
/// tensor: how close the kernels run to memory bandwidth. 256 MiB per tensor, so neither the
/// L2 cache (50 MiB on an H100) nor the host's launch cost flatters the figures.
void print_memory_bound_ops(td::Device device) {
  const int64_t rows = 8192, cols = 8192;
  td::Generator generator(/*seed=*/3);
  const td::Tensor x = td::Tensor::uniform({rows, cols}, generator, -1, 1).to(device);
  const td::Tensor y = td::Tensor::uniform({rows, cols}, generator, -1, 1).to(device);
  const td::Tensor bias = td::Tensor::uniform({cols}, generator, -1, 1).to(device);
  td::Tensor accumulator = x.clone();
  const double n = static_cast<double>(rows * cols) * sizeof(float);
  const double row = static_cast<double>(cols) * sizeof(float);
  struct Op {
    const char* name;
    double bytes;
    std::function<void()> run;
  };
  const std::vector<Op> ops = {
      {"clone (device copy)", 2 * n, [&] { x.clone(); }},
      {"add, same shape", 3 * n, [&] { td::ops::add(x, y); }},
      {"add bias [cols]", 2 * n + row, [&] { td::ops::add(x, bias); }},
      {"relu", 2 * n, [&] { td::ops::relu(x); }},
      {"mul by scalar", 2 * n, [&] { td::ops::mul(x, 0.5); }},
      {"add_ in place", 3 * n, [&] { td::ops::add_(accumulator, y, 1e-3); }},
      {"sum over axis 0", n + row, [&] { td::ops::sum(x, 0); }},
      {"softmax rows", 2 * n, [&] { td::ops::softmax(x); }},
  };
  std::printf("\nMemory-bound ops on [%lld, %lld] float32, %d calls per sample, median of %d\n\n",
              static_cast<long long>(rows), static_cast<long long>(cols), kGemmRounds,
              kGemmSamples);
  std::printf("%-22s %10s %9s %8s %8s\n", "op", "MB/call", "us/call", "GB/s", "of_copy");
  double copy_gbs = 0;
  for (const Op& op : ops) {
    const double ms = op_ms(op.run, device);
    const double gbs = op.bytes / (ms * 1e-3) * 1e-9;
    if (copy_gbs == 0) copy_gbs = gbs;
    std::printf("%-22s %10.1f %9.1f %8.0f %8.2f\n", op.name, op.bytes * 1e-6, ms * 1e3, gbs,
                gbs / copy_gbs);
    std::fflush(stdout);
  }
}

#ifdef TANDEM_BENCH_CUBLAS
#define BENCH_CHECK(x)                                             \
  do {                                                             \
    if ((x) != 0) TANDEM_THROW("bench_gpu_step: ", #x, " failed"); \
  } while (0)

/// The same pass with cublasSgemm alone on preallocated buffers (full float32 math, or TF32
/// when Tandem allows it, so both sides do the same arithmetic).
double cublas_gemm_ms(const std::vector<Gemm>& gemms) {
  cudaStream_t stream = nullptr;
  cublasHandle_t handle = nullptr;
  BENCH_CHECK(cudaStreamCreate(&stream));
  BENCH_CHECK(cublasCreate(&handle));
  BENCH_CHECK(cublasSetStream(handle, stream));
  BENCH_CHECK(cublasSetMathMode(
      handle, td::cuda::allow_tf32() ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH));
  std::vector<float*> buffers;
  auto device_buffer = [&](int64_t elements) {
    float* p = nullptr;
    BENCH_CHECK(cudaMalloc(&p, static_cast<size_t>(elements) * sizeof(float)));
    BENCH_CHECK(cudaMemset(p, 0, static_cast<size_t>(elements) * sizeof(float)));
    buffers.push_back(p);
    return p;
  };
  struct Operands {
    float *a, *b, *c;
  };
  std::vector<Operands> operands;
  for (const Gemm& g : gemms)
    operands.push_back(
        {device_buffer(g.m * g.k), device_buffer(g.k * g.n), device_buffer(g.m * g.n)});
  const float one = 1.0f, zero = 0.0f;
  auto pass = [&] {
    for (size_t i = 0; i < gemms.size(); ++i) {
      const Gemm& g = gemms[i];
      // Row-major C = op(A) op(B) as column-major C^T = op(B)^T op(A)^T (as ops::cuda::gemm).
      const int lda = static_cast<int>(g.transpose_a ? g.m : g.k);
      const int ldb = static_cast<int>(g.transpose_b ? g.k : g.n);
      BENCH_CHECK(cublasSgemm(handle, g.transpose_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                              g.transpose_a ? CUBLAS_OP_T : CUBLAS_OP_N, static_cast<int>(g.n),
                              static_cast<int>(g.m), static_cast<int>(g.k), &one, operands[i].b,
                              ldb, operands[i].a, lda, &zero, operands[i].c,
                              static_cast<int>(g.n)));
    }
  };
  for (int i = 0; i < 3; ++i) pass();
  cudaEvent_t start = nullptr, stop = nullptr;
  BENCH_CHECK(cudaEventCreate(&start));
  BENCH_CHECK(cudaEventCreate(&stop));
  std::vector<double> samples;
  for (int s = 0; s < kGemmSamples; ++s) {
    BENCH_CHECK(cudaEventRecord(start, stream));
    for (int r = 0; r < kGemmRounds; ++r) pass();
    BENCH_CHECK(cudaEventRecord(stop, stream));
    BENCH_CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    BENCH_CHECK(cudaEventElapsedTime(&ms, start, stop));
    samples.push_back(ms / kGemmRounds);
  }
  BENCH_CHECK(cudaEventDestroy(start));
  BENCH_CHECK(cudaEventDestroy(stop));
  for (float* p : buffers) BENCH_CHECK(cudaFree(p));
  BENCH_CHECK(cublasDestroy(handle));
  BENCH_CHECK(cudaStreamDestroy(stream));
  std::sort(samples.begin(), samples.end());
  return samples[samples.size() / 2];
}
#endif

}  // namespace

int main(int argc, char** argv) {
  td::DType compute = td::DType::kFloat32;
  if (argc == 3 && std::string(argv[1]) == "--precision" &&
      (std::string(argv[2]) == "float32" || std::string(argv[2]) == "mixed_bfloat16")) {
    if (std::string(argv[2]) == "mixed_bfloat16") compute = td::DType::kBFloat16;
  } else if (argc != 1) {
    std::fprintf(stderr, "usage: bench_gpu_step [--precision float32|mixed_bfloat16]\n");
    return 2;
  }
  if (td::cuda_device_count() == 0) {
    std::printf("no GPU: %s\n", td::cuda_availability().reason.c_str());
    return 0;
  }
  const td::Device device = td::Device::cuda(0);
  const td::CudaDeviceInfo& info = td::cuda_availability().devices[0];
  std::printf("Tandem training step on %s (%s), %s, TF32 %s, median of %d steps after %d\n",
              device.to_string().c_str(), info.name.c_str(),
              compute == td::DType::kFloat32 ? "float32" : "mixed_bfloat16",
              td::cuda::allow_tf32() ? "on" : "off", kTimedSteps, kWarmupSteps);
  std::printf(
      "step = forward + sparse softmax cross-entropy (mean) + backward + optimizer update;"
      " pipelined = mean of %d steps queued back to back\n\n",
      kTimedSteps);
  std::printf("%-22s %6s %-9s %10s %10s %13s %9s\n", "model", "batch", "optimizer", "median_ms",
              "p90_ms", "pipelined_ms", "steps/s");

  for (const Config& c : configs()) {
    for (const std::string optimizer_name : {"sgd", "adam"}) {
      Mlp mlp(c.widths, device);
      mlp.compute = compute;
      td::Generator generator(/*seed=*/1);
      const td::Tensor features =
          td::Tensor::uniform({c.batch, c.widths.front()}, generator, 0, 1).to(device);
      const td::Tensor labels =
          td::ops::cast(td::Tensor::uniform({c.batch}, generator, 0, 10, td::DType::kFloat64),
                        td::DType::kInt64)
              .to(device);
      std::unique_ptr<td::optim::Optimizer> optimizer;
      if (optimizer_name == "sgd")
        optimizer =
            std::make_unique<td::optim::SGD>(td::optim::SGD::Options{.learning_rate = 0.01});
      else
        optimizer =
            std::make_unique<td::optim::Adam>(td::optim::Adam::Options{.learning_rate = 1e-3});
      auto step = [&] {
        td::GradientTape tape;
        const td::Tensor logits = mlp.forward(features);
        const td::Tensor loss =
            td::ops::mean(td::ops::sparse_softmax_cross_entropy(logits, labels));
        const std::vector<td::Tensor> grads = tape.gradient(loss, mlp.all);
        optimizer->apply_gradients(grads, mlp.all);
      };
      const StepTimes t = time_steps(step, device);
      std::printf("%-22s %6lld %-9s %10.3f %10.3f %13.3f %9.0f\n", c.model.c_str(),
                  static_cast<long long>(c.batch), optimizer_name.c_str(), t.median_ms, t.p90_ms,
                  t.pipelined_ms, 1000.0 / t.median_ms);
      std::fflush(stdout);
    }
  }

  std::printf(
      "\nGEMMs of one step (per layer Y=XW, dX=dY W^T, dW=X^T dY), %d passes per sample,"
      " median of %d; target tandem/cublas >= %.2f\n\n",
      kGemmRounds, kGemmSamples, kGemmTarget);
  std::printf("%-22s %6s %6s %11s %15s %15s %7s\n", "model", "batch", "gemms", "GFLOP/step",
              "tandem_TFLOP/s", "cublas_TFLOP/s", "ratio");
  for (const Config& c : configs()) {
    const std::vector<Gemm> gemms = step_gemms(c);
    const double flops = gemm_flops(gemms);
    const double tandem_tflops = flops / (tandem_gemm_ms(gemms, device) * 1e-3) * 1e-12;
#ifdef TANDEM_BENCH_CUBLAS
    const double cublas_tflops = flops / (cublas_gemm_ms(gemms) * 1e-3) * 1e-12;
    const double ratio = tandem_tflops / cublas_tflops;
    std::printf("%-22s %6lld %6zu %11.3f %15.2f %15.2f %7.3f %s\n", c.model.c_str(),
                static_cast<long long>(c.batch), gemms.size(), flops * 1e-9, tandem_tflops,
                cublas_tflops, ratio, ratio >= kGemmTarget ? "ok" : "LOW");
#else
    std::printf("%-22s %6lld %6zu %11.3f %15.2f %15s %7s\n", c.model.c_str(),
                static_cast<long long>(c.batch), gemms.size(), flops * 1e-9, tandem_tflops,
                "(not built)", "-");
#endif
    std::fflush(stdout);
  }
  print_memory_bound_ops(device);
  std::printf("\ncompare: python3 bench/gpu_step_torch.py (PyTorch eager, same models and table)");
  std::printf("\nreproduce: %s\n",
              td::bench::reproduce_command(TANDEM_BINARY_DIR, argc, argv).c_str());
  return 0;
}
