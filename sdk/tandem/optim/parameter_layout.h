// ParameterLayout: the trainable variables laid end to end, split among the replicas into
// contiguous ranges of about equal bytes (optimizer-state sharding); a range may end inside a
// large variable, at one of its blocks' boundaries.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace tandem::optim {

/// Variables 0..n-1 laid end to end in order (variable i: numels[i] elements of
/// element_bytes[i] bytes), split among `replicas` replicas into contiguous ranges of about
/// equal bytes. Cuts fall only on block boundaries: a variable's start, or a multiple of
/// `block` elements into it, so a variable of at most `block` elements is never split and every
/// block of a larger one has one owner. Cut r is the boundary nearest r/replicas of the bytes
/// (the lower one on a tie). Every replica computes the same layout from the same list. One
/// replica owns everything.
class ParameterLayout {
 public:
  /// Elements per block (256 KiB of float32).
  static constexpr int64_t kBlock = int64_t{1} << 16;

  /// Elements [begin, end) of a variable, owned by replica `owner`.
  struct Part {
    int owner = 0;      ///< the replica holding the part
    int64_t begin = 0;  ///< its first element, flattened
    int64_t end = 0;    ///< one past its last
    /// Equal owners and ranges.
    bool operator==(const Part&) const = default;
  };

  /// Raises for replicas < 1, a negative size, an element size < 1 or block < 1.
  ParameterLayout(const std::vector<int64_t>& numels, const std::vector<int64_t>& element_bytes,
                  int replicas, int64_t block = kBlock);

  /// Replicas the variables are split among.
  int num_replicas() const { return replicas_; }
  /// Variables laid out.
  size_t num_variables() const { return parts_.size(); }
  /// Variable i's parts in element order, each owned by one replica, together [0, numel). A
  /// variable of no elements has one empty part, owned by the replica whose range holds its
  /// start.
  const std::vector<Part>& parts(size_t i) const { return parts_[i]; }
  /// Where replica r's range starts (r = num_replicas(): the end), in bytes.
  int64_t cut(int r) const { return cuts_[static_cast<size_t>(r)]; }
  /// Bytes replica r owns.
  int64_t bytes_owned(int r) const { return cut(r + 1) - cut(r); }
  /// Bytes of all variables.
  int64_t total_bytes() const { return cuts_.back(); }

 private:
  int replicas_;
  std::vector<int64_t> cuts_;  // replicas + 1 entries
  std::vector<std::vector<Part>> parts_;
};

}  // namespace tandem::optim
