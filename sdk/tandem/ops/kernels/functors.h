// Elementwise math, written once for every backend: forward and backward functors marked
// TANDEM_HD, compiled by the C++ compiler for the CPU loops and by nvcc for CUDA kernels.
// Keep this header free of host-only calls: only the C math functions both sides provide.
#pragma once

#include <cmath>

#include "tandem/core/host_device.h"

namespace tandem::ops::kernels {

// float and double overloads of the C math functions (the float ones are the `f`-suffixed C
// functions, so float math stays in float on both host and device).
namespace math {
TANDEM_HD_INLINE float exp(float x) { return ::expf(x); }
TANDEM_HD_INLINE double exp(double x) { return ::exp(x); }
TANDEM_HD_INLINE float log(float x) { return ::logf(x); }
TANDEM_HD_INLINE double log(double x) { return ::log(x); }
TANDEM_HD_INLINE float log1p(float x) { return ::log1pf(x); }
TANDEM_HD_INLINE double log1p(double x) { return ::log1p(x); }
TANDEM_HD_INLINE float sqrt(float x) { return ::sqrtf(x); }
TANDEM_HD_INLINE double sqrt(double x) { return ::sqrt(x); }
TANDEM_HD_INLINE float tanh(float x) { return ::tanhf(x); }
TANDEM_HD_INLINE double tanh(double x) { return ::tanh(x); }
TANDEM_HD_INLINE float erf(float x) { return ::erff(x); }
TANDEM_HD_INLINE double erf(double x) { return ::erf(x); }
TANDEM_HD_INLINE float pow(float x, float e) { return ::powf(x, e); }
TANDEM_HD_INLINE double pow(double x, double e) { return ::pow(x, e); }
TANDEM_HD_INLINE float abs(float x) { return ::fabsf(x); }
TANDEM_HD_INLINE double abs(double x) { return ::fabs(x); }
}  // namespace math

constexpr double kSqrtHalf = 0.70710678118654752440;       // 1 / sqrt(2)
constexpr double kSqrtTwoOverPi = 0.79788456080286535588;  // sqrt(2 / pi)
constexpr double kInvSqrtTwoPi = 0.39894228040143267794;   // 1 / sqrt(2 pi)
constexpr double kGeluCubic = 0.044715;                    // the tanh approximation's x^3 term

// ---- binary forward: (a, b) -> out ----------------------------------------------------------

struct Add {
  template <typename T>
  TANDEM_HD_INLINE T operator()(T a, T b) const {
    return static_cast<T>(a + b);
  }
};
struct Sub {
  template <typename T>
  TANDEM_HD_INLINE T operator()(T a, T b) const {
    return static_cast<T>(a - b);
  }
};
struct Mul {
  template <typename T>
  TANDEM_HD_INLINE T operator()(T a, T b) const {
    return static_cast<T>(a * b);
  }
};
struct Div {
  template <typename T>
  TANDEM_HD_INLINE T operator()(T a, T b) const {
    return a / b;
  }
};
/// Ties pick `a` (its gradient goes to `a` too: see MaximumMask).
struct Maximum {
  template <typename T>
  TANDEM_HD_INLINE T operator()(T a, T b) const {
    return a < b ? b : a;
  }
};
struct Minimum {
  template <typename T>
  TANDEM_HD_INLINE T operator()(T a, T b) const {
    return b < a ? b : a;
  }
};
// Comparisons follow IEEE 754 (as NumPy and TensorFlow): a comparison with a NaN is false,
// except NotEqual, which is true.
struct Equal {
  template <typename T>
  TANDEM_HD_INLINE bool operator()(T a, T b) const {
    return a == b;
  }
};
struct NotEqual {
  template <typename T>
  TANDEM_HD_INLINE bool operator()(T a, T b) const {
    return a != b;
  }
};
struct Greater {
  template <typename T>
  TANDEM_HD_INLINE bool operator()(T a, T b) const {
    return a > b;
  }
};
struct GreaterEqual {
  template <typename T>
  TANDEM_HD_INLINE bool operator()(T a, T b) const {
    return a >= b;
  }
};
struct Less {
  template <typename T>
  TANDEM_HD_INLINE bool operator()(T a, T b) const {
    return a < b;
  }
};
struct LessEqual {
  template <typename T>
  TANDEM_HD_INLINE bool operator()(T a, T b) const {
    return a <= b;
  }
};
// The logical ops read any element as a truth value: nonzero (NaN included) is true, as a cast
// to bool reads it.
struct LogicalAnd {
  template <typename T>
  TANDEM_HD_INLINE bool operator()(T a, T b) const {
    return a != T(0) && b != T(0);
  }
};
struct LogicalOr {
  template <typename T>
  TANDEM_HD_INLINE bool operator()(T a, T b) const {
    return a != T(0) || b != T(0);
  }
};
/// Returns `a`: broadcasting `a` to the output shape (backward of reductions and sum_to).
struct First {
  template <typename T>
  TANDEM_HD_INLINE T operator()(T a, T /*b*/) const {
    return a;
  }
};
/// a + alpha * b (the in-place add_).
struct AddScaled {
  double alpha;
  template <typename T>
  TANDEM_HD_INLINE T operator()(T a, T b) const {
    return static_cast<T>(a + static_cast<T>(alpha) * b);
  }
};

// ---- select: (condition, a, b) -> a or b -----------------------------------------------------

/// a where the condition holds, else b (the forward of where, and its backward with a zero for
/// a or b). The elements pass through as they are, not widened: a select computes nothing.
struct Select {
  template <typename T>
  TANDEM_HD_INLINE T operator()(bool condition, T a, T b) const {
    return condition ? a : b;
  }
};

// ---- unary forward: x -> y ------------------------------------------------------------------

/// (x) -> bool: x is zero (false as a truth value).
struct LogicalNot {
  template <typename T>
  TANDEM_HD_INLINE bool operator()(T x) const {
    return x == T(0);
  }
};

struct Neg {
  template <typename T>
  TANDEM_HD_INLINE T operator()(T x) const {
    return -x;
  }
};
struct Abs {
  template <typename T>
  TANDEM_HD_INLINE T operator()(T x) const {
    return math::abs(x);
  }
};
struct Exp {
  template <typename T>
  TANDEM_HD_INLINE T operator()(T x) const {
    return math::exp(x);
  }
};
struct Log {
  template <typename T>
  TANDEM_HD_INLINE T operator()(T x) const {
    return math::log(x);
  }
};
struct Log1p {
  template <typename T>
  TANDEM_HD_INLINE T operator()(T x) const {
    return math::log1p(x);
  }
};
struct Sqrt {
  template <typename T>
  TANDEM_HD_INLINE T operator()(T x) const {
    return math::sqrt(x);
  }
};
struct Square {
  template <typename T>
  TANDEM_HD_INLINE T operator()(T x) const {
    return x * x;
  }
};
struct Pow {
  double exponent;
  template <typename T>
  TANDEM_HD_INLINE T operator()(T x) const {
    return math::pow(x, static_cast<T>(exponent));
  }
};
struct Clip {
  double low, high;
  template <typename T>
  TANDEM_HD_INLINE T operator()(T x) const {
    const T lo = static_cast<T>(low), hi = static_cast<T>(high);
    return x < lo ? lo : (hi < x ? hi : x);
  }
};
/// x * factor (the in-place scale_).
struct Scale {
  double factor;
  template <typename T>
  TANDEM_HD_INLINE T operator()(T x) const {
    return static_cast<T>(x * static_cast<T>(factor));
  }
};
struct Relu {
  template <typename T>
  TANDEM_HD_INLINE T operator()(T x) const {
    return x > T(0) ? x : T(0);
  }
};
/// relu(a + b): a residual connection's add and ReLU in one pass (ops::add with kRelu).
struct AddRelu {
  template <typename T>
  TANDEM_HD_INLINE T operator()(T a, T b) const {
    return Relu{}(Add{}(a, b));
  }
};
struct Sigmoid {
  // exp(-x) overflows to inf for very negative x, and 1 / inf = 0 is the right limit.
  template <typename T>
  TANDEM_HD_INLINE T operator()(T x) const {
    return T(1) / (T(1) + math::exp(-x));
  }
};
struct Tanh {
  template <typename T>
  TANDEM_HD_INLINE T operator()(T x) const {
    return math::tanh(x);
  }
};
/// Exact GELU: x * Phi(x) = 0.5 x (1 + erf(x / sqrt(2))) (Keras' default).
struct Gelu {
  template <typename T>
  TANDEM_HD_INLINE T operator()(T x) const {
    return T(0.5) * x * (T(1) + math::erf(x * static_cast<T>(kSqrtHalf)));
  }
};
/// GELU's tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
struct GeluTanh {
  template <typename T>
  TANDEM_HD_INLINE T operator()(T x) const {
    const T u = static_cast<T>(kSqrtTwoOverPi) * (x + static_cast<T>(kGeluCubic) * x * x * x);
    return T(0.5) * x * (T(1) + math::tanh(u));
  }
};

// ---- backward: (x or y, upstream gradient g) -> input gradient ------------------------------
// Each names what its first argument is: the op's input x or its output y.

/// (x, g): sign(x) g, 0 at x = 0.
struct AbsGrad {
  template <typename T>
  TANDEM_HD_INLINE T operator()(T x, T g) const {
    return x > T(0) ? g : (x < T(0) ? -g : T(0));
  }
};
/// (x, g): g / (1 + x).
struct Log1pGrad {
  template <typename T>
  TANDEM_HD_INLINE T operator()(T x, T g) const {
    return g / (T(1) + x);
  }
};
/// (y, g): g / (2 y) with y = sqrt(x).
struct SqrtGrad {
  template <typename T>
  TANDEM_HD_INLINE T operator()(T y, T g) const {
    return T(0.5) * g / y;
  }
};
/// (x, g): 2 x g.
struct SquareGrad {
  template <typename T>
  TANDEM_HD_INLINE T operator()(T x, T g) const {
    return T(2) * x * g;
  }
};
/// (x, g): e x^(e-1) g.
struct PowGrad {
  double exponent;
  template <typename T>
  TANDEM_HD_INLINE T operator()(T x, T g) const {
    return g * static_cast<T>(exponent) * math::pow(x, static_cast<T>(exponent - 1.0));
  }
};
/// (x, g): g where low <= x <= high, else 0.
struct ClipGrad {
  double low, high;
  template <typename T>
  TANDEM_HD_INLINE T operator()(T x, T g) const {
    return (x >= static_cast<T>(low) && x <= static_cast<T>(high)) ? g : T(0);
  }
};
/// (x, g): g where x > 0.
struct ReluGrad {
  template <typename T>
  TANDEM_HD_INLINE T operator()(T x, T g) const {
    return x > T(0) ? g : T(0);
  }
};
/// (y, g): g y (1 - y), from the output y = sigmoid(x).
struct SigmoidGrad {
  template <typename T>
  TANDEM_HD_INLINE T operator()(T y, T g) const {
    return g * y * (T(1) - y);
  }
};
/// (y, g): g (1 - y^2), from the output y = tanh(x).
struct TanhGrad {
  template <typename T>
  TANDEM_HD_INLINE T operator()(T y, T g) const {
    return g * (T(1) - y * y);
  }
};
/// (x, g): g (Phi(x) + x phi(x)).
struct GeluGrad {
  template <typename T>
  TANDEM_HD_INLINE T operator()(T x, T g) const {
    const T cdf = T(0.5) * (T(1) + math::erf(x * static_cast<T>(kSqrtHalf)));
    const T pdf = static_cast<T>(kInvSqrtTwoPi) * math::exp(T(-0.5) * x * x);
    return g * (cdf + x * pdf);
  }
};
/// (x, g): derivative of the tanh approximation.
struct GeluTanhGrad {
  template <typename T>
  TANDEM_HD_INLINE T operator()(T x, T g) const {
    const T c = static_cast<T>(kSqrtTwoOverPi), k = static_cast<T>(kGeluCubic);
    const T t = math::tanh(c * (x + k * x * x * x));
    const T du = c * (T(1) + T(3) * k * x * x);
    return g * (T(0.5) * (T(1) + t) + T(0.5) * x * (T(1) - t * t) * du);
  }
};
/// (a, b) -> 1 where maximum(a, b) took a (a >= b), else 0.
struct MaximumMask {
  template <typename T>
  TANDEM_HD_INLINE T operator()(T a, T b) const {
    return a < b ? T(0) : T(1);
  }
};
/// (a, b) -> 1 where minimum(a, b) took a (a <= b), else 0.
struct MinimumMask {
  template <typename T>
  TANDEM_HD_INLINE T operator()(T a, T b) const {
    return b < a ? T(0) : T(1);
  }
};

}  // namespace tandem::ops::kernels
