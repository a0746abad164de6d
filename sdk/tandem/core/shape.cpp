// Shape arithmetic and printing.
#include "tandem/core/shape.h"

#include <limits>
#include <sstream>

#include "tandem/core/error.h"

namespace tandem {

int64_t Shape::numel() const {
  // Checked: a shape read from a damaged file can declare extents whose product wraps (to 0 for
  // [4, 2^31, 2^31]), and a wrapped count would pass every size check that follows.
  int64_t n = 1;
  for (int64_t d : dims_)
    TANDEM_CHECK(!__builtin_mul_overflow(n, d, &n), "shape ", *this,
                 " has more elements than int64 can count");
  return n;
}

size_t Shape::nbytes(size_t element_size) const {
  for (int64_t d : dims_)
    TANDEM_CHECK(d >= 0, "shape ", *this, " has a negative dimension; it has no size in bytes");
  int64_t bytes = 0;
  TANDEM_CHECK(element_size <= static_cast<size_t>(std::numeric_limits<int64_t>::max()) &&
                   !__builtin_mul_overflow(numel(), static_cast<int64_t>(element_size), &bytes),
               "shape ", *this, " of ", element_size,
               "-byte elements has more bytes than int64 can count");
  return static_cast<size_t>(bytes);
}

size_t Shape::normalize_axis(int64_t axis) const {
  const int64_t r = rank();
  const int64_t a = axis < 0 ? axis + r : axis;
  TANDEM_CHECK(a >= 0 && a < r, "axis ", axis, " is out of range for shape ", *this);
  return static_cast<size_t>(a);
}

std::vector<int64_t> Shape::strides() const {
  std::vector<int64_t> s(dims_.size(), 1);
  for (int64_t i = rank() - 2; i >= 0; --i)
    TANDEM_CHECK(!__builtin_mul_overflow(s[i + 1], dims_[i + 1], &s[i]), "shape ", *this,
                 " has strides that int64 cannot count");
  return s;
}

std::string Shape::to_string() const {
  std::ostringstream out;
  out << *this;
  return out.str();
}

std::ostream& operator<<(std::ostream& out, const Shape& shape) {
  out << "[";
  for (size_t i = 0; i < shape.dims().size(); ++i) out << (i ? ", " : "") << shape.dims()[i];
  return out << "]";
}

}  // namespace tandem
