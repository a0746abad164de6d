// Shape arithmetic and printing.
#include "tandem/core/shape.h"

#include <sstream>

#include "tandem/core/error.h"

namespace tandem {

int64_t Shape::numel() const {
  int64_t n = 1;
  for (int64_t d : dims_) n *= d;
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
