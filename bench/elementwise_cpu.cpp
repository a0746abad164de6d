// Memory bandwidth of elementwise ops on CPU: tandem::ops::add and the in-place ops::add_ on
// large float32 buffers, against memcpy of the same buffer size, 1 and 2 threads.
#include <omp.h>

#include <cstdio>
#include <cstring>
#include <vector>

#include "tandem/core/error.h"
#include "tandem/core/threading.h"
#include "tandem/ops/ops.h"
#include "tandem/tensor/tensor.h"
#include "timing.h"

namespace {

namespace td = tandem;

constexpr double kTargetRatio = 0.7;

/// memcpy split across `threads` OpenMP threads: the bandwidth ceiling an elementwise op
/// with the same thread count can be held to.
void parallel_memcpy(float* dst, const float* src, int64_t n, int threads) {
#pragma omp parallel num_threads(threads)
  {
    const int64_t parts = omp_get_num_threads();
    const int64_t part = omp_get_thread_num();
    const int64_t begin = n * part / parts;
    const int64_t end = n * (part + 1) / parts;
    std::memcpy(dst + begin, src + begin, static_cast<size_t>(end - begin) * sizeof(float));
  }
}

struct Row {
  int64_t elements;
  int threads;
  std::vector<td::bench::Timing> seconds;  // add, add_, memcpy

  /// Bytes one call moves: add and add_ read two buffers and write one; memcpy reads one and
  /// writes one.
  double bytes(size_t contender) const {
    return (contender == 2 ? 2.0 : 3.0) * static_cast<double>(elements) * sizeof(float);
  }
  double gbs(size_t contender, bool best = false) const {
    const td::bench::Timing& t = seconds[contender];
    return bytes(contender) / (best ? t.best : t.median) * 1e-9;
  }
  /// Bandwidth of `contender` over memcpy's, from medians or from best samples.
  double ratio(size_t contender, bool best) const { return gbs(contender, best) / gbs(2, best); }
};

Row measure(int64_t n, int threads) {
  td::Generator generator(/*seed=*/1);
  const td::Tensor a = td::Tensor::uniform({n}, generator, -1.0, 1.0);
  const td::Tensor b = td::Tensor::uniform({n}, generator, -1.0, 1.0);
  td::Tensor accumulator = a.clone();
  td::Tensor copy = td::Tensor::zeros({n});
  td::Tensor sum;

  td::set_compute_threads(threads);
  const std::vector<td::bench::Timing> seconds = td::bench::seconds_per_call(
      {[&] { sum = td::ops::add(a, b); }, [&] { td::ops::add_(accumulator, b); },
       [&] { parallel_memcpy(copy.data<float>(), a.data<float>(), n, threads); }},
      {.warmup_seconds = 0.2, .batch_seconds = 0.02, .samples = 11});

  // A wrong result would make the bandwidth meaningless.
  const float* s = sum.data<float>();
  const float* x = a.data<float>();
  const float* y = b.data<float>();
  for (int64_t i = 0; i < n; i += 4099) {
    TANDEM_CHECK(s[i] == x[i] + y[i], "bench_elementwise_cpu: add is wrong at ", i);
  }
  return {n, threads, seconds};
}

}  // namespace

int main(int argc, char** argv) {
  const td::bench::BackgroundLoad background;
  std::printf("Elementwise float32 bandwidth on CPU (%d cores)\n", td::hardware_cores());
  std::printf(
      "GB/s from the median time per call: add/add_ move 3 buffers (read a, read b, write out),\n"
      "memcpy 2 (read, write). ratio = op GB/s / memcpy GB/s (target >= %.2f), from medians\n"
      "(med) and from the best of the samples (best; robust when other processes interfere)\n\n",
      kTargetRatio);
  std::printf("%-3s  %9s %7s  %7s %7s %7s   %-14s  %-14s\n", "thr", "elements", "MiB/buf", "add",
              "add_", "memcpy", "add/memcpy", "add_/memcpy");
  std::printf("%-3s  %9s %7s  %7s %7s %7s   %-6s %-6s   %-6s %-6s\n", "", "", "", "GB/s", "GB/s",
              "GB/s", "med", "best", "med", "best");
  auto verdict = [](double ratio) { return ratio >= kTargetRatio ? ' ' : '!'; };
  for (const int threads : {1, 2}) {
    for (const int64_t n : {int64_t{4} << 20, int64_t{16} << 20, int64_t{64} << 20}) {
      const Row r = measure(n, threads);
      std::printf("%-3d  %9lld %7.0f  %7.2f %7.2f %7.2f   %5.2f%c %5.2f%c   %5.2f%c %5.2f%c\n",
                  threads, static_cast<long long>(n), n * sizeof(float) / 1048576.0, r.gbs(0),
                  r.gbs(1), r.gbs(2), r.ratio(0, false), verdict(r.ratio(0, false)),
                  r.ratio(0, true), verdict(r.ratio(0, true)), r.ratio(1, false),
                  verdict(r.ratio(1, false)), r.ratio(1, true), verdict(r.ratio(1, true)));
      std::fflush(stdout);
    }
  }
  std::printf("\n('!' marks a ratio below the target)\n");
  std::printf("\nother processes kept %.2f cores busy during the run\n", background.cores());
  std::printf("reproduce: %s\n",
              td::bench::reproduce_command(TANDEM_BINARY_DIR, argc, argv).c_str());
  return 0;
}
