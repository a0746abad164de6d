// Glorot uniform and zeros initialisers.
#include "tandem/nn/initializers.h"

#include <cmath>

#include "tandem/core/error.h"

namespace tandem::nn {

std::pair<int64_t, int64_t> compute_fans(const Shape& shape) {
  if (shape.rank() == 0) return {1, 1};
  if (shape.rank() == 1) return {shape[0], shape[0]};
  if (shape.rank() == 2) return {shape[0], shape[1]};
  // Convolution kernels [..spatial.., in, out]: the receptive field multiplies both fans.
  int64_t receptive = 1;
  for (int64_t i = 0; i < shape.rank() - 2; ++i) receptive *= shape[i];
  return {receptive * shape[-2], receptive * shape[-1]};
}

Tensor glorot_uniform(const Shape& shape, Generator& generator, DType dtype) {
  const auto [fan_in, fan_out] = compute_fans(shape);
  TANDEM_CHECK(fan_in + fan_out > 0, "glorot_uniform: shape ", shape, " has no fans");
  const double limit = std::sqrt(6.0 / static_cast<double>(fan_in + fan_out));
  return Tensor::uniform(shape, generator, -limit, limit, dtype);
}

Tensor zeros_initializer(const Shape& shape, DType dtype) { return Tensor::zeros(shape, dtype); }

}  // namespace tandem::nn
