// Element types of tensors, their sizes and names, and the compile-time mapping from C++ types.
#pragma once

#include <cstddef>
#include <cstdint>
#include <ostream>
#include <string_view>

#include "tandem/core/half.h"

namespace tandem {

/// kBFloat16 and kFloat16 (core/half.h) are the 16-bit floating types of mixed precision.
/// Elementwise ops and reductions take them (dispatch_any_floating / dispatch_any_numeric, the
/// math in float32: compute_type_t); ops that have no 16-bit kernel dispatch on
/// dispatch_floating / dispatch_numeric / dispatch_standard, which name the dtype.
// clang-format off
enum class DType : uint8_t {
  kFloat32,   ///< float (IEEE binary32), the default
  kFloat64,   ///< double
  kInt32,     ///< int32_t
  kInt64,     ///< int64_t: indices and labels
  kUInt8,     ///< uint8_t: raw image bytes
  kBool,      ///< bool: masks, the results of comparisons
  kBFloat16,  ///< bfloat16: float32's exponent, 8-bit mantissa
  kFloat16    ///< float16 (IEEE binary16)
};
// clang-format on

/// Bytes per element.
size_t dtype_size(DType dtype);
/// "float32", "int64", ...
std::string_view dtype_name(DType dtype);
/// float32, float64, bfloat16 or float16.
bool is_floating(DType dtype);
/// bfloat16 or float16.
inline bool is_half(DType dtype) { return dtype == DType::kBFloat16 || dtype == DType::kFloat16; }
/// Writes dtype_name(dtype).
std::ostream& operator<<(std::ostream& out, DType dtype);

/// The DType of the C++ type T, in `value`; defined for float, double, int32_t, int64_t,
/// uint8_t, bool, bfloat16 and float16. Read it as dtype_of<T>.
template <typename T>
struct DTypeOf;
/// \cond INTERNAL
template <> struct DTypeOf<float> { static constexpr DType value = DType::kFloat32; };
template <> struct DTypeOf<double> { static constexpr DType value = DType::kFloat64; };
template <> struct DTypeOf<int32_t> { static constexpr DType value = DType::kInt32; };
template <> struct DTypeOf<int64_t> { static constexpr DType value = DType::kInt64; };
template <> struct DTypeOf<uint8_t> { static constexpr DType value = DType::kUInt8; };
template <> struct DTypeOf<bool> { static constexpr DType value = DType::kBool; };
template <> struct DTypeOf<bfloat16> { static constexpr DType value = DType::kBFloat16; };
template <> struct DTypeOf<float16> { static constexpr DType value = DType::kFloat16; };
/// \endcond

/// The DType of the C++ type T: `dtype_of<float>` is DType::kFloat32.
template <typename T>
inline constexpr DType dtype_of = DTypeOf<T>::value;

/// Calls `fn.template operator()<T>()` with T the C++ type of dtype (every type, the 16-bit
/// floating types included: for storage, fills and casts).
template <typename Fn>
decltype(auto) dispatch_dtype(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::kFloat32: return fn.template operator()<float>();
    case DType::kFloat64: return fn.template operator()<double>();
    case DType::kInt32: return fn.template operator()<int32_t>();
    case DType::kInt64: return fn.template operator()<int64_t>();
    case DType::kUInt8: return fn.template operator()<uint8_t>();
    case DType::kBool: return fn.template operator()<bool>();
    case DType::kBFloat16: return fn.template operator()<bfloat16>();
    case DType::kFloat16: return fn.template operator()<float16>();
  }
  return fn.template operator()<float>();
}

/// Like dispatch_dtype, restricted to float32 and float64; other types raise naming `op`.
template <typename Fn>
decltype(auto) dispatch_floating(DType dtype, std::string_view op, Fn&& fn);

namespace detail {
[[noreturn]] void throw_unsupported_dtype(std::string_view op, DType dtype, std::string_view need);
}

template <typename Fn>
decltype(auto) dispatch_floating(DType dtype, std::string_view op, Fn&& fn) {
  switch (dtype) {
    case DType::kFloat32: return fn.template operator()<float>();
    case DType::kFloat64: return fn.template operator()<double>();
    default: detail::throw_unsupported_dtype(op, dtype, "float32 or float64");
  }
}

/// The types every op computes in: float32, float64, int32, int64, uint8 and bool; the 16-bit
/// floating types raise naming `op`.
template <typename Fn>
decltype(auto) dispatch_standard(DType dtype, std::string_view op, Fn&& fn) {
  switch (dtype) {
    case DType::kFloat32: return fn.template operator()<float>();
    case DType::kFloat64: return fn.template operator()<double>();
    case DType::kInt32: return fn.template operator()<int32_t>();
    case DType::kInt64: return fn.template operator()<int64_t>();
    case DType::kUInt8: return fn.template operator()<uint8_t>();
    case DType::kBool: return fn.template operator()<bool>();
    default: detail::throw_unsupported_dtype(op, dtype, "a type other than bfloat16 or float16");
  }
}

/// Numeric types (no bool): float32, float64, int32, int64, uint8.
template <typename Fn>
decltype(auto) dispatch_numeric(DType dtype, std::string_view op, Fn&& fn) {
  switch (dtype) {
    case DType::kFloat32: return fn.template operator()<float>();
    case DType::kFloat64: return fn.template operator()<double>();
    case DType::kInt32: return fn.template operator()<int32_t>();
    case DType::kInt64: return fn.template operator()<int64_t>();
    case DType::kUInt8: return fn.template operator()<uint8_t>();
    default: detail::throw_unsupported_dtype(op, dtype, "a numeric type");
  }
}

/// Every floating type: float32, float64, bfloat16 and float16 (for ops with 16-bit kernels).
template <typename Fn>
decltype(auto) dispatch_any_floating(DType dtype, std::string_view op, Fn&& fn) {
  switch (dtype) {
    case DType::kFloat32: return fn.template operator()<float>();
    case DType::kFloat64: return fn.template operator()<double>();
    case DType::kBFloat16: return fn.template operator()<bfloat16>();
    case DType::kFloat16: return fn.template operator()<float16>();
    default: detail::throw_unsupported_dtype(op, dtype, "a floating type");
  }
}

/// Every numeric type (no bool), the 16-bit floating types included.
template <typename Fn>
decltype(auto) dispatch_any_numeric(DType dtype, std::string_view op, Fn&& fn) {
  switch (dtype) {
    case DType::kBFloat16: return fn.template operator()<bfloat16>();
    case DType::kFloat16: return fn.template operator()<float16>();
    default: return dispatch_numeric(dtype, op, fn);
  }
}

}  // namespace tandem
