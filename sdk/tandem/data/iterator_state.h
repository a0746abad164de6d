// IteratorState: the saved position of a dataset iterator as a few named int64 arrays, the
// form checkpoints store under training_state/data/ (see docs/checkpoint-format.md).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace tandem::data {

/// Named int64 arrays, e.g. "1_shuffle/buffer" -> [source indices in the shuffle buffer].
/// uint64 values (Philox RNG state) are stored bit-cast. Entry names are unique and kept in
/// insertion order. The state holds positions and indices, never tensors, so it stays small
/// (the largest array is a shuffle buffer: buffer_size int64 values).
class IteratorState {
 public:
  /// One named array.
  using Array = std::vector<int64_t>;
  /// Every entry, in insertion order.
  using Entries = std::vector<std::pair<std::string, Array>>;

  IteratorState() = default;
  /// Adopts entries read back from a checkpoint (duplicate names raise).
  explicit IteratorState(Entries entries);

  /// Sets (or replaces) the array called `name`.
  void set(const std::string& name, Array values);
  /// Stores uint64 values bit-cast into int64.
  void set_u64(const std::string& name, const std::vector<uint64_t>& values);
  /// Copies every entry of `other` into this state (replacing equal names).
  void merge(const IteratorState& other);

  /// True when an entry is called `name`.
  bool contains(std::string_view name) const;
  /// The array called `name`; raises naming the entry when it is missing.
  const Array& get(std::string_view name) const;
  /// A one-value array; raises when missing or not of size 1.
  int64_t get_scalar(std::string_view name) const;
  /// An array stored with set_u64(), bit-cast back; raises naming the entry when it is missing.
  std::vector<uint64_t> get_u64(std::string_view name) const;

  /// Every entry, in insertion order.
  const Entries& entries() const { return entries_; }
  /// True when there is no entry.
  bool empty() const { return entries_.empty(); }
  /// Total number of int64 values over all entries.
  size_t num_values() const;
  /// One line per entry ("name: [v0, v1, ...]"), long arrays elided; for logs and tests.
  std::string to_string() const;

  friend bool operator==(const IteratorState& a, const IteratorState& b) {
    return a.entries_ == b.entries_;
  }

 private:
  Entries entries_;
};

}  // namespace tandem::data
