// PerReplica<T>: one value per replica of a strategy (tf.distribute's PerReplica), what
// strategy.run returns and what it unpacks, one piece per replica, when passed as an argument.
#pragma once

#include <cstddef>
#include <type_traits>
#include <utility>
#include <vector>

#include "tandem/core/error.h"

namespace tandem {

/// Holds one value per replica, in replica order (values()[k] belongs to replica k).
template <typename T>
class PerReplica {
 public:
  using value_type = T;

  PerReplica() = default;
  /// One value per replica, in replica order.
  explicit PerReplica(std::vector<T> values) : values_(std::move(values)) {}

  const std::vector<T>& values() const { return values_; }
  std::vector<T>& values() { return values_; }
  /// Replica `replica`'s value; raises when out of range.
  typename std::vector<T>::const_reference operator[](size_t replica) const {
    return values_.at(replica);
  }
  typename std::vector<T>::reference operator[](size_t replica) { return values_.at(replica); }
  size_t size() const { return values_.size(); }

  auto begin() const { return values_.begin(); }
  auto end() const { return values_.end(); }

 private:
  std::vector<T> values_;
};

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

}  // namespace detail
}  // namespace tandem
