// CPU elementwise loops: unary maps, broadcasting binary maps, the select of where and dtype
// conversion. The math comes from the functors in ops/kernels/functors.h; the instantiated
// functor x dtype pairs are those of ops/kernels/op_list.h.
#pragma once

#include <cstdint>

#include "tandem/core/dtype.h"
#include "tandem/ops/kernels/broadcast.h"
#include "tandem/ops/kernels/functors.h"

namespace tandem::ops::cpu {

/// y[i] = f(x[i]) for i < n, of type R (T, or bool for a predicate); y may alias x (in-place
/// ops).
template <typename F, typename T, typename R>
void unary(const F& f, int64_t n, const T* x, R* y);

/// y = f(a, b) walked as `plan` says; y may alias a when a is not broadcast (in-place ops).
template <typename F, typename T, typename R>
void binary(const F& f, const kernels::BroadcastPlan& plan, const T* a, const T* b, R* y);

/// y = f(condition, a, b) walked as `plan` says (where); the elements of a and b pass to f
/// unwidened.
template <typename F, typename T>
void select(const F& f, const kernels::SelectPlan& plan, const bool* condition, const T* a,
            const T* b, T* y);

/// y[i] = x[i] converted from `from` to `to` (nonzero -> true for bool).
void cast(DType from, DType to, int64_t n, const void* x, void* y);

}  // namespace tandem::ops::cpu
