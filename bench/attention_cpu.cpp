// Attention forward + backward on the CPU for sequence lengths 256 to 4,096: the fused
// ops::scaled_dot_product_attention against the same attention composed of ops (matmul, the
// causal mask as -inf, softmax, matmul), float32, causal, batch 1 x 4 heads x depth 64. For each
// it prints the time of one forward and backward (median of 5, after one warm-up) and the peak
// memory the call added to the process (each measurement runs in a fresh process of this
// program: its peak resident set, reset just before the call, minus the resident set before it).
// The fused op's memory grows linearly with the length, the composition's with its square.
// Then the times of both at the GPT sample's shapes (batch 12: 4 heads of 32 over 64 tokens,
// the default recipe; 6 heads of 64 over 256 tokens, the larger one), median of 21.
//
//   build-dev/bench/bench_attention_cpu [--max-length N]
#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "tandem/autograd/tape.h"
#include "tandem/ops/ops.h"
#include "tandem/tensor/random.h"
#include "tandem/tensor/tensor.h"
#include "timing.h"

extern char** environ;

namespace {

namespace td = tandem;

constexpr int64_t kHeads = 4, kDepth = 64;

/// A field of /proc/self/status in KiB (VmRSS, VmHWM).
int64_t status_kib(const char* field) {
  std::ifstream status("/proc/self/status");
  std::string line;
  const size_t n = std::strlen(field);
  while (std::getline(status, line))
    if (line.compare(0, n, field) == 0 && line[n] == ':') return std::stoll(line.substr(n + 1));
  return -1;
}

td::Tensor composed(const td::Tensor& q, const td::Tensor& k, const td::Tensor& v) {
  const int64_t t = q.dim(-2);
  std::vector<uint8_t> lower(static_cast<size_t>(t * t));
  for (int64_t i = 0; i < t; ++i)
    for (int64_t j = 0; j <= i; ++j) lower[static_cast<size_t>(i * t + j)] = 1;
  const td::Tensor visible =
      td::ops::cast(td::Tensor::from_vector<uint8_t>(lower, td::Shape{t, t}), td::DType::kBool);
  td::Tensor scores =
      td::ops::mul(td::ops::matmul(q, k, false, true), 1.0 / std::sqrt(double(q.dim(-1))));
  scores = td::ops::where(visible, scores, td::Tensor::full({}, -INFINITY));
  return td::ops::matmul(td::ops::softmax(scores, -1), v);
}

/// One forward and backward of `variant` at length t; returns seconds.
double step(const std::string& variant, const td::Tensor& q, const td::Tensor& k,
            const td::Tensor& v, const td::Tensor& weight) {
  const double start = tandem::bench::now_seconds();
  td::GradientTape tape;
  for (const td::Tensor* x : {&q, &k, &v}) tape.watch(*x);
  const td::Tensor out = variant == "fused"
                             ? td::ops::scaled_dot_product_attention(q, k, v, {.causal = true})
                             : composed(q, k, v);
  const std::vector<td::Tensor> grads =
      tape.gradient(td::ops::sum(td::ops::mul(out, weight)), {q, k, v});
  (void)grads[0].data<float>();
  return tandem::bench::now_seconds() - start;
}

/// The child: prints "<peak KiB added> <median seconds>".
int measure(const std::string& variant, int64_t t) {
  td::Generator generator(7);
  const td::Shape shape{1, kHeads, t, kDepth};
  const td::Tensor q = td::Tensor::uniform(shape, generator, -1, 1);
  const td::Tensor k = td::Tensor::uniform(shape, generator, -1, 1);
  const td::Tensor v = td::Tensor::uniform(shape, generator, -1, 1);
  const td::Tensor weight = td::Tensor::uniform(shape, generator, -1, 1);
  // The peak of the first call, from the resident set before it (then the timing runs).
  const int64_t before = status_kib("VmRSS");
  {
    std::ofstream reset("/proc/self/clear_refs");
    reset << "5";  // resets VmHWM to the current resident set
  }
  step(variant, q, k, v, weight);
  const int64_t peak = status_kib("VmHWM") - before;
  std::vector<double> seconds;
  for (int i = 0; i < 5; ++i) seconds.push_back(step(variant, q, k, v, weight));
  std::sort(seconds.begin(), seconds.end());
  std::printf("%lld %.6f\n", static_cast<long long>(peak), seconds[2]);
  return 0;
}

/// Median seconds of one forward and backward of `variant` on [batch, heads, t, depth].
double time_shape(const std::string& variant, int64_t batch, int64_t heads, int64_t t,
                  int64_t depth) {
  td::Generator generator(9);
  const td::Shape shape{batch, heads, t, depth};
  const td::Tensor q = td::Tensor::uniform(shape, generator, -1, 1);
  const td::Tensor k = td::Tensor::uniform(shape, generator, -1, 1);
  const td::Tensor v = td::Tensor::uniform(shape, generator, -1, 1);
  const td::Tensor weight = td::Tensor::uniform(shape, generator, -1, 1);
  for (int i = 0; i < 3; ++i) step(variant, q, k, v, weight);
  std::vector<double> seconds;
  for (int i = 0; i < 21; ++i) seconds.push_back(step(variant, q, k, v, weight));
  std::sort(seconds.begin(), seconds.end());
  return seconds[10];
}

/// Runs this program as a child measuring one case; false when it failed.
bool run_child(const char* self, const std::string& variant, int64_t t, int64_t& peak_kib,
               double& seconds) {
  const std::string out_path = "/tmp/bench_attention_" + std::to_string(::getpid()) + ".txt";
  const std::string length = std::to_string(t);
  const char* argv[] = {self, "--child", variant.c_str(), length.c_str(), nullptr};
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC,
                                   0644);
  pid_t pid = 0;
  const int error =
      posix_spawn(&pid, self, &actions, nullptr, const_cast<char* const*>(argv), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (error != 0) return false;
  int status = 0;
  ::waitpid(pid, &status, 0);
  std::ifstream result(out_path);
  const bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0 &&
                  static_cast<bool>(result >> peak_kib >> seconds);
  std::remove(out_path.c_str());
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 4 && std::string(argv[1]) == "--child") return measure(argv[2], std::stoll(argv[3]));
  int64_t max_length = 4096;
  if (argc == 3 && std::string(argv[1]) == "--max-length") max_length = std::stoll(argv[2]);
  std::printf("attention forward + backward, float32, causal, [1, %lld heads, T, %lld]\n",
              static_cast<long long>(kHeads), static_cast<long long>(kDepth));
  std::printf("%6s | %12s %12s %14s | %12s %12s %14s\n", "T", "fused ms", "fused MiB",
              "fused KiB/T", "composed ms", "composed MiB", "composed KiB/T");
  for (int64_t t = 256; t <= max_length; t *= 2) {
    int64_t fused_kib = 0, composed_kib = 0;
    double fused_s = 0, composed_s = 0;
    const bool fused_ok = run_child(argv[0], "fused", t, fused_kib, fused_s);
    const bool composed_ok = run_child(argv[0], "composed", t, composed_kib, composed_s);
    auto cell = [](bool ok, double value, const char* format) {
      char text[32];
      if (!ok) return std::string("failed");
      std::snprintf(text, sizeof text, format, value);
      return std::string(text);
    };
    std::printf("%6lld | %12s %12s %14s | %12s %12s %14s\n", static_cast<long long>(t),
                cell(fused_ok, fused_s * 1e3, "%.2f").c_str(),
                cell(fused_ok, fused_kib / 1024.0, "%.1f").c_str(),
                cell(fused_ok, double(fused_kib) / double(t), "%.1f").c_str(),
                cell(composed_ok, composed_s * 1e3, "%.2f").c_str(),
                cell(composed_ok, composed_kib / 1024.0, "%.1f").c_str(),
                cell(composed_ok, double(composed_kib) / double(t), "%.1f").c_str());
    std::fflush(stdout);
  }
  std::printf("KiB/T constant: memory linear in T; doubling with T: quadratic.\n\n");
  std::printf("at the GPT sample's shapes [batch, heads, T, depth], forward + backward:\n");
  std::printf("%-20s | %10s %12s %8s\n", "shape", "fused ms", "composed ms", "ratio");
  struct Shape4 {
    int64_t batch, heads, t, depth;
  };
  for (const Shape4& s : {Shape4{12, 4, 64, 32}, Shape4{12, 6, 256, 64}}) {
    const double fused = time_shape("fused", s.batch, s.heads, s.t, s.depth);
    const double composed = time_shape("composed", s.batch, s.heads, s.t, s.depth);
    char name[32];
    std::snprintf(name, sizeof name, "[%lld, %lld, %lld, %lld]", static_cast<long long>(s.batch),
                  static_cast<long long>(s.heads), static_cast<long long>(s.t),
                  static_cast<long long>(s.depth));
    std::printf("%-20s | %10.3f %12.3f %8.2f\n", name, fused * 1e3, composed * 1e3,
                composed / fused);
  }
  std::printf("ratio: composed time / fused time (above 1: the fused op is faster).\n");
  std::printf("reproduce: bench_attention_cpu [--max-length N]\n");
  return 0;
}
