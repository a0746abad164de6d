// ParameterLayout: the trainable variables laid end to end, and which replica owns which
// contiguous run of whole variables (optimizer-state sharding).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace tandem::optim {

/// Variables 0..n-1 laid end to end in order, each of bytes[i] bytes, split among `replicas`
/// replicas into contiguous runs of whole variables of about equal bytes: variable i belongs to
/// the replica whose equal share of the total holds the middle of its bytes. Every replica
/// computes the same layout from the same list. One replica owns everything.
class ParameterLayout {
 public:
  /// Raises for replicas < 1 or a negative size.
  ParameterLayout(std::vector<int64_t> bytes, int replicas);

  /// Replicas the variables are split among.
  int num_replicas() const { return replicas_; }
  /// Variables laid out.
  size_t num_variables() const { return owners_.size(); }
  /// The replica that owns variable i.
  int owner(size_t i) const { return owners_[i]; }
  /// Where variable i starts, in bytes from the first variable's start.
  int64_t offset(size_t i) const { return offsets_[i]; }
  /// Bytes of the variables replica r owns.
  int64_t bytes_owned(int r) const;
  /// Bytes of all variables.
  int64_t total_bytes() const { return offsets_.back(); }

 private:
  int replicas_;
  std::vector<int> owners_;
  std::vector<int64_t> offsets_;  // n + 1 entries
};

}  // namespace tandem::optim
