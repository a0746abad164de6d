// [cuda] tests of the comparison, logical and selection ops: greater, greater_equal, less,
// less_equal, not_equal, equal, logical_and, logical_or, logical_not and where on cuda:0, each
// against the CPU result bit for bit (the same shared functors run on both devices), in every
// dtype and under broadcasting, with NaN among the inputs; outputs poisoned first, so an element
// a kernel fails to write shows up. where's gradients too, and the errors for inputs on
// different devices. Without a GPU each test WARNs why it was skipped and passes.
#include <catch2/catch.hpp>
#include <cmath>
#include <functional>
#include <limits>
#include <vector>

#include "support/require_gpu.h"
#include "tandem/tandem.h"

namespace {

using namespace tandem;

const Device kGpu = Device::cuda(0);

const DType kEveryDType[] = {DType::kFloat32, DType::kFloat64, DType::kInt32,    DType::kInt64,
                             DType::kUInt8,   DType::kBool,    DType::kBFloat16, DType::kFloat16};

/// Values with many ties on the CPU (Philox: the same on every run): integers in [0, 4) as
/// `dtype` (bool: 0 and 1), plus, for the floating types, NaN in about one element in eight and
/// an infinity now and then.
Tensor tied(const Shape& shape, uint64_t seed, DType dtype) {
  Generator generator(seed);
  const Tensor u = Tensor::uniform(shape, generator, 0.0, 4.0, DType::kFloat64);
  Tensor v = ops::cast(ops::cast(u, DType::kInt32), DType::kFloat64);
  if (is_floating(dtype)) {
    const Tensor fraction = ops::sub(u, v);  // in [0, 1)
    v = ops::where(ops::less(fraction, 0.125),
                   Tensor::scalar(std::numeric_limits<double>::quiet_NaN(), DType::kFloat64), v);
    v = ops::where(ops::greater(fraction, 0.95),
                   Tensor::scalar(-std::numeric_limits<double>::infinity(), DType::kFloat64), v);
  }
  if (dtype == DType::kBool) v = ops::greater(v, 1.5);
  return ops::cast(v, dtype);
}

/// Uniform in [-1, 1) as float32 or float64, on the CPU.
Tensor uniform(const Shape& shape, uint64_t seed, DType dtype) {
  Generator generator(seed);
  return Tensor::uniform(shape, generator, -1.0, 1.0, dtype);
}

/// Fills the CUDA allocator's free lists for the byte size of every `like` tensor with blocks of
/// 0xFF bytes, so an output drawn from the cache starts as garbage (bool 255, NaN, -1) and any
/// element a kernel leaves unwritten breaks the bitwise comparison.
void poison_outputs(const std::vector<Tensor>& like) {
  constexpr int kBlocksPerSize = 8;
  std::vector<Tensor> held;
  for (const Tensor& t : like) {
    if (!t.defined() || t.nbytes() == 0) continue;
    const int64_t words = static_cast<int64_t>((t.nbytes() + 3) / 4);
    for (int i = 0; i < kBlocksPerSize; ++i)
      held.push_back(Tensor::full({words}, -1.0, DType::kInt32, kGpu));
  }
}

/// Requires the CUDA result to equal the CPU's bit for bit: same shape and dtype, same bytes.
void require_bitwise(const Tensor& gpu, const Tensor& cpu, const char* what) {
  INFO(what);
  REQUIRE(gpu.defined() == cpu.defined());
  if (!cpu.defined()) return;
  REQUIRE(gpu.device() == kGpu);
  REQUIRE(gpu.shape() == cpu.shape());
  REQUIRE(gpu.dtype() == cpu.dtype());
  const Tensor host = gpu.to(Device::cpu());
  REQUIRE(host.nbytes() == cpu.nbytes());
  const auto* g = static_cast<const unsigned char*>(host.raw_data());
  const auto* c = static_cast<const unsigned char*>(cpu.raw_data());
  for (size_t i = 0; i < cpu.nbytes(); ++i) {
    if (g[i] != c[i]) {
      FAIL_CHECK("byte " << i << " of " << cpu.nbytes() << " (shape " << cpu.shape() << ", "
                         << cpu.dtype() << "): CUDA " << int(g[i]) << ", CPU " << int(c[i]));
      return;
    }
  }
}

using OpFn = std::function<Tensor(const std::vector<Tensor>&)>;

/// f on the CPU inputs and on their GPU copies, the outputs required equal bit for bit.
void check_bitwise(const char* name, const OpFn& f, const std::vector<Tensor>& cpu_inputs) {
  INFO("op " << name);
  std::vector<Tensor> gpu_inputs;
  for (const Tensor& x : cpu_inputs) gpu_inputs.push_back(x.to(kGpu));
  const Tensor expected = f(cpu_inputs);
  poison_outputs({expected});
  require_bitwise(f(gpu_inputs), expected, "forward");
}

struct Comparison {
  const char* name;
  Tensor (*op)(const Tensor&, const Tensor&);
  Tensor (*scalar_op)(const Tensor&, double);
};

const Comparison kComparisons[] = {
    {"equal", ops::equal, ops::equal},
    {"not_equal", ops::not_equal, ops::not_equal},
    {"greater", ops::greater, ops::greater},
    {"greater_equal", ops::greater_equal, ops::greater_equal},
    {"less", ops::less, ops::less},
    {"less_equal", ops::less_equal, ops::less_equal},
    {"logical_and", ops::logical_and, nullptr},
    {"logical_or", ops::logical_or, nullptr},
};

/// Pairs of shapes for every broadcasting path of the kernels: one flat run, a scalar operand,
/// a broadcast row or column, both operands broadcast, many collapsed dimensions, and a tensor
/// large enough for the grid-stride loops to go round.
const std::pair<Shape, Shape> kShapes[] = {{{4, 5, 6}, {4, 5, 6}},
                                           {{4, 5, 6}, {5, 1}},
                                           {{3, 1, 7}, {1, 4, 7}},
                                           {{64, 33}, {33}},
                                           {{2, 3, 4, 5}, {}},
                                           {{}, {6, 2}},
                                           {{1}, {1}},
                                           {{0, 3}, {3}},
                                           {{2, 1, 3, 1, 5, 1, 2}, {4, 1, 6, 1, 3, 1}},
                                           {{1500, 1001}, {1500, 1}}};

}  // namespace

TEST_CASE("comparisons and logical ops on a GPU equal the CPU's bit for bit", "[cuda]") {
  TANDEM_REQUIRE_GPU();
  uint64_t seed = 1;
  for (DType dtype : kEveryDType) {
    for (const auto& [sa, sb] : kShapes) {
      const Tensor a = tied(sa, seed++, dtype), b = tied(sb, seed++, dtype);
      INFO(sa << " with " << sb << ", " << dtype);
      for (const Comparison& c : kComparisons) {
        const auto op = c.op;
        check_bitwise(c.name, [op](const auto& x) { return op(x[0], x[1]); }, {a, b});
        check_bitwise(c.name, [op](const auto& x) { return op(x[0], x[1]); }, {b, a});
      }
      check_bitwise("logical_not", [](const auto& x) { return ops::logical_not(x[0]); }, {a});
    }
  }
}

TEST_CASE("comparisons with a scalar on a GPU equal the CPU's bit for bit", "[cuda]") {
  TANDEM_REQUIRE_GPU();
  for (DType dtype : kEveryDType) {
    const Tensor x = tied({37, 41}, 100, dtype);
    for (const Comparison& c : kComparisons) {
      if (c.scalar_op == nullptr) continue;
      INFO(dtype);
      const auto op = c.scalar_op;
      for (double s : {0.0, 1.0}) {
        check_bitwise(c.name, [op, s](const auto& v) { return op(v[0], s); }, {x});
      }
      if (is_floating(dtype)) {
        const double nan = std::numeric_limits<double>::quiet_NaN();
        check_bitwise(c.name, [op, nan](const auto& v) { return op(v[0], nan); }, {x});
        check_bitwise(c.name, [op](const auto& v) { return op(v[0], 1.5); }, {x});
      }
    }
  }
}

TEST_CASE("where on a GPU equals the CPU's bit for bit, every dtype and broadcast", "[cuda]") {
  TANDEM_REQUIRE_GPU();
  struct Shapes {
    Shape c, x, y;
  };
  const Shapes cases[] = {{{4, 5, 6}, {4, 5, 6}, {4, 5, 6}},
                          {{4, 5, 6}, {6}, {}},
                          {{5, 1}, {4, 5, 6}, {1, 6}},
                          {{}, {3, 7}, {3, 7}},
                          {{2, 1, 3, 1, 5, 1, 2}, {4, 1, 6, 1, 3, 1}, {1, 5, 1, 2}},
                          {{0, 4}, {4}, {1}},
                          {{1500, 1}, {1001}, {1500, 1001}}};
  uint64_t seed = 500;
  for (DType dtype : kEveryDType) {
    for (const Shapes& s : cases) {
      INFO("condition " << s.c << ", x " << s.x << ", y " << s.y << ", " << dtype);
      const Tensor condition = tied(s.c, seed++, DType::kBool);
      const Tensor x = tied(s.x, seed++, dtype), y = tied(s.y, seed++, dtype);
      check_bitwise("where", [](const auto& v) { return ops::where(v[0], v[1], v[2]); },
                    {condition, x, y});
      // A condition of the values' own dtype: nonzero (NaN included) picks x.
      check_bitwise("where, condition of the values' dtype",
                    [](const auto& v) { return ops::where(v[0], v[1], v[2]); },
                    {tied(s.c, seed++, dtype), x, y});
    }
  }
}

TEST_CASE("where's gradients on a GPU match the CPU's", "[cuda]") {
  TANDEM_REQUIRE_GPU();
  struct Shapes {
    Shape c, x, y;
  };
  const Shapes cases[] = {{{33, 17}, {33, 17}, {33, 17}},
                          {{33, 1}, {17}, {33, 17}},
                          {{17}, {33, 17}, {}},
                          {{2, 1, 3, 1, 5}, {4, 1, 6, 1}, {1, 5}}};
  uint64_t seed = 900;
  for (DType dtype : {DType::kFloat32, DType::kFloat64}) {
    for (const Shapes& s : cases) {
      INFO("condition " << s.c << ", x " << s.x << ", y " << s.y << ", " << dtype);
      const Tensor condition = tied(s.c, seed++, DType::kBool);
      const Tensor x = uniform(s.x, seed++, dtype), y = uniform(s.y, seed++, dtype);
      const Shape out = ops::broadcast_shapes(ops::broadcast_shapes(s.c, s.x), s.y);
      const Tensor weight = uniform(out, seed++, dtype);
      auto gradients = [&](const Device& device) {
        const Tensor c = condition.to(device), xd = x.to(device), yd = y.to(device);
        GradientTape tape;
        tape.watch(xd);
        tape.watch(yd);
        const Tensor target = ops::mul(ops::where(c, xd, yd), weight.to(device));
        return tape.gradient(target, std::vector<Tensor>{xd, yd});
      };
      const std::vector<Tensor> want = gradients(Device::cpu());
      const std::vector<Tensor> got = gradients(kGpu);
      for (size_t i = 0; i < 2; ++i) {
        INFO("gradient of " << (i == 0 ? "x" : "y"));
        REQUIRE(got[i].device() == kGpu);
        REQUIRE(got[i].shape() == want[i].shape());
        REQUIRE(got[i].dtype() == want[i].dtype());
        // The selected gradient is exact; a broadcast operand's is a sum, which the devices may
        // add in different orders.
        const double rtol = dtype == DType::kFloat32 ? 1e-5 : 1e-12;
        const std::vector<double> g = got[i].to_vector<double>(), w = want[i].to_vector<double>();
        for (size_t k = 0; k < w.size(); ++k) {
          if (std::abs(g[k] - w[k]) > rtol * (1.0 + std::abs(w[k]))) {
            FAIL_CHECK("element " << k << ": CUDA " << g[k] << ", CPU " << w[k]);
            break;
          }
        }
        if (s.x == out && s.y == out) require_bitwise(got[i], want[i], "equal shapes: bitwise");
      }
    }
  }
}

TEST_CASE("comparisons, logical ops and where refuse inputs on different devices", "[cuda]") {
  TANDEM_REQUIRE_GPU();
  const Tensor host = Tensor::zeros({3}), device = Tensor::zeros({3}, DType::kFloat32, kGpu);
  for (const Comparison& c : kComparisons) {
    INFO(c.name);
    REQUIRE_THROWS_WITH(c.op(host, device), Catch::Contains(c.name) &&
                                                Catch::Contains("different devices") &&
                                                Catch::Contains("cuda:0"));
  }
  const Tensor flags = ops::greater(device, 0.0);
  REQUIRE(flags.device() == kGpu);
  REQUIRE_THROWS_WITH(ops::where(flags, host, device),
                      Catch::Contains("where") && Catch::Contains("different devices"));
  REQUIRE_THROWS_WITH(ops::where(flags.to(Device::cpu()), device, device),
                      Catch::Contains("where") && Catch::Contains("different devices"));
}
