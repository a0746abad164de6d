// Tandem's dispatched CPU loops (ops/cpu/cpu_dispatch.h) are built for AVX-512, AVX2 and the
// baseline: every build this CPU can run gives the same bits, for GELU and its gradient,
// attention's exponentials, the 16-bit conversions, batch norm and the fused optimizer updates.
#include <catch2/catch.hpp>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "ops/ops_testing.h"
#include "tandem/core/internal/cpu_loop_isa.h"
#include "tandem/ops/kernels/optimizer_functors.h"
#include "tandem/ops/optimizer_updates.h"

using namespace tandem;
using tandem::testing::random_tensor;

namespace {

/// The raw bytes of a tensor (bitwise comparison, NaN payloads and signed zeros included).
std::vector<uint8_t> bytes(const Tensor& t) {
  std::vector<uint8_t> out(static_cast<size_t>(t.nbytes()));
  std::memcpy(out.data(), t.raw_data(), out.size());
  return out;
}

/// Every output of the dispatched loops on fixed inputs, computed at the current loop class.
std::vector<std::vector<uint8_t>> outputs() {
  std::vector<std::vector<uint8_t>> out;
  // GELU and its gradient: odd lengths leave each build's tail loop some work.
  const Tensor x = random_tensor({3, 1001}, 21, DType::kFloat32, -9, 9);
  GradientTape tape;
  tape.watch(x);
  const Tensor y = ops::gelu(x);
  out.push_back(bytes(y));
  out.push_back(bytes(tape.gradient(y * 0.75, x)));
  // Attention (its rows' exponentials), causal, 70 keys: a full and a partial tile.
  const Tensor q = random_tensor({2, 70, 16}, 22, DType::kFloat32, -3, 3);
  const Tensor k = random_tensor({2, 70, 16}, 23, DType::kFloat32, -3, 3);
  const Tensor v = random_tensor({2, 70, 16}, 24, DType::kFloat32);
  out.push_back(bytes(ops::scaled_dot_product_attention(q, k, v, {.causal = true})));
  // The 16-bit conversions, both ways.
  for (const DType half : {DType::kBFloat16, DType::kFloat16}) {
    const Tensor narrow = ops::cast(x, half);
    out.push_back(bytes(narrow));
    out.push_back(bytes(ops::cast(narrow, DType::kFloat32)));
  }
  // Batch norm forward and backward with its ReLU, 37 channels (a vector tile and a rest).
  const Tensor features = random_tensor({70, 37}, 25, DType::kFloat32, -2, 3);
  const Tensor gamma = random_tensor({37}, 26, DType::kFloat32, 0.5, 1.5);
  const Tensor beta = random_tensor({37}, 27, DType::kFloat32);
  GradientTape bn_tape;
  for (const Tensor* t : {&features, &gamma, &beta}) bn_tape.watch(*t);
  Tensor mean, variance;
  const Tensor normalized =
      ops::batch_norm(features, gamma, beta, 1e-3, mean, variance, /*relu=*/true);
  out.push_back(bytes(normalized));
  for (const Tensor& g : bn_tape.gradient(normalized * 0.5, {features, gamma, beta}))
    out.push_back(bytes(g));
  // Adam (AdamW's decay too) and SGD with momentum, in place.
  Tensor w = random_tensor({1001}, 28, DType::kFloat32);
  Tensor m = random_tensor({1001}, 29, DType::kFloat32, -0.1, 0.1);
  Tensor s = random_tensor({1001}, 30, DType::kFloat32, 0.0, 0.01);
  const Tensor g = random_tensor({1001}, 31, DType::kFloat32);
  ops::adam_update_(w, g, m, s,
                    {.alpha = 1e-3,
                     .one_minus_beta_1 = 0.1,
                     .one_minus_beta_2 = 0.001,
                     .epsilon = 1e-7,
                     .weight_decay = 0.1,
                     .learning_rate = 1e-3});
  Tensor velocity = random_tensor({1001}, 32, DType::kFloat32, -0.1, 0.1);
  ops::sgd_momentum_update_(w, g, velocity, 0.01, 0.9, /*nesterov=*/true);
  ops::sgd_update_(w, g, 0.01);
  // Lion (with its decay) through the generic entry point.
  Tensor lion_m = random_tensor({1001}, 33, DType::kFloat32, -0.1, 0.1);
  const ops::kernels::LionUpdate<float> lion{.learning_rate = 1e-3f,
                                             .beta_1 = 0.9f,
                                             .one_minus_beta_1 = 1.0f - 0.9f,
                                             .beta_2 = 0.99f,
                                             .one_minus_beta_2 = 1.0f - 0.99f,
                                             .decay = true,
                                             .weight_decay = 0.1f};
  const ops::kernels::LionUpdate<double> unused{};
  const std::span<Tensor> lion_slots[] = {std::span<Tensor>(&lion_m, 1)};
  const char* const lion_names[] = {"slot m"};
  ops::fused_update_<ops::kernels::LionUpdate>("lion", std::span<Tensor>(&w, 1),
                                               std::span<const Tensor>(&g, 1), lion_slots,
                                               lion_names, lion, unused);
  for (const Tensor* t : {&w, &m, &s, &velocity, &lion_m}) out.push_back(bytes(*t));
  return out;
}

}  // namespace

TEST_CASE("every build of the dispatched CPU loops gives the same bits", "[cpu][ops]") {
  std::vector<CpuIsa> builds{CpuIsa::kBaseline};
  if (cpu_isa() >= CpuIsa::kAvx2) builds.push_back(CpuIsa::kAvx2);
  if (cpu_isa() >= CpuIsa::kAvx512Core) builds.push_back(CpuIsa::kAvx512Core);
  std::vector<std::vector<uint8_t>> reference;
  {
    const detail::LoopIsaOverride baseline(CpuIsa::kBaseline);
    REQUIRE(detail::cpu_loop_isa() == CpuIsa::kBaseline);
    reference = outputs();
  }
  REQUIRE(detail::cpu_loop_isa() == cpu_isa());  // the override ended
  for (const CpuIsa isa : builds) {
    const detail::LoopIsaOverride build(isa);
    const std::vector<std::vector<uint8_t>> got = outputs();
    REQUIRE(got.size() == reference.size());
    for (size_t i = 0; i < got.size(); ++i) {
      INFO("build " << cpu_isa_name(isa) << ", output " << i);
      CHECK(got[i] == reference[i]);
    }
  }
}
