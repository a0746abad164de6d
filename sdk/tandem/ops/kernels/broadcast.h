// BroadcastPlan: how a binary op walks its operands under numpy broadcasting, with the shapes
// collapsed to the fewest dimensions so that backends loop over contiguous inner runs without
// per-element index arithmetic (SelectPlan: the same for the three operands of where).
// Host-side; each backend turns the plan into its loops.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "tandem/core/shape.h"

namespace tandem::ops::kernels {

struct BroadcastPlan {
  int64_t numel = 0;  ///< output elements
  int64_t inner = 1;  ///< length of the innermost run (contiguous in the output)
  /// Whether a / b advance along the inner run; false: one element repeats across it.
  bool a_inner = true, b_inner = true;
  /// Collapsed outer dimensions, outermost first (empty when the output is one run: equal
  /// shapes, or a scalar operand).
  std::vector<int64_t> outer;
  /// Element strides of a and b along `outer` (0 where the operand is broadcast).
  std::vector<int64_t> a_strides, b_strides;
};

/// Plans out = f(a, b) for shapes that broadcast to `out` (checked by the caller).
inline BroadcastPlan make_broadcast_plan(const Shape& a, const Shape& b, const Shape& out) {
  struct Group {
    int64_t size;
    bool a_full, b_full;
  };
  BroadcastPlan plan;
  plan.numel = out.numel();
  if (plan.numel == 0) return plan;
  // Output dimensions of size 1 do not move anything; neighbouring dimensions where each
  // operand is either full or broadcast in the same way merge into one.
  std::vector<Group> groups;
  const int64_t rank = out.rank();
  for (int64_t k = 0; k < rank; ++k) {
    const int64_t d = out[k];
    if (d == 1) continue;
    const int64_t ka = k - (rank - a.rank()), kb = k - (rank - b.rank());
    const bool a_full = ka >= 0 && a[ka] == d, b_full = kb >= 0 && b[kb] == d;
    if (!groups.empty() && groups.back().a_full == a_full && groups.back().b_full == b_full)
      groups.back().size *= d;
    else
      groups.push_back({d, a_full, b_full});
  }
  if (groups.empty()) return plan;  // one element: inner = 1, both operands advance
  const Group last = groups.back();
  groups.pop_back();
  plan.inner = last.size;
  plan.a_inner = last.a_full;
  plan.b_inner = last.b_full;
  const size_t n = groups.size();
  plan.outer.resize(n);
  plan.a_strides.resize(n);
  plan.b_strides.resize(n);
  int64_t a_step = last.a_full ? last.size : 1, b_step = last.b_full ? last.size : 1;
  for (size_t i = n; i-- > 0;) {
    plan.outer[i] = groups[i].size;
    plan.a_strides[i] = groups[i].a_full ? a_step : 0;
    plan.b_strides[i] = groups[i].b_full ? b_step : 0;
    if (groups[i].a_full) a_step *= groups[i].size;
    if (groups[i].b_full) b_step *= groups[i].size;
  }
  return plan;
}

/// BroadcastPlan for the three operands of a select (where): operand 0 is the condition, 1 and 2
/// the values it picks between.
struct SelectPlan {
  static constexpr size_t kOperands = 3;
  int64_t numel = 0;  ///< output elements
  int64_t inner = 1;  ///< length of the innermost run (contiguous in the output)
  /// Whether each operand advances along the inner run; false: one element repeats across it.
  std::array<bool, kOperands> advances = {true, true, true};
  /// Collapsed outer dimensions, outermost first (empty when the output is one run).
  std::vector<int64_t> outer;
  /// Element strides of each operand along `outer` (0 where it is broadcast).
  std::array<std::vector<int64_t>, kOperands> strides;
};

/// Plans out = f(c, a, b) for shapes that broadcast to `out` (checked by the caller), collapsing
/// dimensions as make_broadcast_plan does.
inline SelectPlan make_select_plan(const Shape& c, const Shape& a, const Shape& b,
                                   const Shape& out) {
  constexpr size_t kN = SelectPlan::kOperands;
  using Full = std::array<bool, kN>;
  struct Group {
    int64_t size;
    Full full;
  };
  const std::array<const Shape*, kN> shapes = {&c, &a, &b};
  SelectPlan plan;
  plan.numel = out.numel();
  if (plan.numel == 0) return plan;
  std::vector<Group> groups;
  const int64_t rank = out.rank();
  for (int64_t k = 0; k < rank; ++k) {
    const int64_t d = out[k];
    if (d == 1) continue;
    Full full{};
    for (size_t j = 0; j < kN; ++j) {
      const int64_t kj = k - (rank - shapes[j]->rank());
      full[j] = kj >= 0 && (*shapes[j])[kj] == d;
    }
    if (!groups.empty() && groups.back().full == full)
      groups.back().size *= d;
    else
      groups.push_back({d, full});
  }
  if (groups.empty()) return plan;  // one element: inner = 1, every operand advances
  const Group last = groups.back();
  groups.pop_back();
  plan.inner = last.size;
  plan.advances = last.full;
  const size_t n = groups.size();
  plan.outer.resize(n);
  std::array<int64_t, kN> step{};
  for (size_t j = 0; j < kN; ++j) {
    plan.strides[j].resize(n);
    step[j] = last.full[j] ? last.size : 1;
  }
  for (size_t i = n; i-- > 0;) {
    plan.outer[i] = groups[i].size;
    for (size_t j = 0; j < kN; ++j) {
      plan.strides[j][i] = groups[i].full[j] ? step[j] : 0;
      if (groups[i].full[j]) step[j] *= groups[i].size;
    }
  }
  return plan;
}

}  // namespace tandem::ops::kernels
