// oneDNN splits a GEMM, matmul or convolution for omp_get_max_threads() threads; OpenMP gives a
// team no larger than its thread limit (OMP_THREAD_LIMIT). Tandem lowers the calling thread's
// count to that limit first, so every output element is written. CTest also runs this file's
// test with OMP_THREAD_LIMIT=1 (tests/CMakeLists.txt), where a split for two threads would leave
// half the output as whatever the memory held before.
#include <omp.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <vector>

#include "tandem/tandem.h"

namespace td = tandem;
namespace ops = tandem::ops;

namespace {

/// x [m, k] times w [k, n] (+ bias, ReLU), summed in double.
std::vector<float> reference(const td::Tensor& x, const td::Tensor& w, const td::Tensor& bias,
                             bool relu) {
  const int64_t m = x.dim(0), k = x.dim(1), n = w.dim(1);
  const float* a = x.data<float>();
  const float* b = w.data<float>();
  std::vector<float> out(static_cast<size_t>(m * n));
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double sum = bias.defined() ? bias.data<float>()[j] : 0.0;
      for (int64_t p = 0; p < k; ++p) sum += static_cast<double>(a[i * k + p]) * b[p * n + j];
      out[static_cast<size_t>(i * n + j)] = static_cast<float>(relu ? std::max(sum, 0.0) : sum);
    }
  return out;
}

/// Whether `got` holds `want` everywhere (no NaN left from the poisoned memory).
bool close(const td::Tensor& got, const std::vector<float>& want) {
  const std::vector<float> g = got.to_vector<float>();
  if (g.size() != want.size()) return false;
  for (size_t i = 0; i < g.size(); ++i)
    if (!(std::abs(g[i] - want[i]) <= 1e-3f * (1.0f + std::abs(want[i])))) return false;
  return true;
}

/// Fills the allocator's cached block of this size with NaN, so that an output that reuses it
/// and is not written everywhere shows NaN.
void poison(const td::Shape& shape) {
  td::Tensor nan = td::Tensor::full(shape, NAN);
  (void)nan;
}

void check_products() {
  td::Generator g(11);
  for (const auto [m, k, n] : {std::array<int64_t, 3>{24, 300, 300}, {24, 8, 300}, {96, 64, 40}}) {
    const td::Tensor x = td::Tensor::normal({m, k}, g);
    const td::Tensor w = td::Tensor::normal({k, n}, g);
    const td::Tensor bias = td::Tensor::normal({n}, g);
    poison({m, n});
    CHECK(close(ops::matmul(x, w), reference(x, w, td::Tensor(), false)));
    poison({m, n});
    CHECK(close(ops::dense(x, w, bias, ops::FusedActivation::kRelu), reference(x, w, bias, true)));
  }
  // A convolution as a matmul: 1x1 filters over a [1, 16, 16, 32] image.
  const td::Tensor image = td::Tensor::normal({1, 16, 16, 32}, g);
  const td::Tensor filters = td::Tensor::normal({1, 1, 32, 48}, g);
  poison({1, 16, 16, 48});
  const td::Tensor conv = ops::conv2d(image, filters);
  CHECK(close(conv,
              reference(image.reshape({256, 32}), filters.reshape({32, 48}), td::Tensor(), false)));
}

}  // namespace

TEST_CASE("GEMMs, dense layers and convolutions write every output under OpenMP's thread limit",
          "[cpu][ops]") {
  INFO("omp_get_thread_limit() " << omp_get_thread_limit() << ", omp_get_max_threads() "
                                 << omp_get_max_threads());
  check_products();
  // On a replica thread too (its compute budget is set from the cores: all of them here).
  td::MirroredStrategy strategy = td::MirroredStrategy::cpu(1);
  strategy.run([&](td::ReplicaContext&) { check_products(); });
}
