// Shape: the dimensions of a row-major tensor, printed as [d0, d1, ...].
#pragma once

#include <cstdint>
#include <initializer_list>
#include <ostream>
#include <string>
#include <vector>

namespace tandem {

class Shape {
 public:
  Shape() = default;
  Shape(std::initializer_list<int64_t> dims) : dims_(dims) {}
  explicit Shape(std::vector<int64_t> dims) : dims_(std::move(dims)) {}

  int64_t rank() const { return static_cast<int64_t>(dims_.size()); }
  /// Product of the dimensions (1 for a scalar, 0 if any dimension is 0). Raises naming the
  /// shape when a partial product overflows int64 (a damaged file can declare such extents).
  int64_t numel() const;
  /// Bytes of a row-major array of this shape whose elements take `element_size` bytes: numel()
  /// times `element_size`, raising naming the shape when that overflows int64 or a dimension is
  /// negative.
  size_t nbytes(size_t element_size) const;
  /// Dimension i; negative i counts from the end. Out of range raises.
  int64_t operator[](int64_t i) const { return dims_[normalize_axis(i)]; }
  int64_t& operator[](int64_t i) { return dims_[normalize_axis(i)]; }
  /// Maps a possibly negative axis into [0, rank); raises naming the shape when out of range.
  size_t normalize_axis(int64_t axis) const;

  const std::vector<int64_t>& dims() const { return dims_; }
  std::vector<int64_t>& dims() { return dims_; }
  auto begin() const { return dims_.begin(); }
  auto end() const { return dims_.end(); }

  /// Row-major strides in elements; raises naming the shape when one overflows int64 (possible
  /// even when numel() is 0, e.g. [0, 2^40, 2^40]).
  std::vector<int64_t> strides() const;
  std::string to_string() const;

  friend bool operator==(const Shape& a, const Shape& b) { return a.dims_ == b.dims_; }
  friend bool operator!=(const Shape& a, const Shape& b) { return !(a == b); }

 private:
  std::vector<int64_t> dims_;
};

std::ostream& operator<<(std::ostream& out, const Shape& shape);

}  // namespace tandem
