// Where an OpenMP team starts to pay on the CPU: per-call time of two elementwise loops (the
// in-place add that gradient accumulation runs, and the fused Adam update) on the calling thread
// against a team of every core, over sizes around ops/cpu/parallel.h's grains. Half the smallest
// size from which the team wins is the grain (elements per thread) parallel_for should use:
// kElementwiseGrain for the add, kHeavyElementwiseGrain for the optimizer updates.
#include <cstdio>
#include <vector>

#include "tandem/core/threading.h"
#include "tandem/ops/cpu/parallel.h"
#include "tandem/ops/kernels/optimizer_functors.h"
#include "timing.h"

namespace {

namespace td = tandem;
namespace cpu = tandem::ops::cpu;

struct Buffers {
  std::vector<float> w, g, m, v;
  explicit Buffers(int64_t n) : w(n, 0.5f), g(n, 0.01f), m(n, 0.0f), v(n, 0.0f) {}
};

void add_in_place(Buffers& b, int64_t grain) {
  float* w = b.w.data();
  const float* g = b.g.data();
  cpu::parallel_for(static_cast<int64_t>(b.w.size()), grain, [&](int64_t begin, int64_t end) {
#pragma omp simd
    for (int64_t i = begin; i < end; ++i) w[i] = w[i] + g[i];
  });
}

void adam(Buffers& b, int64_t grain) {
  const td::ops::kernels::AdamUpdate<float> f{.alpha = 1e-3f,
                                              .one_minus_beta_1 = 0.1f,
                                              .one_minus_beta_2 = 1e-3f,
                                              .epsilon = 1e-7f,
                                              .decay = false,
                                              .weight_decay = 0.0f,
                                              .learning_rate = 1e-3f};
  float *w = b.w.data(), *m = b.m.data(), *v = b.v.data();
  const float* g = b.g.data();
  cpu::parallel_for(static_cast<int64_t>(b.w.size()), grain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) f(w[i], g[i], m[i], v[i]);
  });
}

}  // namespace

int main(int argc, char** argv) {
  const td::bench::BackgroundLoad background;
  const int cores = td::hardware_cores();
  td::set_compute_threads(cores);
  std::printf("Elementwise loops on the calling thread against a team of %d threads (float32)\n",
              cores);
  std::printf(
      "median microseconds per call; team/inline < 1: the team pays; grains today: add %lld, "
      "adam %lld elements per thread\n\n",
      static_cast<long long>(cpu::kElementwiseGrain),
      static_cast<long long>(cpu::kHeavyElementwiseGrain));
  std::printf("%-10s  %10s %10s %12s  %10s %10s %12s\n", "elements", "add inline", "add team",
              "team/inline", "adam inline", "adam team", "team/inline");
  for (int64_t n = 1024; n <= (int64_t{1} << 20); n *= 2) {
    Buffers a(n), b(n);
    const int64_t never = n + 1, always = 1;
    const std::vector<double> t = td::bench::median_seconds_per_call(
        {[&] { add_in_place(a, never); }, [&] { add_in_place(a, always); }, [&] { adam(b, never); },
         [&] { adam(b, always); }},
        {.warmup_seconds = 0.05, .batch_seconds = 0.005, .samples = 21});
    std::printf("%-10lld  %10.2f %10.2f %12.2f  %10.2f %10.2f %12.2f\n", static_cast<long long>(n),
                t[0] * 1e6, t[1] * 1e6, t[1] / t[0], t[2] * 1e6, t[3] * 1e6, t[3] / t[2]);
    std::fflush(stdout);
  }
  std::printf("\nother processes kept %.2f cores busy during the run\n", background.cores());
  std::printf("reproduce: %s\n",
              td::bench::reproduce_command(TANDEM_BINARY_DIR, argc, argv).c_str());
  return 0;
}
