// bfloat16 against float32 on the CPU: ops::dense (forward, bias and ReLU fused) and the two
// GEMMs of its backward (ops::matmul with transposes), at the large MLP's layer shapes and at
// 1024^3, on all compute threads. Both dtypes run the same ops with the same shapes; the table
// gives GFLOP/s per dtype (medians, interleaved samples) and bfloat16's speed-up.
#include <algorithm>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "tandem/core/threading.h"
#include "tandem/ops/ops.h"
#include "tandem/tensor/random.h"
#include "tandem/tensor/tensor.h"
#include "timing.h"

namespace {

namespace td = tandem;

struct Case {
  std::string name;
  int64_t m, n, k;
  int kind;  // 0: dense forward y = relu(x W + b); 1: dX = dY W^T; 2: dW = X^T dY
};

std::vector<Case> cases() {
  std::vector<Case> all;
  // The large MLP 784 -> 1024 -> 1024 -> 10 at batch 256, and one square GEMM.
  const int64_t layers[][2] = {{784, 1024}, {1024, 1024}, {1024, 10}};
  for (const auto& layer : layers) {
    const int64_t in = layer[0], out = layer[1];
    const std::string dense = "B=256 " + std::to_string(in) + "->" + std::to_string(out) + " ";
    all.push_back({dense + "forward", 256, out, in, 0});
    all.push_back({dense + "dX=dY W^T", 256, in, out, 1});
    all.push_back({dense + "dW=X^T dY", in, out, 256, 2});
  }
  all.push_back({"square 1024^3 forward", 1024, 1024, 1024, 0});
  return all;
}

/// The call of `c` in `dtype`, its operands made once.
std::function<void()> make_call(const Case& c, td::DType dtype, td::Generator& gen) {
  const auto make = [&](td::Shape shape) {
    return td::ops::cast(td::Tensor::uniform(shape, gen, -1, 1), dtype);
  };
  if (c.kind == 0) {
    const td::Tensor x = make({c.m, c.k}), w = make({c.k, c.n}), b = make({c.n});
    return [x, w, b] { (void)td::ops::dense(x, w, b, td::ops::FusedActivation::kRelu); };
  }
  if (c.kind == 1) {  // dY [m, k] W [n, k]^T
    const td::Tensor dy = make({c.m, c.k}), w = make({c.n, c.k});
    return [dy, w] { (void)td::ops::matmul(dy, w, false, true); };
  }
  const td::Tensor x = make({c.k, c.m}), dy = make({c.k, c.n});  // X [k, m]^T dY [k, n]
  return [x, dy] { (void)td::ops::matmul(x, dy, true, false); };
}

}  // namespace

int main(int argc, char** argv) {
  td::bench::BackgroundLoad load;
  td::Generator gen(1);
  std::printf("bfloat16 vs float32 on the CPU, %d compute threads (GFLOP/s, medians)\n\n",
              td::compute_threads());
  std::printf("%-30s %10s %10s %9s\n", "case", "float32", "bfloat16", "bf16/f32");
  std::vector<double> ratios;
  for (const Case& c : cases()) {
    const std::vector<double> s = td::bench::median_seconds_per_call(
        {make_call(c, td::DType::kFloat32, gen), make_call(c, td::DType::kBFloat16, gen)});
    const double flops =
        2.0 * static_cast<double>(c.m) * static_cast<double>(c.n) * static_cast<double>(c.k);
    std::printf("%-30s %10.1f %10.1f %8.2fx\n", c.name.c_str(), flops / s[0] * 1e-9,
                flops / s[1] * 1e-9, s[0] / s[1]);
    ratios.push_back(s[0] / s[1]);
  }
  std::sort(ratios.begin(), ratios.end());
  std::printf("\nmedian speed-up of bfloat16 over float32: %.2fx\n", ratios[ratios.size() / 2]);
  std::printf("background load: %.2f cores (above ~0.1, distrust the timings)\n", load.cores());
  std::printf("reproduce: %s\n",
              td::bench::reproduce_command(TANDEM_BINARY_DIR, argc, argv).c_str());
  return 0;
}
