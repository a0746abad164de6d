// Fused optimizer updates (ops/optimizer_updates.h): SGD, momentum, Nesterov, Adam, AdamW and
// Lion are bit for bit the same update written with separate ops (the reference optimizers below
// keep that composition), over several steps, float32 and float64, with gradient accumulation
// and global-norm clipping, on sizes from one element to one that the CPU loop splits across
// threads; the ops allocate nothing and name what is wrong with their arguments.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "tandem/autograd/variable.h"
#include "tandem/ops/kernels/optimizer_functors.h"
#include "tandem/ops/ops.h"
#include "tandem/ops/optimizer_updates.h"
#include "tandem/optim/adam.h"
#include "tandem/optim/lion.h"
#include "tandem/optim/sgd.h"
#include "tandem/tensor/allocator.h"
#include "tandem/tensor/random.h"

namespace td = tandem;
namespace ops = tandem::ops;
namespace optim = tandem::optim;

namespace {

// ---- the reference: each update as separate ops (the composition the fused ops replace) ----

void reference_sgd_step(const td::Tensor& gradient, td::Tensor& variable,
                        std::vector<td::Tensor>& slots, double learning_rate, double momentum,
                        bool nesterov) {
  const td::Tensor scaled = ops::mul(gradient, learning_rate);  // g * lr
  if (slots.empty()) {
    ops::add_(variable, scaled, -1.0);  // w -= g * lr
    return;
  }
  td::Tensor& m = slots[0];
  m.copy_from(ops::sub(ops::mul(m, momentum), scaled));  // m = m * momentum - g * lr
  if (nesterov) {
    ops::add_(variable, ops::sub(ops::mul(m, momentum), scaled));
  } else {
    ops::add_(variable, m);
  }
}

struct AdamHyper {
  double beta_1 = 0.9, beta_2 = 0.999, epsilon = 1e-7, weight_decay = 0.0;
};

void reference_adam_step(const td::Tensor& gradient, td::Tensor& variable,
                         std::vector<td::Tensor>& slots, double learning_rate, int64_t step,
                         const AdamHyper& h) {
  td::Tensor& m = slots[0];
  td::Tensor& v = slots[1];
  double alpha = 0.0, one_minus_beta_1 = 0.0, one_minus_beta_2 = 0.0;
  td::dispatch_floating(variable.dtype(), "reference adam", [&]<typename T>() {
    const T lr = static_cast<T>(learning_rate);
    const T t = static_cast<T>(step);
    const T beta_1_power = std::pow(static_cast<T>(h.beta_1), t);
    const T beta_2_power = std::pow(static_cast<T>(h.beta_2), t);
    alpha = static_cast<double>(lr * std::sqrt(T(1) - beta_2_power) / (T(1) - beta_1_power));
    one_minus_beta_1 = static_cast<double>(static_cast<T>(1.0 - h.beta_1));
    one_minus_beta_2 = static_cast<double>(static_cast<T>(1.0 - h.beta_2));
  });
  if (h.weight_decay > 0.0) {
    ops::add_(variable, ops::mul(ops::mul(variable, h.weight_decay), learning_rate), -1.0);
  }
  ops::add_(m, ops::mul(ops::sub(gradient, m), one_minus_beta_1));
  ops::add_(v, ops::mul(ops::sub(ops::square(gradient), v), one_minus_beta_2));
  ops::add_(variable, ops::div(ops::mul(m, alpha), ops::add(ops::sqrt(v), h.epsilon)), -1.0);
}

struct LionHyper {
  double beta_1 = 0.9, beta_2 = 0.99, weight_decay = 0.0;
};

void reference_lion_step(const td::Tensor& gradient, td::Tensor& variable, td::Tensor& m,
                         double learning_rate, const LionHyper& h) {
  // Keras casts beta to the variable's dtype and computes 1 - beta there.
  double one_minus_beta_1 = 0.0, one_minus_beta_2 = 0.0;
  td::dispatch_floating(variable.dtype(), "reference lion", [&]<typename T>() {
    one_minus_beta_1 = static_cast<double>(T(1) - static_cast<T>(h.beta_1));
    one_minus_beta_2 = static_cast<double>(T(1) - static_cast<T>(h.beta_2));
  });
  if (h.weight_decay > 0.0) {
    ops::add_(variable, ops::mul(ops::mul(variable, h.weight_decay), learning_rate), -1.0);
  }
  const td::Tensor direction =
      ops::add(ops::mul(m, h.beta_1), ops::mul(gradient, one_minus_beta_1));
  const td::Tensor sign = ops::sub(ops::cast(ops::greater(direction, 0.0), variable.dtype()),
                                   ops::cast(ops::less(direction, 0.0), variable.dtype()));
  ops::add_(variable, ops::mul(sign, learning_rate), -1.0);  // w -= lr * sign(direction)
  m.copy_from(ops::add(ops::mul(m, h.beta_2), ops::mul(gradient, one_minus_beta_2)));
}

/// The slots of variable i (handles sharing storage with the optimizer's slots).
std::vector<td::Tensor> slots_of(const std::vector<std::vector<td::Tensor>>& slots, size_t i) {
  std::vector<td::Tensor> own;
  for (const std::vector<td::Tensor>& kind : slots) own.push_back(kind[i]);
  return own;
}

class ReferenceSgd final : public optim::SGD {
 public:
  explicit ReferenceSgd(Options options) : SGD(std::move(options)) {}

 protected:
  void update_step(std::span<const td::Tensor> gradients, std::span<td::Tensor> variables,
                   std::vector<std::vector<td::Tensor>>& slots, double learning_rate,
                   int64_t) override {
    for (size_t i = 0; i < variables.size(); ++i) {
      std::vector<td::Tensor> own = slots_of(slots, i);
      reference_sgd_step(gradients[i], variables[i], own, learning_rate, options().momentum,
                         options().nesterov);
    }
  }
};

class ReferenceAdam final : public optim::Adam {
 public:
  explicit ReferenceAdam(Options options)
      : Adam(options), hyper_{options.beta_1, options.beta_2, options.epsilon, 0.0} {}

 protected:
  void update_step(std::span<const td::Tensor> gradients, std::span<td::Tensor> variables,
                   std::vector<std::vector<td::Tensor>>& slots, double learning_rate,
                   int64_t step) override {
    for (size_t i = 0; i < variables.size(); ++i) {
      std::vector<td::Tensor> own = slots_of(slots, i);
      reference_adam_step(gradients[i], variables[i], own, learning_rate, step, hyper_);
    }
  }

 private:
  AdamHyper hyper_;
};

class ReferenceAdamW final : public optim::AdamW {
 public:
  explicit ReferenceAdamW(Options options)
      : AdamW(options),
        hyper_{options.beta_1, options.beta_2, options.epsilon, options.weight_decay} {}

 protected:
  void update_step(std::span<const td::Tensor> gradients, std::span<td::Tensor> variables,
                   std::vector<std::vector<td::Tensor>>& slots, double learning_rate,
                   int64_t step) override {
    for (size_t i = 0; i < variables.size(); ++i) {
      std::vector<td::Tensor> own = slots_of(slots, i);
      reference_adam_step(gradients[i], variables[i], own, learning_rate, step, hyper_);
    }
  }

 private:
  AdamHyper hyper_;
};

class ReferenceLion final : public optim::Lion {
 public:
  explicit ReferenceLion(Options options)
      : Lion(options), hyper_{options.beta_1, options.beta_2, options.weight_decay} {}

 protected:
  void update_step(std::span<const td::Tensor> gradients, std::span<td::Tensor> variables,
                   std::vector<std::vector<td::Tensor>>& slots, double learning_rate,
                   int64_t) override {
    // Keras applies the decay only to the variables it is not excluded from.
    LionHyper hyper = hyper_;
    if (!weight_decay_applies()) hyper.weight_decay = 0.0;
    for (size_t i = 0; i < variables.size(); ++i)
      reference_lion_step(gradients[i], variables[i], slots[0][i], learning_rate, hyper);
  }

 private:
  LionHyper hyper_;
};

// ---- comparison ----------------------------------------------------------------------------

/// True when both CPU tensors hold the same bytes (NaN patterns and signed zeros included).
bool bitwise_equal(const td::Tensor& a, const td::Tensor& b) {
  // An empty tensor may have no storage at all: memcmp must not see its null pointer.
  return a.shape() == b.shape() && a.dtype() == b.dtype() &&
         (a.nbytes() == 0 || std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0);
}

/// How many elements differ by value (for the failure message).
int64_t count_different(const td::Tensor& a, const td::Tensor& b) {
  const std::vector<double> x = a.to_vector<double>(), y = b.to_vector<double>();
  int64_t n = 0;
  for (size_t i = 0; i < x.size(); ++i) n += x[i] != y[i];
  return n;
}

/// Variables of the given shapes (uniform in [-1, 1)), equal in `a` and `b`.
void make_variables(const std::vector<td::Shape>& shapes, td::DType dtype,
                    std::vector<td::Variable>& a, std::vector<td::Variable>& b) {
  td::Generator generator(/*seed=*/7);
  for (size_t i = 0; i < shapes.size(); ++i) {
    const td::Tensor w = td::Tensor::uniform(shapes[i], generator, -1.0, 1.0, dtype);
    const std::string name = std::string("w").append(std::to_string(i));
    a.push_back(td::Variable(name, w.clone()));
    b.push_back(td::Variable(name, w.clone()));
  }
}

const std::vector<td::Shape> kShapes{
    td::Shape{1},         // one element
    td::Shape{7},         // odd, shorter than a vector register row
    td::Shape{31, 9},     // odd length (279)
    td::Shape{257, 513},  // 131841 elements (odd): the CPU loop splits it across threads
};

/// Runs `calls` apply_gradients calls of `fused` and `reference` on equal variables and
/// gradients, checking after each call that variables and slots are bitwise equal.
void check_bitwise(optim::Optimizer& fused, optim::Optimizer& reference, td::DType dtype,
                   int calls) {
  std::vector<td::Variable> fused_vars, reference_vars;
  make_variables(kShapes, dtype, fused_vars, reference_vars);
  td::Generator generator(/*seed=*/11);
  for (int call = 0; call < calls; ++call) {
    std::vector<td::Tensor> grads;
    for (const td::Shape& shape : kShapes)
      grads.push_back(td::Tensor::uniform(shape, generator, -2.0, 2.0, dtype));
    fused.apply_gradients(grads, fused_vars);
    reference.apply_gradients(grads, reference_vars);
    for (size_t i = 0; i < kShapes.size(); ++i) {
      INFO("call " << call + 1 << ", variable " << kShapes[i]);
      const td::Tensor fw = fused_vars[i].value(), rw = reference_vars[i].value();
      CHECK(count_different(fw, rw) == 0);
      CHECK(bitwise_equal(fw, rw));
    }
    const auto fused_slots = fused.slot_variables();
    const auto reference_slots = reference.slot_variables();
    REQUIRE(fused_slots.size() == reference_slots.size());
    for (size_t i = 0; i < fused_slots.size(); ++i) {
      INFO("call " << call + 1 << ", slot " << fused_slots[i].first);
      CHECK(bitwise_equal(fused_slots[i].second.value(), reference_slots[i].second.value()));
    }
  }
  CHECK(fused.iterations() == reference.iterations());
  CHECK(fused.iterations() == calls / fused.gradient_accumulation_steps());
  // The updates did move the variables (a test of nothing would pass too). One element may
  // come back where it was: Lion moves every element by exactly +-lr, so two updates of
  // opposite signs cancel; among the 7 and more elements of the others some do not.
  std::vector<td::Variable> initial, unused;
  make_variables(kShapes, dtype, initial, unused);
  for (size_t i = 0; i < kShapes.size(); ++i)
    if (kShapes[i].numel() > 1)
      CHECK(count_different(fused_vars[i].value(), initial[i].value()) > 0);
}

/// Gradient accumulation and clipping settings every optimizer is run with.
struct Schedule {
  int accumulation = 1;
  std::optional<double> clipnorm;
  int calls = 5;
};
const std::vector<Schedule> kSchedules{
    {.accumulation = 1, .clipnorm = std::nullopt, .calls = 5},
    {.accumulation = 1, .clipnorm = 1.0, .calls = 5},  // the gradients' norms are far above 1
    {.accumulation = 3, .clipnorm = 0.5, .calls = 7},  // two updates and a partial one
};

}  // namespace

TEST_CASE("Fused SGD, momentum and Nesterov equal the separate ops bit for bit",
          "[cpu][optim][fused]") {
  for (td::DType dtype : {td::DType::kFloat32, td::DType::kFloat64}) {
    for (const Schedule& s : kSchedules) {
      for (double momentum : {0.0, 0.9}) {
        for (bool nesterov : {false, true}) {
          if (momentum == 0.0 && nesterov) continue;
          INFO(dtype << ", momentum " << momentum << (nesterov ? " nesterov" : "")
                     << ", accumulation " << s.accumulation << ", clipnorm "
                     << s.clipnorm.value_or(0.0));
          const optim::SGD::Options options{.learning_rate = 0.05,
                                            .momentum = momentum,
                                            .nesterov = nesterov,
                                            .global_clipnorm = s.clipnorm,
                                            .gradient_accumulation_steps = s.accumulation};
          optim::SGD fused(options);
          ReferenceSgd reference(options);
          check_bitwise(fused, reference, dtype, s.calls);
        }
      }
    }
  }
}

TEST_CASE("Fused Adam and AdamW equal the separate ops bit for bit", "[cpu][optim][fused]") {
  for (td::DType dtype : {td::DType::kFloat32, td::DType::kFloat64}) {
    for (const Schedule& s : kSchedules) {
      INFO(dtype << ", accumulation " << s.accumulation << ", clipnorm "
                 << s.clipnorm.value_or(0.0));
      {
        INFO("Adam");
        const optim::Adam::Options options{.learning_rate = 0.01,
                                           .global_clipnorm = s.clipnorm,
                                           .gradient_accumulation_steps = s.accumulation};
        optim::Adam fused(options);
        ReferenceAdam reference(options);
        check_bitwise(fused, reference, dtype, s.calls);
      }
      {
        INFO("AdamW");
        const optim::AdamW::Options options{.learning_rate = 0.01,
                                            .weight_decay = 0.05,
                                            .beta_1 = 0.8,
                                            .beta_2 = 0.99,
                                            .epsilon = 1e-6,
                                            .global_clipnorm = s.clipnorm,
                                            .gradient_accumulation_steps = s.accumulation};
        optim::AdamW fused(options);
        ReferenceAdamW reference(options);
        check_bitwise(fused, reference, dtype, s.calls);
      }
    }
  }
}

TEMPLATE_TEST_CASE("Lion's sign: +-1, a zero or NaN itself, as tf.sign", "[cpu][optim][fused]",
                   float, double) {
  using T = TestType;
  using ops::kernels::sign_of;
  const T inf = std::numeric_limits<T>::infinity();
  const T tiny = std::numeric_limits<T>::denorm_min();
  CHECK(sign_of(T(2.5)) == T(1));
  CHECK(sign_of(T(-1e-30)) == T(-1));
  CHECK(sign_of(tiny) == T(1));
  CHECK(sign_of(-tiny) == T(-1));
  CHECK(sign_of(inf) == T(1));
  CHECK(sign_of(-inf) == T(-1));
  CHECK(sign_of(T(0)) == T(0));
  CHECK_FALSE(std::signbit(sign_of(T(0))));
  CHECK(std::signbit(sign_of(-T(0))));
  CHECK(std::isnan(sign_of(std::numeric_limits<T>::quiet_NaN())));
  CHECK(std::isnan(sign_of(-std::numeric_limits<T>::quiet_NaN())));
}

TEST_CASE("Fused Lion equals the separate ops bit for bit", "[cpu][optim][fused]") {
  for (td::DType dtype : {td::DType::kFloat32, td::DType::kFloat64}) {
    for (const Schedule& s : kSchedules) {
      for (const double weight_decay : {0.0, 0.1}) {
        INFO(dtype << ", accumulation " << s.accumulation << ", clipnorm "
                   << s.clipnorm.value_or(0.0) << ", weight decay " << weight_decay);
        const optim::Lion::Options options{.learning_rate = 0.003,
                                           .beta_1 = 0.85,
                                           .beta_2 = 0.98,
                                           .weight_decay = weight_decay,
                                           .global_clipnorm = s.clipnorm,
                                           .gradient_accumulation_steps = s.accumulation};
        optim::Lion fused(options);
        ReferenceLion reference(options);
        check_bitwise(fused, reference, dtype, s.calls);
      }
    }
  }
}

TEST_CASE("Batched fused updates equal the single-variable updates bit for bit",
          "[cpu][optim][fused]") {
  // Mixed sizes (empty, one element, odd, split across threads) and both float dtypes in one
  // call: the batched form must give each variable exactly its single-variable update.
  struct Spec {
    td::Shape shape;
    td::DType dtype;
  };
  const std::vector<Spec> specs{{td::Shape{0}, td::DType::kFloat32},
                                {td::Shape{1}, td::DType::kFloat32},
                                {td::Shape{31, 9}, td::DType::kFloat64},
                                {td::Shape{257, 513}, td::DType::kFloat32},
                                {td::Shape{5}, td::DType::kFloat64}};
  const size_t n = specs.size();
  td::Generator generator(/*seed=*/21);
  auto randoms = [&] {
    std::vector<td::Tensor> out;
    for (const Spec& s : specs)
      out.push_back(td::Tensor::uniform(s.shape, generator, -1.0, 1.0, s.dtype));
    return out;
  };
  auto clones = [](const std::vector<td::Tensor>& ts) {
    std::vector<td::Tensor> out;
    for (const td::Tensor& t : ts) out.push_back(t.clone());
    return out;
  };
  // Batched (b_) and single (s_) copies of every variable and slot.
  std::vector<td::Tensor> b_sgd = randoms(), b_mom = randoms(), b_nes = randoms(),
                          b_adam = randoms(), b_vel = randoms(), b_nvel = randoms(),
                          b_m = randoms(), b_v = clones(randoms());
  for (td::Tensor& v : b_v) v = ops::abs(v);  // a second moment is not negative
  std::vector<td::Tensor> s_sgd = clones(b_sgd), s_mom = clones(b_mom), s_nes = clones(b_nes),
                          s_adam = clones(b_adam), s_vel = clones(b_vel), s_nvel = clones(b_nvel),
                          s_m = clones(b_m), s_v = clones(b_v);
  const std::vector<td::Tensor> initial_adam = clones(b_adam);
  const ops::AdamStep adamw{.alpha = 1e-2,
                            .one_minus_beta_1 = 0.1,
                            .one_minus_beta_2 = 1e-3,
                            .epsilon = 1e-7,
                            .weight_decay = 0.05,
                            .learning_rate = 1e-2};
  for (int step = 0; step < 3; ++step) {
    const std::vector<td::Tensor> g = randoms();
    ops::sgd_update_(b_sgd, g, 0.1);
    ops::sgd_momentum_update_(b_mom, g, b_vel, 0.1, 0.9, /*nesterov=*/false);
    ops::sgd_momentum_update_(b_nes, g, b_nvel, 0.1, 0.9, /*nesterov=*/true);
    ops::adam_update_(b_adam, g, b_m, b_v, adamw);
    for (size_t i = 0; i < n; ++i) {
      ops::sgd_update_(s_sgd[i], g[i], 0.1);
      ops::sgd_momentum_update_(s_mom[i], g[i], s_vel[i], 0.1, 0.9, /*nesterov=*/false);
      ops::sgd_momentum_update_(s_nes[i], g[i], s_nvel[i], 0.1, 0.9, /*nesterov=*/true);
      ops::adam_update_(s_adam[i], g[i], s_m[i], s_v[i], adamw);
    }
    for (size_t i = 0; i < n; ++i) {
      INFO("step " << step + 1 << ", variable " << i << " " << specs[i].shape << " "
                   << specs[i].dtype);
      CHECK(bitwise_equal(b_sgd[i], s_sgd[i]));
      CHECK(bitwise_equal(b_mom[i], s_mom[i]));
      CHECK(bitwise_equal(b_vel[i], s_vel[i]));
      CHECK(bitwise_equal(b_nes[i], s_nes[i]));
      CHECK(bitwise_equal(b_nvel[i], s_nvel[i]));
      CHECK(bitwise_equal(b_adam[i], s_adam[i]));
      CHECK(bitwise_equal(b_m[i], s_m[i]));
      CHECK(bitwise_equal(b_v[i], s_v[i]));
    }
  }
  for (size_t i = 1; i < n; ++i) CHECK(count_different(b_adam[i], initial_adam[i]) > 0);
}

TEST_CASE("Fused updates work in place and allocate nothing", "[cpu][optim][fused]") {
  td::Generator generator(/*seed=*/3);
  const td::Shape shape{257, 513};
  td::Tensor w = td::Tensor::uniform(shape, generator, -1.0, 1.0);
  const td::Tensor g = td::Tensor::uniform(shape, generator, -1.0, 1.0);
  td::Tensor m = td::Tensor::zeros(shape), v = td::Tensor::zeros(shape);
  td::Tensor velocity = td::Tensor::zeros(shape);
  const void* w_data = w.raw_data();
  const std::vector<float> before = w.to_vector<float>();

  td::Allocator& allocator = td::allocator_for(td::Device::cpu());
  const uint64_t requests = allocator.stats().requests;
  ops::sgd_update_(w, g, 0.1);
  ops::sgd_momentum_update_(w, g, velocity, 0.1, 0.9, /*nesterov=*/true);
  ops::adam_update_(w, g, m, v,
                    {.alpha = 1e-3,
                     .one_minus_beta_1 = 0.1,
                     .one_minus_beta_2 = 1e-3,
                     .epsilon = 1e-7,
                     .weight_decay = 4e-3,
                     .learning_rate = 1e-3});
  CHECK(allocator.stats().requests == requests);
  CHECK(w.raw_data() == w_data);

  // Element 0 by hand, in float, in the functors' order.
  const float g0 = g.to_vector<float>()[0];
  float w0 = before[0];
  w0 = w0 - g0 * 0.1f;
  float vel = 0.0f * 0.9f - g0 * 0.1f;
  w0 = w0 + (vel * 0.9f - g0 * 0.1f);
  w0 = w0 - (w0 * 4e-3f) * 1e-3f;
  const float m0 = 0.0f + (g0 - 0.0f) * 0.1f;
  const float v0 = 0.0f + (g0 * g0 - 0.0f) * 1e-3f;
  w0 = w0 - (m0 * 1e-3f) / (std::sqrt(v0) + 1e-7f);
  CHECK(velocity.to_vector<float>()[0] == vel);
  CHECK(m.to_vector<float>()[0] == m0);
  CHECK(v.to_vector<float>()[0] == v0);
  CHECK(w.to_vector<float>()[0] == w0);
}

TEST_CASE("Fused updates name the argument that does not match", "[cpu][optim][fused]") {
  using Catch::Matchers::Contains;
  td::Tensor w = td::Tensor::zeros(td::Shape{4});
  td::Tensor m = td::Tensor::zeros(td::Shape{4});
  td::Tensor v = td::Tensor::zeros(td::Shape{4});
  const td::Tensor g = td::Tensor::zeros(td::Shape{4});
  td::Tensor short_v = td::Tensor::zeros(td::Shape{3});
  td::Tensor double_m = td::Tensor::zeros(td::Shape{4}, td::DType::kFloat64);
  td::Tensor ints = td::Tensor::zeros(td::Shape{4}, td::DType::kInt32);
  const ops::AdamStep step{.alpha = 1e-3, .one_minus_beta_1 = 0.1, .one_minus_beta_2 = 1e-3};

  CHECK_THROWS_WITH(ops::adam_update_(w, g, m, short_v, step),
                    Contains("adam_update_") && Contains("slot v has shape [3]") &&
                        Contains("variable has shape [4]"));
  CHECK_THROWS_WITH(ops::adam_update_(w, g, double_m, v, step),
                    Contains("slot m is float64") && Contains("variable is float32"));
  CHECK_THROWS_WITH(ops::sgd_update_(ints, ints, 0.1),
                    Contains("sgd_update_") && Contains("int32") && Contains("floating"));
  CHECK_THROWS_WITH(ops::sgd_momentum_update_(w, g, short_v, 0.1, 0.9, false),
                    Contains("velocity has shape [3]"));
  CHECK_THROWS_WITH(ops::sgd_update_(w, td::Tensor(), 0.1),
                    Contains("gradient is an undefined tensor"));
  CHECK_THROWS_WITH(ops::adam_update_(w, g, m, v, {.alpha = 1e-3, .weight_decay = -1.0}),
                    Contains("weight_decay must be >= 0, got -1"));

  // The batched forms count their arguments and say which variable is wrong.
  std::vector<td::Tensor> ws{w, td::Tensor::zeros(td::Shape{2})};
  std::vector<td::Tensor> gs{g, td::Tensor::zeros(td::Shape{3})};
  std::vector<td::Tensor> ms_short{m};
  CHECK_THROWS_WITH(ops::sgd_update_(ws, gs, 0.1),
                    Contains("gradient has shape [3]") && Contains("(variable 1 of 2)"));
  CHECK_THROWS_WITH(ops::sgd_update_(ws, std::vector<td::Tensor>{g}, 0.1),
                    Contains("2 variables but 1 gradients"));
  CHECK_THROWS_WITH(
      ops::sgd_momentum_update_(ws, std::vector<td::Tensor>{g, g}, ms_short, 0.1, 0.9, false),
      Contains("2 variables but 1 of the velocity slots"));
}
