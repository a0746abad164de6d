// Tests of the tensor layer: factories, element access, views, printing, the caching CPU
// allocator and the Philox generator.
#include <catch2/catch.hpp>
#include <cmath>
#include <set>

#include "tandem/tandem.h"
#include "tandem/tensor/philox.h"

using namespace tandem;

TEST_CASE("factories fill shape, dtype and values", "[cpu][tensor]") {
  Tensor z = Tensor::zeros({2, 3});
  CHECK(z.shape() == Shape{2, 3});
  CHECK(z.dtype() == DType::kFloat32);
  CHECK(z.device() == Device::cpu());
  CHECK(z.to_vector<float>() == std::vector<float>(6, 0.0f));
  CHECK(Tensor::ones({4}, DType::kInt32).to_vector<int>() == std::vector<int>{1, 1, 1, 1});
  CHECK(Tensor::full({2}, 2.5, DType::kFloat64).to_vector<double>() ==
        std::vector<double>{2.5, 2.5});
  CHECK(Tensor::arange(5).to_vector<int64_t>() == std::vector<int64_t>{0, 1, 2, 3, 4});
  CHECK(Tensor::scalar(3.0).rank() == 0);
  CHECK(Tensor::scalar(3.0).item<float>() == 3.0f);
  Tensor v = Tensor::from_vector<float>({1, 2, 3, 4, 5, 6}, {3, 2});
  CHECK(v.data<float>()[5] == 6.0f);
  CHECK_THROWS_WITH(v.item<float>(), Catch::Contains("exactly one element, shape is [3, 2]"));
  CHECK_THROWS_WITH(v.data<double>(), Catch::Contains("holds float32, not float64"));
  CHECK_THROWS_WITH(Tensor::from_vector<float>({1, 2, 3}, {2, 2}),
                    Catch::Contains("3 values do not fill shape [2, 2]"));
  CHECK(Tensor::from_vector<bool>({true, false}).to_vector<int>() == std::vector<int>{1, 0});
}

TEST_CASE("Tensor::empty raises, naming the shape, when its bytes overflow", "[cpu][tensor]") {
  const int64_t two61 = int64_t{1} << 61;
  // 2^61 float32 elements are 2^63 bytes: more than int64 (and size_t arithmetic would wrap).
  CHECK_THROWS_WITH(Tensor::empty(Shape{two61}, DType::kFloat32),
                    Catch::Contains("shape [" + std::to_string(two61) + "]"));
  CHECK_THROWS_WITH(Tensor::empty(Shape{2, -3}), Catch::Contains("negative dimension"));
  CHECK(Tensor::empty(Shape{3, 0}).numel() == 0);
}

TEST_CASE("copies alias, clone and to() copy", "[cpu][tensor]") {
  Tensor a = Tensor::zeros({3});
  Tensor alias = a;
  alias.data<float>()[1] = 5.0f;
  CHECK(a.to_vector<float>()[1] == 5.0f);
  CHECK(alias.id() == a.id());
  Tensor deep = a.clone();
  deep.data<float>()[1] = 7.0f;
  CHECK(a.to_vector<float>()[1] == 5.0f);
  CHECK(a.to(Device::cpu()).id() == a.id());
  Tensor b = Tensor::zeros({3});
  b.copy_from(a);
  CHECK(b.to_vector<float>() == a.to_vector<float>());
  CHECK_THROWS_WITH(b.copy_from(Tensor::zeros({4})), Catch::Contains("[4]"));
}

TEST_CASE("views share storage", "[cpu][tensor]") {
  Tensor a = Tensor::from_vector<float>({0, 1, 2, 3, 4, 5}, {3, 2});
  Tensor row = a.view_as({2}, 2 * sizeof(float));
  CHECK(row.to_vector<float>() == std::vector<float>{2, 3});
  row.data<float>()[0] = 9.0f;
  CHECK(a.to_vector<float>()[2] == 9.0f);
  CHECK_THROWS_WITH(a.view_as({7}), Catch::Contains("does not fit"));
}

TEST_CASE("printing shows shape, dtype, device and values", "[cpu][tensor]") {
  Tensor a = Tensor::from_vector<float>({1, 2, 3, 4}, {2, 2});
  const std::string text = a.to_string();
  CHECK_THAT(text, Catch::Contains("shape=[2, 2]"));
  CHECK_THAT(text, Catch::Contains("dtype=float32"));
  CHECK_THAT(text, Catch::Contains("device=cpu:0"));
  CHECK_THAT(text, Catch::Contains("[[1, 2],"));
  CHECK_THAT(Tensor::zeros({1000}).to_string(8), Catch::Contains("..."));
  CHECK(Tensor().to_string() == "Tensor(undefined)");
}

TEST_CASE("the CPU allocator is 64-byte aligned and reuses freed blocks", "[cpu][tensor]") {
  Allocator& alloc = cpu_allocator();
  for (size_t n : {1, 63, 64, 65, 1000, 4096 + 7, (1 << 20) + 3}) {
    void* p = alloc.allocate(n);
    CHECK(reinterpret_cast<uintptr_t>(p) % 64 == 0);
    alloc.deallocate(p, n);
  }
  CHECK(cpu_size_class(65) == 128);
  CHECK(cpu_size_class((1 << 20) + 1) == 2 * (1 << 20));

  // A "step" that allocates and frees the same sizes: after the first round the system
  // allocator is never called again.
  auto step = [] {
    Tensor x = Tensor::ones({64, 784});
    Tensor h = Tensor::zeros({64, 256});
    Tensor y = Tensor::zeros({64, 10});
    return x.numel() + h.numel() + y.numel();
  };
  step();
  const AllocatorStats before = alloc.stats();
  for (int i = 0; i < 100; ++i) step();
  const AllocatorStats after = alloc.stats();
  CHECK(after.system_allocs == before.system_allocs);
  CHECK(after.requests - before.requests == 300);
  CHECK(after.cache_hits - before.cache_hits == 300);
}

TEST_CASE("Philox4x32-10 matches the Random123 known-answer vectors", "[cpu][tensor]") {
  // Known-answer tests from Random123 (kat_vectors): philox4x32 R=10.
  philox::Block zero = philox::philox4x32_10(0, 0, 0, 0, 0, 0);
  CHECK(zero.v[0] == 0x6627e8d5u);
  CHECK(zero.v[1] == 0xe169c58du);
  CHECK(zero.v[2] == 0xbc57ac4cu);
  CHECK(zero.v[3] == 0x9b00dbd8u);
  philox::Block ones = philox::philox4x32_10(0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu,
                                             0xffffffffu, 0xffffffffu);
  CHECK(ones.v[0] == 0x408f276du);
  CHECK(ones.v[1] == 0x41c83b0eu);
  CHECK(ones.v[2] == 0xa20bc7c6u);
  CHECK(ones.v[3] == 0x6d5451fdu);
  philox::Block pi = philox::philox4x32_10(0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u,
                                           0xa4093822u, 0x299f31d0u);
  CHECK(pi.v[0] == 0xd16cfe09u);
  CHECK(pi.v[1] == 0x94fdccebu);
  CHECK(pi.v[2] == 0x5001e420u);
  CHECK(pi.v[3] == 0x24126ea1u);
}

TEST_CASE("generators are reproducible per (seed, stream) and independent across streams",
          "[cpu][tensor]") {
  Generator a(42, 0), b(42, 0), c(42, 1), d(43, 0);
  const auto va = Tensor::uniform({1000}, a).to_vector<float>();
  const auto vb = Tensor::uniform({1000}, b).to_vector<float>();
  const auto vc = Tensor::uniform({1000}, c).to_vector<float>();
  const auto vd = Tensor::uniform({1000}, d).to_vector<float>();
  CHECK(va == vb);
  CHECK(va != vc);
  CHECK(va != vd);
  CHECK(a.offset() == 250);  // four floats per block
  // Successive draws differ, and saving/restoring the state replays them.
  const auto state = a.state();
  const auto next1 = Tensor::normal({17}, a).to_vector<float>();
  a.set_state(state);
  const auto next2 = Tensor::normal({17}, a).to_vector<float>();
  CHECK(next1 == next2);
  CHECK(Tensor::uniform({4}, a).to_vector<float>() != Tensor::uniform({4}, a).to_vector<float>());
}

TEST_CASE("uniform and normal have the requested moments", "[cpu][tensor]") {
  Generator g(7, 3);
  const int n = 200000;
  for (DType dt : {DType::kFloat32, DType::kFloat64}) {
    auto u = Tensor::uniform({n}, g, -2.0, 4.0, dt).to_vector<double>();
    double mean = 0, lo = 1e9, hi = -1e9;
    for (double x : u) mean += x, lo = std::min(lo, x), hi = std::max(hi, x);
    mean /= n;
    CHECK(mean == Approx(1.0).margin(0.03));
    CHECK(lo >= -2.0);
    CHECK(hi < 4.0);
    auto z = Tensor::normal({n}, g, 1.0, 3.0, dt).to_vector<double>();
    double m = 0, var = 0;
    for (double x : z) m += x;
    m /= n;
    for (double x : z) var += (x - m) * (x - m);
    var /= n;
    CHECK(m == Approx(1.0).margin(0.03));
    CHECK(std::sqrt(var) == Approx(3.0).margin(0.03));
  }
  std::set<uint64_t> seen;
  for (int i = 0; i < 1000; ++i) seen.insert(g.uniform_int(10));
  CHECK(seen.size() == 10);
}
