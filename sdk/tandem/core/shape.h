// Shape: the dimensions of a row-major tensor, printed as [d0, d1, ...].
#pragma once

#include <cstdint>
#include <initializer_list>
#include <ostream>
#include <string>
#include <vector>

namespace tandem {

/// The dimensions of a row-major tensor: Shape{28, 28} or {} for a scalar. Shapes without the
/// batch axis describe one example (Module::build); a tensor's shape has it first.
class Shape {
 public:
  /// A scalar's shape (rank 0).
  Shape() = default;
  /// The listed dimensions, outermost first: `Shape{batch, 784}`.
  Shape(std::initializer_list<int64_t> dims) : dims_(dims) {}
  /// The same from a vector.
  explicit Shape(std::vector<int64_t> dims) : dims_(std::move(dims)) {}

  /// The number of dimensions (0 for a scalar).
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
  /// Dimension i, writable; negative i counts from the end. Out of range raises.
  int64_t& operator[](int64_t i) { return dims_[normalize_axis(i)]; }
  /// Maps a possibly negative axis into [0, rank); raises naming the shape when out of range.
  size_t normalize_axis(int64_t axis) const;

  /// The dimensions as a vector.
  const std::vector<int64_t>& dims() const { return dims_; }
  /// The dimensions as a vector, writable.
  std::vector<int64_t>& dims() { return dims_; }
  /// Iterates over the dimensions: `for (int64_t d : shape)`.
  auto begin() const { return dims_.begin(); }
  /// See begin().
  auto end() const { return dims_.end(); }

  /// Row-major strides in elements; raises naming the shape when one overflows int64 (possible
  /// even when numel() is 0, e.g. [0, 2^40, 2^40]).
  std::vector<int64_t> strides() const;
  /// "[d0, d1, ...]" ("[]" for a scalar).
  std::string to_string() const;

  /// Same rank and dimensions.
  friend bool operator==(const Shape& a, const Shape& b) { return a.dims_ == b.dims_; }
  friend bool operator!=(const Shape& a, const Shape& b) { return !(a == b); }

 private:
  std::vector<int64_t> dims_;
};

/// Writes shape.to_string().
std::ostream& operator<<(std::ostream& out, const Shape& shape);

}  // namespace tandem
