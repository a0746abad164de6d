// Element types of tensors, their sizes and names, and the compile-time mapping from C++ types.
#pragma once

#include <cstddef>
#include <cstdint>
#include <ostream>
#include <string_view>

namespace tandem {

enum class DType : uint8_t { kFloat32, kFloat64, kInt32, kInt64, kUInt8, kBool };

/// Bytes per element.
size_t dtype_size(DType dtype);
/// "float32", "int64", ...
std::string_view dtype_name(DType dtype);
bool is_floating(DType dtype);
std::ostream& operator<<(std::ostream& out, DType dtype);

template <typename T>
struct DTypeOf;
template <> struct DTypeOf<float> { static constexpr DType value = DType::kFloat32; };
template <> struct DTypeOf<double> { static constexpr DType value = DType::kFloat64; };
template <> struct DTypeOf<int32_t> { static constexpr DType value = DType::kInt32; };
template <> struct DTypeOf<int64_t> { static constexpr DType value = DType::kInt64; };
template <> struct DTypeOf<uint8_t> { static constexpr DType value = DType::kUInt8; };
template <> struct DTypeOf<bool> { static constexpr DType value = DType::kBool; };

template <typename T>
inline constexpr DType dtype_of = DTypeOf<T>::value;

/// Calls fn.template operator()<T>() with T the C++ type of dtype (all six types).
template <typename Fn>
decltype(auto) dispatch_dtype(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::kFloat32: return fn.template operator()<float>();
    case DType::kFloat64: return fn.template operator()<double>();
    case DType::kInt32: return fn.template operator()<int32_t>();
    case DType::kInt64: return fn.template operator()<int64_t>();
    case DType::kUInt8: return fn.template operator()<uint8_t>();
    case DType::kBool: return fn.template operator()<bool>();
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

}  // namespace tandem
