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
  /// Product of the dimensions (1 for a scalar, 0 if any dimension is 0).
  int64_t numel() const;
  /// Dimension i; negative i counts from the end. Out of range raises.
  int64_t operator[](int64_t i) const { return dims_[normalize_axis(i)]; }
  int64_t& operator[](int64_t i) { return dims_[normalize_axis(i)]; }
  /// Maps a possibly negative axis into [0, rank); raises naming the shape when out of range.
  size_t normalize_axis(int64_t axis) const;

  const std::vector<int64_t>& dims() const { return dims_; }
  std::vector<int64_t>& dims() { return dims_; }
  auto begin() const { return dims_.begin(); }
  auto end() const { return dims_.end(); }

  /// Row-major strides in elements.
  std::vector<int64_t> strides() const;
  std::string to_string() const;

  friend bool operator==(const Shape& a, const Shape& b) { return a.dims_ == b.dims_; }
  friend bool operator!=(const Shape& a, const Shape& b) { return !(a == b); }

 private:
  std::vector<int64_t> dims_;
};

std::ostream& operator<<(std::ostream& out, const Shape& shape);

}  // namespace tandem
