// Shape arithmetic and printing.
#include "tandem/core/shape.h"

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

size_t Shape::normalize_axis(int64_t axis) const {
  const int64_t r = rank();
  const int64_t a = axis < 0 ? axis + r : axis;
  TANDEM_CHECK(a >= 0 && a < r, "axis ", axis, " is out of range for shape ", *this);
  return static_cast<size_t>(a);
}

std::vector<int64_t> Shape::strides() const {
  std::vector<int64_t> s(dims_.size(), 1);
  for (int64_t i = rank() - 2; i >= 0; --i) s[i] = s[i + 1] * dims_[i + 1];
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
