// Time of one optimizer update of the sample MLP's variables (784-256-128-10, float32) on CPU:
// the fused updates of ops/optimizer_updates.h against the same update written with separate
// ops (one temporary tensor per op), for SGD with momentum and Adam, 1 and 2 threads.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include "tandem/core/error.h"
#include "tandem/core/threading.h"
#include "tandem/ops/ops.h"
#include "tandem/ops/optimizer_updates.h"
#include "tandem/tensor/random.h"
#include "tandem/tensor/tensor.h"
#include "timing.h"

namespace {

namespace td = tandem;
namespace ops = tandem::ops;

constexpr double kLearningRate = 1e-3;
constexpr double kMomentum = 0.9;

/// One model's worth of tensors: variables, gradients and two slots each.
struct State {
  std::vector<td::Tensor> w, g, m, v;
  State clone() const {
    State s;
    for (size_t i = 0; i < w.size(); ++i) {
      s.w.push_back(w[i].clone());
      s.g.push_back(g[i]);
      s.m.push_back(m[i].clone());
      s.v.push_back(v[i].clone());
    }
    return s;
  }
};

State mlp_state() {
  const std::vector<td::Shape> shapes{{784, 256}, {256}, {256, 128}, {128}, {128, 10}, {10}};
  td::Generator generator(/*seed=*/1);
  State s;
  for (const td::Shape& shape : shapes) {
    s.w.push_back(td::Tensor::uniform(shape, generator, -0.1, 0.1));
    s.g.push_back(td::Tensor::uniform(shape, generator, -0.01, 0.01));
    s.m.push_back(td::Tensor::zeros(shape));
    s.v.push_back(td::Tensor::zeros(shape));
  }
  return s;
}

// The separate-ops forms (what the optimizers ran before the fused updates).
void separate_sgd_momentum(State& s) {
  for (size_t i = 0; i < s.w.size(); ++i) {
    const td::Tensor scaled = ops::mul(s.g[i], kLearningRate);
    s.m[i].copy_from(ops::sub(ops::mul(s.m[i], kMomentum), scaled));
    ops::add_(s.w[i], s.m[i]);
  }
}

const ops::AdamStep kAdam{
    .alpha = 1e-3, .one_minus_beta_1 = 0.1, .one_minus_beta_2 = 1e-3, .epsilon = 1e-7};

void separate_adam(State& s) {
  for (size_t i = 0; i < s.w.size(); ++i) {
    ops::add_(s.m[i], ops::mul(ops::sub(s.g[i], s.m[i]), kAdam.one_minus_beta_1));
    ops::add_(s.v[i], ops::mul(ops::sub(ops::square(s.g[i]), s.v[i]), kAdam.one_minus_beta_2));
    ops::add_(s.w[i],
              ops::div(ops::mul(s.m[i], kAdam.alpha), ops::add(ops::sqrt(s.v[i]), kAdam.epsilon)),
              -1.0);
  }
}

void fused_sgd_momentum(State& s) {
  for (size_t i = 0; i < s.w.size(); ++i)
    ops::sgd_momentum_update_(s.w[i], s.g[i], s.m[i], kLearningRate, kMomentum, false);
}

void fused_adam(State& s) {
  for (size_t i = 0; i < s.w.size(); ++i) ops::adam_update_(s.w[i], s.g[i], s.m[i], s.v[i], kAdam);
}

bool same_bytes(const std::vector<td::Tensor>& a, const std::vector<td::Tensor>& b) {
  for (size_t i = 0; i < a.size(); ++i)
    if (std::memcmp(a[i].raw_data(), b[i].raw_data(), a[i].nbytes()) != 0) return false;
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  const td::bench::BackgroundLoad background;
  std::printf(
      "One optimizer update of the sample MLP (235,146 float32 parameters) on CPU (%d cores)\n",
      td::hardware_cores());
  std::printf("median (best) microseconds per update of all 6 variables; speedup from medians\n\n");
  std::printf("%-3s  %-13s  %17s  %17s  %7s\n", "thr", "optimizer", "separate ops", "fused",
              "speedup");
  const State initial = mlp_state();
  for (const int threads : {1, 2}) {
    td::set_compute_threads(threads);
    for (const bool adam : {false, true}) {
      State separate = initial.clone(), fused = initial.clone();
      // Equal results first: a fast wrong update would mean nothing.
      for (int step = 0; step < 3; ++step) {
        adam ? separate_adam(separate) : separate_sgd_momentum(separate);
        adam ? fused_adam(fused) : fused_sgd_momentum(fused);
      }
      TANDEM_CHECK(same_bytes(separate.w, fused.w) && same_bytes(separate.m, fused.m) &&
                       same_bytes(separate.v, fused.v),
                   "bench_optimizer_update_cpu: the fused update differs from the separate ops");
      const std::vector<td::bench::Timing> t = td::bench::seconds_per_call(
          {[&] { adam ? separate_adam(separate) : separate_sgd_momentum(separate); },
           [&] { adam ? fused_adam(fused) : fused_sgd_momentum(fused); }},
          {.warmup_seconds = 0.1, .batch_seconds = 0.01, .samples = 21});
      std::printf("%-3d  %-13s  %8.1f (%6.1f)  %8.1f (%6.1f)  %6.2fx\n", threads,
                  adam ? "Adam" : "SGD momentum", t[0].median * 1e6, t[0].best * 1e6,
                  t[1].median * 1e6, t[1].best * 1e6, t[0].median / t[1].median);
      std::fflush(stdout);
    }
  }
  std::printf("\nother processes kept %.2f cores busy during the run\n", background.cores());
  std::printf("reproduce: %s\n",
              td::bench::reproduce_command(TANDEM_BINARY_DIR, argc, argv).c_str());
  return 0;
}
