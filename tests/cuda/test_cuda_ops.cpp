// [cuda] tests: every op on a GPU against the CPU reference, forward and backward (through
// GradientTape), with outputs poisoned with NaN first; the dropout mask bit for bit; the
// caching allocator in steady state; a 1024^3 GEMM. Without a GPU each test WARNs why it was
// skipped and passes.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "support/require_gpu.h"
#include "tandem/tandem.h"
#include "tandem/tensor/device_runtime.h"

namespace {

using namespace tandem;

const Device kGpu = Device::cuda(0);

/// Uniform in [low, high) on the CPU (Philox: the same numbers on every run).
Tensor random(const Shape& shape, uint64_t seed, DType dtype = DType::kFloat32, double low = -1.0,
              double high = 1.0) {
  Generator generator(seed);
  if (is_floating(dtype)) return Tensor::uniform(shape, generator, low, high, dtype);
  // Integers: floor of a uniform double in [low, high).
  return ops::cast(Tensor::uniform(shape, generator, low, high, DType::kFloat64).to(Device::cpu()),
                   dtype);
}

/// The relative tolerance of a CUDA result against the CPU reference.
double tolerance(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return 1e-5;
    case DType::kFloat64:
      return 1e-12;
    default:
      return 0.0;  // integers and bools must match exactly
  }
}

/// Fills the CUDA allocator's free lists for the byte size of every `like` tensor with blocks
/// whose bytes are all 0xFF: NaN as float32 and float64 (-1 as integers), so an op output drawn
/// from the cache starts as NaN and any element a kernel fails to write shows up in the
/// comparison. Several blocks per size, as the op may allocate temporaries of that size first.
void poison_outputs(const std::vector<Tensor>& like) {
  constexpr int kBlocksPerSize = 8;
  std::vector<Tensor> held;
  for (const Tensor& t : like) {
    if (!t.defined() || t.nbytes() == 0) continue;
    const int64_t words = static_cast<int64_t>((t.nbytes() + 3) / 4);
    for (int i = 0; i < kBlocksPerSize; ++i)
      held.push_back(Tensor::full({words}, -1.0, DType::kInt32, kGpu));
  }
  // `held` goes out of scope here: its blocks return to the free lists, ready for the op.
}

/// Requires the CUDA result `gpu` to match the CPU reference `cpu`: same shape, dtype and
/// device kind, NaN exactly where the reference has NaN, and elsewhere
/// |gpu - cpu| <= rtol * max(|cpu|, max |cpu| over the tensor) (relative error per element,
/// measured against the tensor's scale where an element cancels to near zero).
void require_matches(const Tensor& gpu, const Tensor& cpu, const char* what, double rtol = -1.0) {
  INFO(what);
  REQUIRE(gpu.defined() == cpu.defined());
  if (!cpu.defined()) return;
  REQUIRE(gpu.device() == kGpu);
  REQUIRE(gpu.shape() == cpu.shape());
  REQUIRE(gpu.dtype() == cpu.dtype());
  if (rtol < 0) rtol = tolerance(cpu.dtype());
  const std::vector<double> got = gpu.to_vector<double>(), want = cpu.to_vector<double>();
  double scale = 0.0;
  for (double w : want)
    if (std::isfinite(w)) scale = std::max(scale, std::abs(w));
  for (size_t i = 0; i < want.size(); ++i) {
    const double g = got[i], w = want[i];
    const bool ok = std::isnan(w)
                        ? std::isnan(g)
                        : (g == w || std::abs(g - w) <= rtol * std::max(std::abs(w), scale));
    if (!ok) {
      FAIL_CHECK("element " << i << " of " << want.size() << " (shape " << cpu.shape() << "): CUDA "
                            << g << ", CPU " << w << ", rtol " << rtol);
      return;
    }
  }
}

using OpFn = std::function<Tensor(const std::vector<Tensor>&)>;

std::vector<Tensor> to_gpu(const std::vector<Tensor>& xs) {
  std::vector<Tensor> out;
  for (const Tensor& x : xs) out.push_back(x.to(kGpu));
  return out;
}

/// Gradients of sum(f(inputs) * weight) with respect to every floating input (undefined
/// tensors for the others).
std::vector<Tensor> gradients(const OpFn& f, const std::vector<Tensor>& inputs,
                              const Tensor& weight, const std::vector<Tensor>& poison_like) {
  GradientTape tape;
  std::vector<Tensor> sources;
  for (const Tensor& x : inputs) {
    if (is_floating(x.dtype())) tape.watch(x);
    sources.push_back(x);
  }
  const Tensor target = ops::mul(f(inputs), weight);
  if (!poison_like.empty()) poison_outputs(poison_like);
  std::vector<Tensor> grads = tape.gradient(target, sources);
  for (size_t i = 0; i < inputs.size(); ++i)
    if (!is_floating(inputs[i].dtype())) grads[i] = Tensor();
  return grads;
}

/// Runs f on the CPU inputs and on their GPU copies and requires the outputs to match; with
/// `backward`, also the gradients of sum(f(x) * w) for a random w, for every floating input.
void check_op(const char* name, const OpFn& f, const std::vector<Tensor>& cpu_inputs,
              bool backward = true, double rtol = -1.0) {
  INFO("op " << name);
  const std::vector<Tensor> gpu_inputs = to_gpu(cpu_inputs);
  const Tensor expected = f(cpu_inputs);
  poison_outputs({expected});
  const Tensor got = f(gpu_inputs);
  require_matches(got, expected, "forward", rtol);
  const bool differentiable = is_floating(expected.dtype()) &&
                              std::any_of(cpu_inputs.begin(), cpu_inputs.end(),
                                          [](const Tensor& x) { return is_floating(x.dtype()); });
  if (!backward || !differentiable) return;
  const Tensor weight = random(expected.shape(), /*seed=*/977, expected.dtype());
  const std::vector<Tensor> expected_grads = gradients(f, cpu_inputs, weight, {});
  const std::vector<Tensor> got_grads = gradients(f, gpu_inputs, weight.to(kGpu), expected_grads);
  for (size_t i = 0; i < cpu_inputs.size(); ++i) {
    INFO("gradient of input " << i);
    require_matches(got_grads[i], expected_grads[i], "backward", rtol);
  }
}

const std::vector<DType> kFloating = {DType::kFloat32, DType::kFloat64};

}  // namespace

// ---- infrastructure -------------------------------------------------------------------------

TEST_CASE("the GPU tests run, or say why they are skipped", "[cuda]") {
  TANDEM_REQUIRE_GPU();
  const CudaAvailability& info = cuda_availability();
  REQUIRE(info.built);
  INFO("cuda:0 is " << info.devices[0].name);
  CHECK(info.devices[0].total_memory_bytes > 0);
}

TEST_CASE("poisoning reaches the next allocation of the same size", "[cuda]") {
  TANDEM_REQUIRE_GPU();
  for (DType dtype : {DType::kFloat32, DType::kFloat64}) {
    const Tensor like = Tensor::empty({37, 11}, dtype, Device::cpu());
    poison_outputs({like});
    const Tensor fresh = Tensor::empty({37, 11}, dtype, kGpu);
    for (double v : fresh.to_vector<double>()) REQUIRE(std::isnan(v));
  }
}

TEST_CASE("tensors round-trip and fill on the device", "[cuda]") {
  TANDEM_REQUIRE_GPU();
  const Tensor x = random({5, 7}, 1);
  CHECK(x.to(kGpu).to(Device::cpu()).to_vector<float>() == x.to_vector<float>());
  CHECK(Tensor::full({3}, 2.5, DType::kFloat64, kGpu).to_vector<double>() ==
        std::vector<double>{2.5, 2.5, 2.5});
  synchronize(kGpu);
}

// ---- elementwise ----------------------------------------------------------------------------

TEST_CASE("binary ops with broadcasting match the CPU", "[cuda]") {
  TANDEM_REQUIRE_GPU();
  const std::vector<std::pair<Shape, Shape>> shapes = {{{4, 5, 6}, {4, 5, 6}},
                                                       {{4, 5, 6}, {5, 1}},
                                                       {{3, 1, 7}, {1, 4, 7}},
                                                       {{64, 33}, {33}},
                                                       {{2, 3, 4, 5}, {}},
                                                       {{}, {6, 2}},
                                                       {{1}, {1}},
                                                       {{2, 1, 3, 1, 5}, {4, 1, 6, 1}}};
  for (DType dtype : kFloating) {
    for (size_t s = 0; s < shapes.size(); ++s) {
      const Tensor a = random(shapes[s].first, 10 + s, dtype);
      // Divisors kept away from zero.
      const Tensor b = random(shapes[s].second, 20 + s, dtype, 0.5, 2.0);
      INFO(shapes[s].first << " with " << shapes[s].second << ", " << dtype);
      check_op("add", [](const auto& x) { return ops::add(x[0], x[1]); }, {a, b});
      check_op("sub", [](const auto& x) { return ops::sub(x[0], x[1]); }, {a, b});
      check_op("mul", [](const auto& x) { return ops::mul(x[0], x[1]); }, {a, b});
      check_op("div", [](const auto& x) { return ops::div(x[0], x[1]); }, {a, b});
      check_op("maximum", [](const auto& x) { return ops::maximum(x[0], x[1]); }, {a, b - 1.25});
      check_op("minimum", [](const auto& x) { return ops::minimum(x[0], x[1]); }, {a, b - 1.25});
      check_op("equal", [](const auto& x) { return ops::equal(x[0], x[1]); },
               {ops::cast(ops::cast(ops::mul(a, 2.0), DType::kInt32), dtype),
                ops::cast(ops::cast(ops::mul(b, 1.0), DType::kInt32), dtype)});
    }
  }
}

TEST_CASE("integer binary ops match the CPU exactly", "[cuda]") {
  TANDEM_REQUIRE_GPU();
  for (DType dtype : {DType::kInt32, DType::kInt64, DType::kUInt8}) {
    const Tensor a = random({6, 7, 5}, 31, dtype, 0.0, 100.0);
    const Tensor b = random({7, 1}, 32, dtype, 0.0, 100.0);
    INFO(dtype);
    check_op("add", [](const auto& x) { return ops::add(x[0], x[1]); }, {a, b});
    check_op("mul", [](const auto& x) { return ops::mul(x[0], x[1]); }, {a, b});
    check_op("maximum", [](const auto& x) { return ops::maximum(x[0], x[1]); }, {a, b});
    check_op("minimum", [](const auto& x) { return ops::minimum(x[0], x[1]); }, {a, b});
    check_op("equal", [](const auto& x) { return ops::equal(x[0], x[1]); },
             {random({6, 7, 5}, 33, dtype, 0.0, 3.0), random({5}, 34, dtype, 0.0, 3.0)});
  }
  const Tensor flags = ops::equal(random({40}, 35, DType::kInt32, 0.0, 2.0),
                                  random({40}, 36, DType::kInt32, 0.0, 2.0));
  check_op("equal bool", [](const auto& x) { return ops::equal(x[0], x[1]); },
           {flags, ops::equal(random({40}, 37, DType::kInt32, 0.0, 2.0),
                              random({40}, 38, DType::kInt32, 0.0, 2.0))});
}

TEST_CASE("unary ops and activations match the CPU", "[cuda]") {
  TANDEM_REQUIRE_GPU();
  for (DType dtype : kFloating) {
    const Tensor x = random({17, 61}, 40, dtype, -3.0, 3.0);
    const Tensor positive = random({17, 61}, 41, dtype, 0.25, 4.0);
    INFO(dtype);
    check_op("neg", [](const auto& v) { return ops::neg(v[0]); }, {x});
    check_op("abs", [](const auto& v) { return ops::abs(v[0]); }, {x});
    check_op("exp", [](const auto& v) { return ops::exp(v[0]); }, {x});
    check_op("log", [](const auto& v) { return ops::log(v[0]); }, {positive});
    check_op("log1p", [](const auto& v) { return ops::log1p(v[0]); }, {positive});
    check_op("sqrt", [](const auto& v) { return ops::sqrt(v[0]); }, {positive});
    check_op("square", [](const auto& v) { return ops::square(v[0]); }, {x});
    check_op("pow 2.5", [](const auto& v) { return ops::pow(v[0], 2.5); }, {positive});
    check_op("pow -1.5", [](const auto& v) { return ops::pow(v[0], -1.5); }, {positive});
    check_op("clip", [](const auto& v) { return ops::clip(v[0], -1.0, 0.5); }, {x});
    check_op("relu", [](const auto& v) { return ops::relu(v[0]); }, {x});
    check_op("add with a fused relu",
             [](const auto& v) { return ops::add(v[0], v[1], ops::FusedActivation::kRelu); },
             {x, random({61}, 42, dtype, -3.0, 3.0)});
    check_op("sigmoid", [](const auto& v) { return ops::sigmoid(v[0]); }, {x});
    check_op("tanh", [](const auto& v) { return ops::tanh(v[0]); }, {x});
    check_op("gelu", [](const auto& v) { return ops::gelu(v[0]); }, {x});
    check_op("gelu tanh", [](const auto& v) { return ops::gelu(v[0], true); }, {x});
    check_op("add scalar", [](const auto& v) { return ops::add(v[0], 0.75); }, {x});
    check_op("mul scalar", [](const auto& v) { return ops::mul(v[0], -1.5); }, {x});
    check_op("operators", [](const auto& v) { return (v[0] * 2.0 - v[1]) / (v[1] + 1.0) * v[0]; },
             {x, positive});
  }
}

TEST_CASE("cast converts like the CPU", "[cuda]") {
  TANDEM_REQUIRE_GPU();
  const Tensor x = random({9, 13}, 50, DType::kFloat32, -5.0, 5.0);
  const Tensor positive = random({9, 13}, 51, DType::kFloat64, 0.0, 200.0);
  const Tensor flags =
      ops::equal(random({9, 13}, 52, DType::kInt32, 0.0, 2.0), Tensor::zeros({}, DType::kInt32));
  struct Case {
    Tensor input;
    DType to;
  };
  const std::vector<Case> cases = {{x, DType::kFloat64},
                                   {ops::cast(x, DType::kFloat64), DType::kFloat32},
                                   {x, DType::kInt32},
                                   {x, DType::kInt64},
                                   {x, DType::kBool},
                                   {positive, DType::kUInt8},
                                   {flags, DType::kFloat32},
                                   {flags, DType::kInt64},
                                   {random({9, 13}, 53, DType::kInt64, -1e6, 1e6), DType::kFloat64},
                                   {random({9, 13}, 54, DType::kUInt8, 0.0, 255.0), DType::kInt32}};
  for (const Case& c : cases) {
    INFO("from " << c.input.dtype() << " to " << c.to);
    const DType to = c.to;
    check_op("cast", [to](const auto& v) { return ops::cast(v[0], to); }, {c.input});
  }
}

// ---- reductions and softmax -----------------------------------------------------------------

TEST_CASE("sum, mean and max over all elements and over each axis", "[cuda]") {
  TANDEM_REQUIRE_GPU();
  for (DType dtype : kFloating) {
    INFO(dtype);
    const Tensor x = random({6, 7, 40}, 60, dtype);
    check_op("sum", [](const auto& v) { return ops::sum(v[0]); }, {x});
    check_op("mean", [](const auto& v) { return ops::mean(v[0]); }, {x});
    check_op("max", [](const auto& v) { return ops::max(v[0]); }, {x});
    for (int64_t axis : {0, 1, 2, -1}) {
      for (bool keepdims : {false, true}) {
        INFO("axis " << axis << (keepdims ? ", keepdims" : ""));
        check_op("sum", [=](const auto& v) { return ops::sum(v[0], axis, keepdims); }, {x});
        check_op("mean", [=](const auto& v) { return ops::mean(v[0], axis, keepdims); }, {x});
        check_op("max", [=](const auto& v) { return ops::max(v[0], axis, keepdims); }, {x});
      }
    }
    // Long rows: the two-pass row reduction (few rows, many elements) and long columns.
    const Tensor wide = random({3, 70001}, 61, dtype);
    check_op("sum long rows", [](const auto& v) { return ops::sum(v[0], 1); }, {wide});
    check_op("max long rows", [](const auto& v) { return ops::max(v[0], 1); }, {wide});
    check_op("sum of all, long", [](const auto& v) { return ops::sum(v[0]); }, {wide});
    check_op("mean of all, long", [](const auto& v) { return ops::mean(v[0]); }, {wide});
    check_op("max of all, long", [](const auto& v) { return ops::max(v[0]); }, {wide});
    const Tensor tall = random({20001, 3}, 62, dtype);
    check_op("sum long columns", [](const auto& v) { return ops::sum(v[0], 0); }, {tall});
    check_op("max long columns", [](const auto& v) { return ops::max(v[0], 0); }, {tall});
    // Many short rows (one block per row).
    const Tensor rows = random({1000, 33}, 63, dtype);
    check_op("sum many rows", [](const auto& v) { return ops::sum(v[0], 1); }, {rows});
    check_op("sum_to bias", [](const auto& v) { return ops::sum_to(v[0], Shape{33}); }, {rows});
  }
}

TEST_CASE("integer reductions and argmax with ties", "[cuda]") {
  TANDEM_REQUIRE_GPU();
  for (DType dtype : {DType::kInt32, DType::kInt64, DType::kUInt8}) {
    INFO(dtype);
    const Tensor x = random({5, 9, 12}, 70, dtype, 0.0, 20.0);
    check_op("sum", [](const auto& v) { return ops::sum(v[0]); }, {x});
    check_op("sum axis 1", [](const auto& v) { return ops::sum(v[0], 1); }, {x});
    check_op("max axis 2", [](const auto& v) { return ops::max(v[0], 2); }, {x});
  }
  // Few distinct values: many ties, the first index must win on both backends.
  for (DType dtype : {DType::kFloat32, DType::kFloat64, DType::kInt32}) {
    const Tensor x = ops::cast(random({30, 40, 7}, 71, DType::kInt32, 0.0, 4.0), dtype);
    for (int64_t axis : {0, 1, 2}) {
      INFO(dtype << ", axis " << axis);
      check_op("argmax", [=](const auto& v) { return ops::argmax(v[0], axis); }, {x});
    }
    const Tensor flat = ops::cast(random({50000}, 72, DType::kInt32, 0.0, 4.0), dtype);
    check_op("argmax long row", [](const auto& v) { return ops::argmax(v[0], 0); }, {flat});
  }
}

TEST_CASE("softmax and log_softmax over rows and inner axes", "[cuda]") {
  TANDEM_REQUIRE_GPU();
  for (DType dtype : kFloating) {
    INFO(dtype);
    const Tensor logits = random({64, 10}, 80, dtype, -4.0, 4.0);
    const Tensor wide = random({5, 3001}, 81, dtype, -4.0, 4.0);
    const Tensor cube = random({4, 5, 6}, 82, dtype, -4.0, 4.0);
    for (const Tensor& x : {logits, wide}) {
      check_op("softmax rows", [](const auto& v) { return ops::softmax(v[0]); }, {x});
      check_op("log_softmax rows", [](const auto& v) { return ops::log_softmax(v[0]); }, {x});
    }
    for (int64_t axis : {0, 1, 2}) {
      INFO("axis " << axis);
      check_op("softmax", [=](const auto& v) { return ops::softmax(v[0], axis); }, {cube});
      check_op("log_softmax", [=](const auto& v) { return ops::log_softmax(v[0], axis); }, {cube});
    }
  }
}

TEST_CASE("fused sparse softmax cross-entropy, forward and backward", "[cuda]") {
  TANDEM_REQUIRE_GPU();
  for (DType dtype : kFloating) {
    for (DType label_type : {DType::kInt32, DType::kInt64}) {
      for (const auto& [batch, classes] :
           std::vector<std::pair<int64_t, int64_t>>{{64, 10}, {16, 1000}, {3, 1}}) {
        const Tensor logits = random({batch, classes}, 90, dtype, -5.0, 5.0);
        const Tensor labels = random({batch}, 91, label_type, 0.0, static_cast<double>(classes));
        INFO("[" << batch << ", " << classes << "] " << dtype << ", labels " << label_type);
        check_op("sparse_softmax_cross_entropy",
                 [](const auto& v) { return ops::sparse_softmax_cross_entropy(v[0], v[1]); },
                 {logits, labels});
      }
    }
  }
}

TEST_CASE("labels outside the class range raise naming the label", "[cuda]") {
  TANDEM_REQUIRE_GPU();
  const Tensor logits = random({4, 10}, 92).to(kGpu);
  const Tensor labels = Tensor::from_vector<int32_t>({1, 2, 3, 12}).to(kGpu);
  CHECK_THROWS_WITH(ops::sparse_softmax_cross_entropy(logits, labels),
                    Catch::Contains("label 12 at index 3"));
  CHECK_THROWS_WITH(ops::one_hot(Tensor::from_vector<int64_t>({0, -1}).to(kGpu), 3),
                    Catch::Contains("label -1 at index 1"));
}

TEST_CASE("one_hot matches the CPU", "[cuda]") {
  TANDEM_REQUIRE_GPU();
  for (DType label_type : {DType::kInt32, DType::kInt64}) {
    const Tensor labels = random({37}, 95, label_type, 0.0, 10.0);
    for (DType dtype : {DType::kFloat32, DType::kFloat64, DType::kInt64, DType::kUInt8}) {
      INFO(label_type << " labels to " << dtype);
      check_op("one_hot", [=](const auto& v) { return ops::one_hot(v[0], 10, dtype); }, {labels});
    }
  }
}

// ---- shapes and data movement ---------------------------------------------------------------

TEST_CASE("transpose, reshape, flatten, concat and slice match the CPU", "[cuda]") {
  TANDEM_REQUIRE_GPU();
  for (DType dtype : {DType::kFloat32, DType::kFloat64, DType::kInt32, DType::kUInt8}) {
    INFO(dtype);
    const Tensor m = random({37, 70}, 100, dtype, 0.0, 100.0);
    check_op("transpose matrix", [](const auto& v) { return ops::transpose(v[0]); }, {m});
    const Tensor x = random({2, 3, 4, 5}, 101, dtype, 0.0, 100.0);
    for (const std::vector<int64_t>& perm : std::vector<std::vector<int64_t>>{
             {0, 2, 3, 1}, {3, 2, 1, 0}, {1, 0, 2, 3}, {0, 1, 3, 2}, {0, 1, 2, 3}, {2, 0, 3, 1}}) {
      INFO("perm " << Shape(perm));
      check_op("transpose", [=](const auto& v) { return ops::transpose(v[0], perm); }, {x});
    }
    const Tensor batch = random({3, 33, 65}, 102, dtype, 0.0, 100.0);
    check_op("transpose batched",
             [](const auto& v) {
               return ops::transpose(v[0], {0, 2, 1});
             },
             {batch});
  }
  for (DType dtype : kFloating) {
    INFO(dtype);
    const Tensor x = random({6, 4, 5}, 103, dtype);
    check_op("reshape", [](const auto& v) { return ops::reshape(v[0], {4, -1}); }, {x});
    check_op("flatten", [](const auto& v) { return ops::flatten(v[0]); }, {x});
    check_op("slice", [](const auto& v) { return ops::mul(ops::slice(v[0], 1, 4), 1.0); }, {x});
    check_op("concat",
             [](const auto& v) {
               return ops::concat({v[0], v[1], v[0]});
             },
             {x, random({2, 4, 5}, 104, dtype)});
  }
}

// ---- linear algebra -------------------------------------------------------------------------

TEST_CASE("matmul in every transpose combination, forward and backward", "[cuda]") {
  TANDEM_REQUIRE_GPU();
  const int64_t m = 37, k = 53, n = 29;
  for (DType dtype : kFloating) {
    for (bool ta : {false, true}) {
      for (bool tb : {false, true}) {
        const Tensor a = random(ta ? Shape{k, m} : Shape{m, k}, 110, dtype);
        const Tensor b = random(tb ? Shape{n, k} : Shape{k, n}, 111, dtype);
        INFO("transpose_a " << ta << ", transpose_b " << tb << ", " << dtype);
        check_op("matmul", [=](const auto& v) { return ops::matmul(v[0], v[1], ta, tb); }, {a, b});
      }
    }
    check_op(
        "matmul with an empty inner dimension",
        [](const auto& v) { return ops::matmul(v[0], v[1]); },
        {Tensor::zeros({3, 0}, dtype), Tensor::zeros({0, 4}, dtype)}, /*backward=*/false);
  }
}

TEST_CASE("batched matmul with broadcast batch dimensions matches the CPU, forward and backward",
          "[cuda]") {
  TANDEM_REQUIRE_GPU();
  const int64_t m = 17, k = 24, n = 11;
  for (DType dtype : kFloating) {
    for (bool ta : {false, true}) {
      for (bool tb : {false, true}) {
        // Both operands broadcast; and a single right-hand matrix (the batch folded into rows).
        const Tensor a = random(ta ? Shape{2, 1, k, m} : Shape{2, 1, m, k}, 112, dtype);
        const Tensor b = random(tb ? Shape{3, n, k} : Shape{3, k, n}, 113, dtype);
        const Tensor w = random(tb ? Shape{n, k} : Shape{k, n}, 114, dtype);
        INFO("transpose_a " << ta << ", transpose_b " << tb << ", " << dtype);
        check_op("matmul [2,1,.,.] x [3,.,.]",
                 [=](const auto& v) { return ops::matmul(v[0], v[1], ta, tb); }, {a, b});
        check_op("matmul [2,1,.,.] x [.,.]",
                 [=](const auto& v) { return ops::matmul(v[0], v[1], ta, tb); }, {a, w});
      }
    }
  }
}

TEST_CASE("scaled_dot_product_attention matches the CPU's fused kernel, forward and backward",
          "[cuda]") {
  TANDEM_REQUIRE_GPU();
  for (DType dtype : kFloating) {
    for (bool causal : {false, true}) {
      INFO("causal " << causal << ", " << dtype);
      const Tensor q = random({2, 3, 70, 16}, 115, dtype), k = random({2, 3, 70, 16}, 116, dtype);
      const Tensor v = random({2, 3, 70, 8}, 117, dtype);
      check_op("scaled_dot_product_attention",
               [=](const auto& x) {
                 return ops::scaled_dot_product_attention(x[0], x[1], x[2], {.causal = causal});
               },
               {q, k, v});
    }
  }
}

TEST_CASE("slice along an axis, tril and [B, T, V] cross-entropy match the CPU", "[cuda]") {
  TANDEM_REQUIRE_GPU();
  for (DType dtype : kFloating) {
    INFO(dtype);
    const Tensor x = random({3, 7, 5}, 118, dtype);
    check_op("slice axis 1", [](const auto& v) { return ops::slice(v[0], 1, 2, 6); }, {x});
    check_op("tril", [](const auto& v) { return ops::tril(v[0], 1); }, {x});
    const Tensor labels = random({3, 7}, 119, DType::kInt64, 0, 5);
    check_op("sparse_softmax_cross_entropy [B, T, V]",
             [](const auto& v) { return ops::sparse_softmax_cross_entropy(v[0], v[1]); },
             {x, labels});
  }
}

TEST_CASE("dense (cuBLASLt epilogues for float32) matches the CPU, forward and backward",
          "[cuda]") {
  TANDEM_REQUIRE_GPU();
  struct Case {
    int64_t m, k, n;
  };
  // Odd sizes (rows and bias at unusual alignments), a layer of the sample MLP, one output
  // column, and an empty inner dimension (the output is act(bias)).
  for (const Case c : {Case{37, 53, 29}, Case{64, 784, 256}, Case{3, 7, 1}, Case{5, 0, 3}}) {
    for (DType dtype : kFloating) {
      for (bool with_bias : {false, true}) {
        for (ops::FusedActivation activation :
             {ops::FusedActivation::kLinear, ops::FusedActivation::kRelu}) {
          INFO("m " << c.m << ", k " << c.k << ", n " << c.n << ", " << dtype
                    << (with_bias ? ", bias" : "")
                    << (activation == ops::FusedActivation::kRelu ? ", relu" : ""));
          std::vector<Tensor> inputs{random({c.m, c.k}, 120, dtype),
                                     random({c.k, c.n}, 121, dtype)};
          if (with_bias) inputs.push_back(random({c.n}, 122, dtype));
          check_op(
              "dense",
              [=](const auto& v) {
                return ops::dense(v[0], v[1], with_bias ? v[2] : Tensor(), activation);
              },
              inputs, /*backward=*/c.k > 0);
        }
      }
    }
  }
}

TEST_CASE("a 1024^3 float32 GEMM matches the CPU (TF32 off)", "[cuda]") {
  TANDEM_REQUIRE_GPU();
  REQUIRE_FALSE(cuda::allow_tf32());
  const Tensor a = random({1024, 1024}, 120), b = random({1024, 1024}, 121);
  check_op(
      "matmul 1024^3", [](const auto& v) { return ops::matmul(v[0], v[1]); }, {a, b},
      /*backward=*/false);
}

TEST_CASE("allowing TF32 changes float32 GEMM precision, and only when asked", "[cuda]") {
  TANDEM_REQUIRE_GPU();
  const Tensor a = random({1024, 1024}, 122), b = random({1024, 1024}, 123);
  const std::vector<double> expected = ops::matmul(a, b).to_vector<double>();
  auto max_error = [&] {
    const std::vector<double> got = ops::matmul(a.to(kGpu), b.to(kGpu)).to_vector<double>();
    double error = 0.0;
    for (size_t i = 0; i < got.size(); ++i) error = std::max(error, std::abs(got[i] - expected[i]));
    return error;
  };
  const double full = max_error();
  cuda::set_allow_tf32(true);
  const double tf32 = max_error();
  cuda::set_allow_tf32(false);
  INFO("max abs error: float32 " << full << ", TF32 " << tf32);
  CHECK(tf32 > full);
  CHECK(max_error() == full);
}

// ---- convolution, pooling, dropout ----------------------------------------------------------

TEST_CASE("conv2d (im2col, GEMM, col2im) forward and backward", "[cuda]") {
  TANDEM_REQUIRE_GPU();
  struct Case {
    Shape kernel;
    std::array<int64_t, 2> strides;
    ops::Padding padding;
  };
  const std::vector<Case> cases = {{{3, 3, 3, 4}, {1, 1}, ops::Padding::kValid},
                                   {{3, 3, 3, 4}, {1, 1}, ops::Padding::kSame},
                                   {{3, 3, 3, 4}, {2, 2}, ops::Padding::kSame},
                                   {{2, 4, 3, 5}, {2, 1}, ops::Padding::kValid},
                                   {{1, 1, 3, 2}, {2, 2}, ops::Padding::kSame}};
  for (DType dtype : kFloating) {
    const Tensor x = random({2, 9, 8, 3}, 130, dtype);
    for (size_t i = 0; i < cases.size(); ++i) {
      const Case c = cases[i];
      INFO("case " << i << ", " << dtype);
      check_op("conv2d",
               [c](const auto& v) { return ops::conv2d(v[0], v[1], c.strides, c.padding); },
               {x, random(c.kernel, 131 + i, dtype)});
    }
  }
}

TEST_CASE("max_pool2d forward and backward, overlapping and padded windows", "[cuda]") {
  TANDEM_REQUIRE_GPU();
  struct Case {
    std::array<int64_t, 2> pool, strides;
    ops::Padding padding;
  };
  const std::vector<Case> cases = {{{2, 2}, {2, 2}, ops::Padding::kValid},
                                   {{3, 3}, {2, 2}, ops::Padding::kSame},
                                   {{3, 3}, {1, 1}, ops::Padding::kSame},
                                   {{2, 3}, {3, 2}, ops::Padding::kValid}};
  for (DType dtype : kFloating) {
    const Tensor x = random({2, 9, 8, 3}, 140, dtype);
    for (size_t i = 0; i < cases.size(); ++i) {
      const Case c = cases[i];
      INFO("case " << i << ", " << dtype);
      check_op("max_pool2d",
               [c](const auto& v) { return ops::max_pool2d(v[0], c.pool, c.strides, c.padding); },
               {x});
    }
  }
}

TEST_CASE("avg_pool2d forward and backward, overlapping and padded windows", "[cuda]") {
  TANDEM_REQUIRE_GPU();
  struct Case {
    std::array<int64_t, 2> pool, strides;
    ops::Padding padding;
  };
  const std::vector<Case> cases = {{{2, 2}, {2, 2}, ops::Padding::kValid},
                                   {{3, 3}, {2, 2}, ops::Padding::kSame},
                                   {{3, 3}, {1, 1}, ops::Padding::kSame},
                                   {{2, 3}, {3, 2}, ops::Padding::kValid}};
  for (DType dtype : kFloating) {
    const Tensor x = random({2, 9, 8, 3}, 141, dtype);
    for (size_t i = 0; i < cases.size(); ++i) {
      const Case c = cases[i];
      INFO("case " << i << ", " << dtype);
      check_op("avg_pool2d",
               [c](const auto& v) { return ops::avg_pool2d(v[0], c.pool, c.strides, c.padding); },
               {x});
    }
  }
}

TEST_CASE("embedding forward and backward match the CPU, repeated rows summed in order", "[cuda]") {
  TANDEM_REQUIRE_GPU();
  for (DType dtype : kFloating) {
    for (const int64_t rows : {7, 3000}) {
      INFO(dtype << ", " << rows << " rows");
      const Tensor table = random({rows, 5}, 142, dtype);
      // Many repeats of few rows, so several gradients add into one row.
      const Tensor picks = random({400}, 143, DType::kInt64, 0.0, 6.0);
      for (const DType index_type : {DType::kInt32, DType::kInt64}) {
        const Tensor indices = ops::cast(picks, index_type).to(kGpu);
        check_op("embedding",
                 [indices](const auto& v) {
                   return ops::embedding(
                       v[0], v[0].device().is_cpu() ? indices.to(Device::cpu()) : indices);
                 },
                 {table});
      }
    }
  }
  const Tensor table = random({4, 2}, 144, DType::kFloat32).to(kGpu);
  REQUIRE_THROWS_WITH(
      ops::embedding(table, Tensor::from_vector(std::vector<int64_t>{0, 4}).to(kGpu)),
      Catch::Contains("row index 4 at index 1") && Catch::Contains("[0, 4)"));
}

TEST_CASE("the dropout mask is bit-identical to the CPU's", "[cuda]") {
  TANDEM_REQUIRE_GPU();
  for (DType dtype : kFloating) {
    for (int64_t n : {1, 4, 1001, 65537}) {
      const Tensor x = random({n}, 150, dtype, 0.5, 1.5);
      Generator cpu_generator(/*seed=*/7, /*stream=*/3), gpu_generator(/*seed=*/7, /*stream=*/3);
      // Twice, so the second mask starts at a block offset other than 0.
      for (int draw = 0; draw < 2; ++draw) {
        const Tensor expected = ops::dropout(x, 0.3, cpu_generator);
        poison_outputs({expected});
        const Tensor got = ops::dropout(x.to(kGpu), 0.3, gpu_generator);
        INFO("n = " << n << ", draw " << draw << ", " << dtype);
        if (dtype == DType::kFloat32)
          REQUIRE(got.to_vector<float>() == expected.to_vector<float>());
        else
          REQUIRE(got.to_vector<double>() == expected.to_vector<double>());
        REQUIRE(cpu_generator == gpu_generator);
      }
    }
    // The gradient routes through the same mask.
    check_op("dropout gradient",
             [](const auto& v) {
               Generator generator(11, 0);
               return ops::dropout(v[0], 0.5, generator);
             },
             {random({300}, 151, dtype)});
  }
}

// ---- in place -------------------------------------------------------------------------------

TEST_CASE("add_ and scale_ update in place", "[cuda]") {
  TANDEM_REQUIRE_GPU();
  for (DType dtype : {DType::kFloat32, DType::kFloat64, DType::kInt32}) {
    const double alpha = is_floating(dtype) ? -0.375 : 3.0;
    Tensor cpu_dst = random({33, 17}, 160, dtype, 0.0, 50.0);
    const Tensor src = random({33, 17}, 161, dtype, 0.0, 50.0);
    Tensor gpu_dst = cpu_dst.to(kGpu);
    const void* address = gpu_dst.raw_data();
    ops::add_(cpu_dst, src, alpha);
    ops::add_(gpu_dst, src.to(kGpu), alpha);
    INFO(dtype);
    require_matches(gpu_dst, cpu_dst, "add_");
    ops::scale_(cpu_dst, 2.0);
    ops::scale_(gpu_dst, 2.0);
    require_matches(gpu_dst, cpu_dst, "scale_");
    CHECK(gpu_dst.raw_data() == address);
  }
}

TEST_CASE("inputs on different devices are refused", "[cuda]") {
  TANDEM_REQUIRE_GPU();
  CHECK_THROWS_WITH(ops::add(random({2}, 170), random({2}, 171).to(kGpu)),
                    Catch::Contains("different devices"));
}

// ---- the caching allocator in a training step -----------------------------------------------

TEST_CASE("a repeated training step performs no new cudaMalloc", "[cuda]") {
  TANDEM_REQUIRE_GPU();
  Tensor w1 = random({784, 256}, 180, DType::kFloat32, -0.05, 0.05).to(kGpu);
  Tensor b1 = Tensor::zeros({256}, DType::kFloat32, kGpu);
  Tensor w2 = random({256, 10}, 181, DType::kFloat32, -0.05, 0.05).to(kGpu);
  Tensor b2 = Tensor::zeros({10}, DType::kFloat32, kGpu);
  const Tensor features = random({64, 784}, 182).to(kGpu);
  const Tensor labels = random({64}, 183, DType::kInt64, 0.0, 10.0).to(kGpu);
  std::vector<Tensor> params = {w1, b1, w2, b2};
  auto step = [&] {
    GradientTape tape;
    for (const Tensor& p : params) tape.watch(p);
    const Tensor hidden = ops::relu(ops::add(ops::matmul(features, params[0]), params[1]));
    const Tensor logits = ops::add(ops::matmul(hidden, params[2]), params[3]);
    const Tensor loss = ops::mean(ops::sparse_softmax_cross_entropy(logits, labels));
    const std::vector<Tensor> grads = tape.gradient(loss, params);
    for (size_t i = 0; i < params.size(); ++i) ops::add_(params[i], grads[i], -0.1);
    return loss.item<float>();
  };
  const float first = step();
  step();  // warm-up: every size the step needs is now cached
  const AllocatorStats before = allocator_for(kGpu).stats();
  float last = first;
  for (int i = 0; i < 3; ++i) last = step();
  const AllocatorStats after = allocator_for(kGpu).stats();
  CHECK(after.system_allocs == before.system_allocs);
  CHECK(after.cache_hits > before.cache_hits);
  CHECK(last < first);  // and it trains
}
