// PerReplica<T>: one value per replica of a strategy (tf.distribute's PerReplica), what
// strategy.run returns and what it unpacks, one piece per replica, when passed as an argument.
// A PerReplica of a pair, tuple or struct of tensors unpacks into one PerReplica per element.
#pragma once

#include <cstddef>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "tandem/core/error.h"

namespace tandem {

/// Holds one value per replica, in replica order (values()[k] belongs to replica k).
template <typename T>
class PerReplica {
 public:
  /// The type of one replica's value.
  using value_type = T;

  PerReplica() = default;
  /// One value per replica, in replica order.
  explicit PerReplica(std::vector<T> values) : values_(std::move(values)) {}

  /// Every replica's value, in replica order.
  const std::vector<T>& values() const { return values_; }
  /// Every replica's value, in replica order (to fill or change them).
  std::vector<T>& values() { return values_; }
  /// Replica `replica`'s value; raises when out of range.
  typename std::vector<T>::const_reference operator[](size_t replica) const {
    return values_.at(replica);
  }
  /// Replica `replica`'s value, to change it; raises when out of range.
  typename std::vector<T>::reference operator[](size_t replica) { return values_.at(replica); }
  /// How many values: the strategy's local replicas.
  size_t size() const { return values_.size(); }

  /// The first replica's value (iteration goes in replica order).
  auto begin() const { return values_.begin(); }
  /// Past the last replica's value.
  auto end() const { return values_.end(); }

  /// Element I of every replica's value, when T is a std::pair, a std::tuple or an aggregate
  /// struct of up to 8 fields (no C-array fields): what a step that returns several values
  /// gives, unpacked as
  /// tf.distribute returns a structure of per-replica values. Structured bindings call it:
  ///   auto [losses, correct] = strategy.run(step, batch);   // step returns {loss, correct}
  ///   strategy.reduce(ReduceOp::kSum, losses);
  template <size_t I>
  auto get() const;

 private:
  std::vector<T> values_;
};

/// PerReplica(std::vector<T>{...}) is a PerReplica<T>.
template <typename T>
PerReplica(std::vector<T>) -> PerReplica<T>;

namespace detail {

template <typename T>
struct IsPerReplica : std::false_type {};
template <typename T>
struct IsPerReplica<PerReplica<T>> : std::true_type {};
template <typename T>
inline constexpr bool is_per_replica_v = IsPerReplica<std::remove_cvref_t<T>>::value;

/// The piece of a strategy.run argument that replica `replica` receives: its own value of a
/// PerReplica, the argument itself otherwise (shared by every replica, by const reference).
template <typename A>
const auto& replica_piece(const A& argument, int replica) {
  if constexpr (is_per_replica_v<A>) {
    return argument[static_cast<size_t>(replica)];
  } else {
    return argument;
  }
}

template <typename A>
using replica_piece_t = decltype(replica_piece(std::declval<const A&>(), 0));

/// Converts to anything: counts an aggregate's fields by how many initialise it.
struct AnyField {
  template <typename U>
  operator U() const;  // NOLINT: never defined, only named in unevaluated contexts
};

/// Fields of aggregate T (up to 8): how many AnyField values initialise it.
template <typename T, typename... Fields>
constexpr size_t aggregate_field_count() {
  if constexpr (sizeof...(Fields) == 8) {
    return 8;
  } else if constexpr (requires { T{Fields{}..., AnyField{}}; }) {
    return aggregate_field_count<T, Fields..., AnyField>();
  } else {
    return sizeof...(Fields);
  }
}

/// T's fields as a tuple of const references (T an aggregate of `N` fields, 1 <= N <= 8).
template <size_t N, typename T>
auto tie_fields(const T& value) {
  if constexpr (N == 1) {
    const auto& [a] = value;
    return std::tie(a);
  } else if constexpr (N == 2) {
    const auto& [a, b] = value;
    return std::tie(a, b);
  } else if constexpr (N == 3) {
    const auto& [a, b, c] = value;
    return std::tie(a, b, c);
  } else if constexpr (N == 4) {
    const auto& [a, b, c, d] = value;
    return std::tie(a, b, c, d);
  } else if constexpr (N == 5) {
    const auto& [a, b, c, d, e] = value;
    return std::tie(a, b, c, d, e);
  } else if constexpr (N == 6) {
    const auto& [a, b, c, d, e, f] = value;
    return std::tie(a, b, c, d, e, f);
  } else if constexpr (N == 7) {
    const auto& [a, b, c, d, e, f, g] = value;
    return std::tie(a, b, c, d, e, f, g);
  } else {
    const auto& [a, b, c, d, e, f, g, h] = value;
    return std::tie(a, b, c, d, e, f, g, h);
  }
}

template <typename T>
struct IsTupleLike : std::false_type {};
template <typename... E>
struct IsTupleLike<std::tuple<E...>> : std::true_type {};
template <typename A, typename B>
struct IsTupleLike<std::pair<A, B>> : std::true_type {};

/// How many per-replica values a PerReplica<T> unpacks into: the elements of a pair or tuple,
/// the fields of an aggregate struct (up to 8); 0 for anything else.
template <typename T>
constexpr size_t unpacked_size() {
  if constexpr (IsTupleLike<T>::value) {
    return std::tuple_size_v<T>;
  } else if constexpr (std::is_aggregate_v<T> && std::is_class_v<T>) {
    return aggregate_field_count<T>();
  } else {
    return 0;
  }
}

/// Element I of `value` (a pair, tuple or aggregate).
template <size_t I, typename T>
const auto& unpacked_element(const T& value) {
  if constexpr (IsTupleLike<T>::value) {
    return std::get<I>(value);
  } else {
    return std::get<I>(tie_fields<unpacked_size<T>()>(value));
  }
}

}  // namespace detail

template <typename T>
template <size_t I>
auto PerReplica<T>::get() const {
  static_assert(detail::unpacked_size<T>() > 0,
                "PerReplica<T>::get<I>: T is not a pair, a tuple or a struct of fields");
  static_assert(I < detail::unpacked_size<T>(),
                "PerReplica<T>::get<I>: I is past the last element");
  using Element = std::decay_t<decltype(detail::unpacked_element<I>(std::declval<const T&>()))>;
  std::vector<Element> elements;
  elements.reserve(values_.size());
  for (const T& value : values_) elements.push_back(detail::unpacked_element<I>(value));
  return PerReplica<Element>(std::move(elements));
}

}  // namespace tandem

// Structured bindings of a PerReplica of a pair, tuple or struct: one PerReplica per element.
// clang-format off
/// How many PerReplica values a PerReplica of a pair, tuple or struct unpacks into.
template <typename T>
  requires(tandem::detail::unpacked_size<T>() > 0)
struct std::tuple_size<tandem::PerReplica<T>>
    : std::integral_constant<size_t, tandem::detail::unpacked_size<T>()> {};

/// The type of a PerReplica's element I when unpacked: PerReplica of that element's type.
template <size_t I, typename T>
  requires(tandem::detail::unpacked_size<T>() > 0)
struct std::tuple_element<I, tandem::PerReplica<T>> {
  /// PerReplica<element I's type>.
  using type = decltype(std::declval<const tandem::PerReplica<T>&>().template get<I>());
};
// clang-format on
