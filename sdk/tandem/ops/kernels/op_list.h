// The one list of elementwise op x dtype: every backend instantiates its loops from these
// X-macros, so the CPU and CUDA backends support exactly the same combinations.
#pragma once

#include <cstdint>

#include "tandem/core/half.h"

// The lists are laid out by hand (the formatter's macro layout is harder to scan).
// clang-format off
// ---- dtypes: X(F, T) for each C++ element type T ---------------------------------------------
#define TANDEM_FLOATING_TYPES(X, F) X(F, float) X(F, double)
#define TANDEM_NUMERIC_TYPES(X, F) \
  X(F, float) X(F, double) X(F, int32_t) X(F, int64_t) X(F, uint8_t)
#define TANDEM_ALL_TYPES(X, F) TANDEM_NUMERIC_TYPES(X, F) X(F, bool)
/// The 16-bit floating types (core/half.h); their elementwise math and sums run in float32.
#define TANDEM_HALF_TYPES(X, F) X(F, bfloat16) X(F, float16)
#define TANDEM_ANY_FLOATING_TYPES(X, F) TANDEM_FLOATING_TYPES(X, F) TANDEM_HALF_TYPES(X, F)
#define TANDEM_ANY_NUMERIC_TYPES(X, F) TANDEM_NUMERIC_TYPES(X, F) TANDEM_HALF_TYPES(X, F)
#define TANDEM_EVERY_TYPE(X, F) TANDEM_ALL_TYPES(X, F) TANDEM_HALF_TYPES(X, F)

// ---- functors of ops/kernels/functors.h: X(Functor) ------------------------------------------
/// (x) -> y on the floating types (float32, float64, bfloat16, float16).
#define TANDEM_FLOATING_UNARY_FUNCTORS(X)                                                  \
  X(Neg) X(Abs) X(Exp) X(Log) X(Log1p) X(Sqrt) X(Square) X(Pow) X(Clip) X(Relu) X(Sigmoid) \
  X(Tanh) X(Gelu) X(GeluTanh)
/// (x) -> y on every numeric type, the 16-bit ones included.
#define TANDEM_NUMERIC_UNARY_FUNCTORS(X) X(Scale)
/// (a, b) -> same type on the floating types (mostly the backward functors).
#define TANDEM_FLOATING_BINARY_FUNCTORS(X)                                                   \
  X(Div) X(First) X(AbsGrad) X(Log1pGrad) X(SqrtGrad) X(SquareGrad) X(PowGrad) X(ClipGrad) \
  X(ReluGrad) X(SigmoidGrad) X(TanhGrad) X(GeluGrad) X(GeluTanhGrad) X(MaximumMask)        \
  X(MinimumMask) X(AddRelu)
/// (a, b) -> same type on every numeric type, the 16-bit ones included.
#define TANDEM_NUMERIC_BINARY_FUNCTORS(X) \
  X(Add) X(Sub) X(Mul) X(Maximum) X(Minimum) X(AddScaled)
/// (a, b) -> bool on every type, the 16-bit ones included (compared in float32, exactly).
#define TANDEM_COMPARISON_FUNCTORS(X)                                                  \
  X(Equal) X(NotEqual) X(Greater) X(GreaterEqual) X(Less) X(LessEqual) X(LogicalAnd) \
  X(LogicalOr)
/// (x) -> bool on every type.
#define TANDEM_PREDICATE_FUNCTORS(X) X(LogicalNot)
/// (bool condition, a, b) -> the type of a and b, on every type.
#define TANDEM_SELECT_FUNCTORS(X) X(Select)
// clang-format on
