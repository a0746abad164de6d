// The fused optimizer updates: argument checks and the dispatch of the shared update functors
// (ops/kernels/optimizer_functors.h) to the CPU loop or the CUDA multi-tensor kernel. The
// single-variable forms are the batched forms over one variable.
#include "tandem/ops/optimizer_updates.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "tandem/ops/cpu/optimizer_updates.h"
#include "tandem/ops/internal/dispatch.h"
#include "tandem/ops/internal/update_launches.h"

namespace tandem::ops {

namespace k = kernels;

using internal::dispatch;
using internal::ptr;

namespace {

std::atomic<uint64_t> cuda_launches{0};

/// Where a bad argument is: nothing for a single variable, " (variable 3 of 5)" in a batch.
std::string position(size_t i, size_t count) {
  if (count == 1) return "";
  return detail::str_cat(" (variable ", i, " of ", count, ")");
}

/// Raises unless `variable` holds floating-point values and each of `others` (named by
/// `names`) matches its shape and dtype; `where` ends each message.
template <size_t kOthers>
void check_update(std::string_view op, const std::string& where, const Tensor& variable,
                  const std::array<const Tensor*, kOthers>& others,
                  const std::array<const char*, kOthers>& names) {
  TANDEM_CHECK(variable.defined(), op, ": the variable is an undefined tensor", where);
  TANDEM_CHECK(is_floating(variable.dtype()), op, ": the variable holds ", variable.dtype(),
               "; optimizer updates need a floating dtype", where);
  for (size_t j = 0; j < kOthers; ++j) {
    const Tensor& t = *others[j];
    TANDEM_CHECK(t.defined(), op, ": the ", names[j], " is an undefined tensor", where);
    TANDEM_CHECK(t.shape() == variable.shape(), op, ": the ", names[j], " has shape ", t.shape(),
                 " but the variable has shape ", variable.shape(), where);
    TANDEM_CHECK(t.dtype() == variable.dtype(), op, ": the ", names[j], " is ", t.dtype(),
                 " but the variable is ", variable.dtype(), where);
  }
}

/// The batched update behind every entry point: checks each variable with its gradient and
/// its kSlots slots (slots[s][i] is slot s of variable i), then, for each dtype and device
/// among the variables, builds the update functor with make_functor.template operator()<T>()
/// and runs it: variable by variable on the CPU, in one multi-tensor launch on CUDA.
template <size_t kSlots, typename MakeFunctor>
void update_all(std::string_view op, std::span<Tensor> variables, std::span<const Tensor> gradients,
                const std::array<std::span<Tensor>, kSlots>& slots,
                const std::array<const char*, kSlots + 1>& names, const MakeFunctor& make_functor) {
  const size_t count = variables.size();
  TANDEM_CHECK(gradients.size() == count, op, ": ", count, " variables but ", gradients.size(),
               " gradients");
  for (size_t s = 1; const std::span<Tensor>& kind : slots) {
    TANDEM_CHECK(kind.size() == count, op, ": ", count, " variables but ", kind.size(), " of the ",
                 names[s++], " slots");
  }
  for (size_t i = 0; i < count; ++i) {
    std::array<const Tensor*, kSlots + 1> others{&gradients[i]};
    for (size_t s = 1; const std::span<Tensor>& kind : slots) others[s++] = &kind[i];
    const std::string where = position(i, count);
    check_update(op, where, variables[i], others, names);
    for (const Tensor* t : others) {
      TANDEM_CHECK(t->device() == variables[i].device(), op, ": the variable is on ",
                   variables[i].device(), " and its tensors on ", t->device(),
                   "; move them with .to(device) first", where);
    }
  }

  // Groups of variables sharing a dtype and a device, in order of first appearance.
  std::vector<std::vector<size_t>> groups;
  for (size_t i = 0; i < count; ++i) {
    if (variables[i].numel() == 0) continue;
    auto same = [&](const std::vector<size_t>& g) {
      return variables[g[0]].dtype() == variables[i].dtype() &&
             variables[g[0]].device() == variables[i].device();
    };
    auto it = std::find_if(groups.begin(), groups.end(), same);
    if (it == groups.end()) {
      groups.push_back({i});
    } else {
      it->push_back(i);
    }
  }

  for (const std::vector<size_t>& group : groups) {
    const Tensor& first = variables[group[0]];
    dispatch_floating(first.dtype(), op, [&]<typename T>() {
      const auto f = make_functor.template operator()<T>();
      dispatch(
          op, first.device(),
          [&] {
            for (size_t i : group) {
              std::array<T*, kSlots + 1> slot_data{};  // one more: never empty
              for (size_t s = 0; const std::span<Tensor>& kind : slots)
                slot_data[s++] = ptr<T>(kind[i]);
              cpu::optimizer_update(f, variables[i].numel(), ptr<T>(variables[i]),
                                    ptr<T>(gradients[i]), slot_data.data());
            }
          },
          TANDEM_ON_CUDA({
            std::vector<cuda::UpdateOperands<T>> operands;
            operands.reserve(group.size());
            for (size_t i : group) {
              cuda::UpdateOperands<T> o{.variable = ptr<T>(variables[i]),
                                        .gradient = ptr<T>(gradients[i]),
                                        .slots = {},
                                        .numel = variables[i].numel()};
              for (size_t s = 0; const std::span<Tensor>& kind : slots)
                o.slots[s++] = ptr<T>(kind[i]);
              operands.push_back(o);
            }
            cuda_launches += static_cast<uint64_t>(cuda::optimizer_update(f, operands, stream));
          }));
    });
  }
}

}  // namespace

template <template <typename> class Rule>
void fused_update_(std::string_view op, std::span<Tensor> variables,
                   std::span<const Tensor> gradients, std::span<const std::span<Tensor>> slots,
                   std::span<const char* const> slot_names, const Rule<float>& f32,
                   const Rule<double>& f64) {
  constexpr size_t kSlots = Rule<float>::kSlots;
  TANDEM_CHECK(slots.size() == kSlots && slot_names.size() == kSlots, op, ": the update keeps ",
               kSlots, " slots per variable, got ", slots.size(), " kinds and ", slot_names.size(),
               " names");
  std::array<std::span<Tensor>, kSlots> slot_kinds;
  std::array<const char*, kSlots + 1> names{"gradient"};
  std::copy(slots.begin(), slots.end(), slot_kinds.begin());
  std::copy(slot_names.begin(), slot_names.end(), names.begin() + 1);
  update_all<kSlots>(op, variables, gradients, slot_kinds, names, [&]<typename T>() {
    if constexpr (std::is_same_v<T, float>) {
      return f32;
    } else {
      return f64;
    }
  });
}

#define TANDEM_FUSED_UPDATE(Rule)                                                              \
  template void fused_update_<k::Rule>(                                                        \
      std::string_view, std::span<Tensor>, std::span<const Tensor>,                            \
      std::span<const std::span<Tensor>>, std::span<const char* const>, const k::Rule<float>&, \
      const k::Rule<double>&);
TANDEM_FUSED_UPDATE_RULES(TANDEM_FUSED_UPDATE)
#undef TANDEM_FUSED_UPDATE

void sgd_update_(std::span<Tensor> variables, std::span<const Tensor> gradients,
                 double learning_rate) {
  update_all<0>("sgd_update_", variables, gradients, {}, {"gradient"},
                [&]<typename T>() { return k::SgdUpdate<T>{static_cast<T>(learning_rate)}; });
}

void sgd_momentum_update_(std::span<Tensor> variables, std::span<const Tensor> gradients,
                          std::span<Tensor> velocities, double learning_rate, double momentum,
                          bool nesterov) {
  update_all<1>("sgd_momentum_update_", variables, gradients, {velocities},
                {"gradient", "velocity"}, [&]<typename T>() {
                  return k::SgdMomentumUpdate<T>{static_cast<T>(learning_rate),
                                                 static_cast<T>(momentum), nesterov};
                });
}

void adam_update_(std::span<Tensor> variables, std::span<const Tensor> gradients,
                  std::span<Tensor> m, std::span<Tensor> v, const AdamStep& step) {
  TANDEM_CHECK(step.weight_decay >= 0.0, "adam_update_: weight_decay must be >= 0, got ",
               step.weight_decay);
  update_all<2>("adam_update_", variables, gradients, {m, v}, {"gradient", "slot m", "slot v"},
                [&]<typename T>() {
                  return k::AdamUpdate<T>{.alpha = static_cast<T>(step.alpha),
                                          .one_minus_beta_1 = static_cast<T>(step.one_minus_beta_1),
                                          .one_minus_beta_2 = static_cast<T>(step.one_minus_beta_2),
                                          .epsilon = static_cast<T>(step.epsilon),
                                          .decay = step.weight_decay > 0.0,
                                          .weight_decay = static_cast<T>(step.weight_decay),
                                          .learning_rate = static_cast<T>(step.learning_rate)};
                });
}

void sgd_update_(Tensor& variable, const Tensor& gradient, double learning_rate) {
  sgd_update_(std::span<Tensor>(&variable, 1), std::span<const Tensor>(&gradient, 1),
              learning_rate);
}

void sgd_momentum_update_(Tensor& variable, const Tensor& gradient, Tensor& velocity,
                          double learning_rate, double momentum, bool nesterov) {
  sgd_momentum_update_(std::span<Tensor>(&variable, 1), std::span<const Tensor>(&gradient, 1),
                       std::span<Tensor>(&velocity, 1), learning_rate, momentum, nesterov);
}

void adam_update_(Tensor& variable, const Tensor& gradient, Tensor& m, Tensor& v,
                  const AdamStep& step) {
  adam_update_(std::span<Tensor>(&variable, 1), std::span<const Tensor>(&gradient, 1),
               std::span<Tensor>(&m, 1), std::span<Tensor>(&v, 1), step);
}

namespace internal {
uint64_t optimizer_update_launches() { return cuda_launches.load(); }
}  // namespace internal

}  // namespace tandem::ops
