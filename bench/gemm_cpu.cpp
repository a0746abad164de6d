// GEMM throughput on CPU: tandem::ops::matmul and ops::cpu::gemm against dnnl_sgemm called
// directly, at 1024^3 and at the Fashion-MNIST MLP's forward and backward shapes, 1 and 2 threads.
#include <dnnl.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "tandem/core/error.h"
#include "tandem/core/threading.h"
#include "tandem/ops/cpu/nn_kernels.h"
#include "tandem/ops/ops.h"
#include "tandem/tensor/tensor.h"
#include "timing.h"

namespace {

namespace td = tandem;

constexpr double kTargetRatio = 0.95;

struct GemmShape {
  std::string name;
  bool transpose_a, transpose_b;
  int64_t m, n, k;
};

/// 1024^3, then per batch size each Dense layer's (and the large MLP's at batch 256) forward Y = X
/// W ([B, in] x [in, out]) and its backward dX = dY W^T and dW = X^T dY.
std::vector<GemmShape> shapes() {
  std::vector<GemmShape> all = {{"square 1024^3", false, false, 1024, 1024, 1024}};
  const int64_t layers[][2] = {{784, 256}, {256, 128}, {128, 10}};
  for (const int64_t batch : {64, 256}) {
    for (const auto& layer : layers) {
      const int64_t in = layer[0], out = layer[1];
      const std::string dense = "B=" + std::to_string(batch) + " " + std::to_string(in) + "->" +
                                std::to_string(out) + " ";
      all.push_back({dense + "Y=XW", false, false, batch, out, in});
      all.push_back({dense + "dX=dY W^T", false, true, batch, in, out});
      all.push_back({dense + "dW=X^T dY", true, false, in, out, batch});
    }
  }
  // The large MLP (784-1024x2-10) at batch 256, whose step is almost all GEMM.
  const int64_t large[][2] = {{784, 1024}, {1024, 1024}, {1024, 10}};
  for (const auto& layer : large) {
    const int64_t in = layer[0], out = layer[1];
    const std::string dense = "B=256 " + std::to_string(in) + "->" + std::to_string(out) + " ";
    all.push_back({dense + "Y=XW", false, false, 256, out, in});
    all.push_back({dense + "dX=dY W^T", false, true, 256, in, out});
    all.push_back({dense + "dW=X^T dY", true, false, in, out, 256});
  }
  return all;
}

struct Row {
  GemmShape shape;
  int threads;
  std::vector<td::bench::Timing> seconds;  // matmul, cpu::gemm, direct

  double flops() const {
    return 2.0 * static_cast<double>(shape.m) * static_cast<double>(shape.n) *
           static_cast<double>(shape.k);
  }
  double gflops(size_t contender) const { return flops() / seconds[contender].median * 1e-9; }
  /// Throughput of `contender` over the direct call's, from medians or from best samples.
  double ratio(size_t contender, bool best) const {
    return best ? seconds[2].best / seconds[contender].best
                : seconds[2].median / seconds[contender].median;
  }
};

Row measure(const GemmShape& s, int threads) {
  td::Generator generator(/*seed=*/1);
  const td::Tensor a = td::Tensor::uniform(
      s.transpose_a ? td::Shape{s.k, s.m} : td::Shape{s.m, s.k}, generator, -1.0, 1.0);
  const td::Tensor b = td::Tensor::uniform(
      s.transpose_b ? td::Shape{s.n, s.k} : td::Shape{s.k, s.n}, generator, -1.0, 1.0);
  td::Tensor c_gemm = td::Tensor::empty({s.m, s.n});
  td::Tensor c_direct = td::Tensor::empty({s.m, s.n});
  const int64_t lda = s.transpose_a ? s.m : s.k;
  const int64_t ldb = s.transpose_b ? s.k : s.n;
  const float* a_data = a.data<float>();
  const float* b_data = b.data<float>();

  td::Tensor c_matmul;
  auto run_matmul = [&] { c_matmul = td::ops::matmul(a, b, s.transpose_a, s.transpose_b); };
  auto run_gemm = [&] {
    td::ops::cpu::gemm(s.transpose_a, s.transpose_b, s.m, s.n, s.k, 1.0f, a_data, lda, b_data, ldb,
                       0.0f, c_gemm.data<float>(), s.n);
  };
  auto run_direct = [&] {
    const dnnl_status_t status =
        dnnl_sgemm(s.transpose_a ? 'T' : 'N', s.transpose_b ? 'T' : 'N', s.m, s.n, s.k, 1.0f,
                   a_data, lda, b_data, ldb, 0.0f, c_direct.data<float>(), s.n);
    TANDEM_CHECK(status == dnnl_success, "dnnl_sgemm failed for ", s.name);
  };

  td::set_compute_threads(threads);  // Tandem's per-thread budget (sets OpenMP's ICV)
  omp_set_num_threads(threads);      // what a direct oneDNN user would do
  const std::vector<td::bench::Timing> seconds =
      td::bench::seconds_per_call({run_matmul, run_gemm, run_direct},
                                  {.warmup_seconds = 0.05, .batch_seconds = 0.003, .samples = 25});

  // The contenders must compute the same product, or the comparison means nothing.
  const std::vector<float> expected = c_direct.to_vector<float>();
  for (const td::Tensor& c : {c_matmul, c_gemm}) {
    const std::vector<float> got = c.to_vector<float>();
    for (size_t i = 0; i < got.size(); ++i) {
      if (std::abs(got[i] - expected[i]) > 1e-3f * (1.0f + std::abs(expected[i]))) {
        TANDEM_THROW("bench_gemm_cpu: results differ for ", s.name, " at ", i, ": ", got[i],
                     " vs dnnl_sgemm ", expected[i]);
      }
    }
  }
  return {s, threads, seconds};
}

}  // namespace

int main(int argc, char** argv) {
  const td::bench::BackgroundLoad background;
  std::printf(
      "GEMM float32 on CPU: Tandem vs dnnl_sgemm called directly (oneDNN %d.%d.%d, %d cores)\n",
      dnnl_version()->major, dnnl_version()->minor, dnnl_version()->patch, td::hardware_cores());
  std::printf(
      "GFLOP/s = 2 M N K / median time per call. ratio = Tandem / direct throughput (target >= "
      "%.2f),\nfrom medians (med) and from the best of the samples (best; robust when other "
      "processes interfere)\n\n",
      kTargetRatio);
  std::printf("%-3s  %-26s %5s %5s %5s  %7s %7s %7s   %-16s  %-16s\n", "thr", "shape", "M", "N",
              "K", "matmul", "gemm", "direct", "matmul/direct", "cpu::gemm/direct");
  std::printf("%-3s  %-26s %5s %5s %5s  %7s %7s %7s   %-7s %-7s   %-7s %-7s\n", "", "", "", "", "",
              "GFLOP/s", "GFLOP/s", "GFLOP/s", "med", "best", "med", "best");
  auto verdict = [](double ratio) { return ratio >= kTargetRatio ? ' ' : '!'; };
  std::vector<Row> rows;
  for (const int threads : {1, 2}) {
    for (const GemmShape& s : shapes()) {
      const Row r = measure(s, threads);
      rows.push_back(r);
      std::printf(
          "%-3d  %-26s %5lld %5lld %5lld  %7.1f %7.1f %7.1f   %5.3f%c  %5.3f%c   %5.3f%c  "
          "%5.3f%c\n",
          threads, s.name.c_str(), static_cast<long long>(s.m), static_cast<long long>(s.n),
          static_cast<long long>(s.k), r.gflops(0), r.gflops(1), r.gflops(2), r.ratio(0, false),
          verdict(r.ratio(0, false)), r.ratio(0, true), verdict(r.ratio(0, true)),
          r.ratio(1, false), verdict(r.ratio(1, false)), r.ratio(1, true),
          verdict(r.ratio(1, true)));
      std::fflush(stdout);
    }
  }
  std::printf("\n('!' marks a ratio below the target)\n");
  for (const int threads : {1, 2}) {
    for (const bool best : {false, true}) {
      double log_sum = 0, worst = 1e9;
      int count = 0;
      for (const Row& r : rows) {
        if (r.threads != threads) continue;
        log_sum += std::log(r.ratio(0, best));
        worst = std::min(worst, r.ratio(0, best));
        ++count;
      }
      std::printf("%d thread(s), matmul/direct from %-7s geometric mean %.3f, worst %.3f\n",
                  threads, best ? "best:" : "medians:", std::exp(log_sum / count), worst);
    }
  }
  std::printf("\nother processes kept %.2f cores busy during the run\n", background.cores());
  std::printf("reproduce: %s\n",
              td::bench::reproduce_command(TANDEM_BINARY_DIR, argc, argv).c_str());
  return 0;
}
