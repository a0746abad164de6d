// Tensor's arithmetic operators, reshape and slice (declared in tensor/tensor.h): each is an op,
// so they record on gradient tapes.
#include "tandem/ops/internal/op_helpers.h"
#include "tandem/ops/ops.h"

namespace tandem {

Tensor Tensor::reshape(const Shape& shape) const { return ops::reshape(*this, shape); }
Tensor Tensor::slice(int64_t begin, int64_t end) const { return ops::slice(*this, begin, end); }

Tensor operator+(const Tensor& a, const Tensor& b) { return ops::add(a, b); }
Tensor operator-(const Tensor& a, const Tensor& b) { return ops::sub(a, b); }
Tensor operator*(const Tensor& a, const Tensor& b) { return ops::mul(a, b); }
Tensor operator/(const Tensor& a, const Tensor& b) { return ops::div(a, b); }
Tensor operator-(const Tensor& a) { return ops::neg(a); }
Tensor operator+(const Tensor& a, double b) { return ops::add(a, b); }
Tensor operator-(const Tensor& a, double b) { return ops::add(a, -b); }
Tensor operator*(const Tensor& a, double b) { return ops::mul(a, b); }
Tensor operator/(const Tensor& a, double b) { return ops::internal::div_scalar(a, b); }
Tensor operator*(double a, const Tensor& b) { return ops::mul(b, a); }

}  // namespace tandem
