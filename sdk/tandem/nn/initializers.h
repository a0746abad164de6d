// Weight initialisers with Keras' definitions, drawing from a tandem::Generator so that a
// model built twice from one seed is identical.
#pragma once

#include <cstdint>
#include <utility>

#include "tandem/core/dtype.h"
#include "tandem/core/shape.h"
#include "tandem/tensor/random.h"
#include "tandem/tensor/tensor.h"

namespace tandem::nn {

/// Keras' compute_fans: [in, out] -> (in, out); [kh, kw, in, out] -> (kh*kw*in, kh*kw*out);
/// [n] -> (n, n).
std::pair<int64_t, int64_t> compute_fans(const Shape& shape);

/// Glorot (Xavier) uniform: U(-limit, limit) with limit = sqrt(6 / (fan_in + fan_out)), fans
/// from compute_fans.
Tensor glorot_uniform(const Shape& shape, Generator& generator, DType dtype = DType::kFloat32);

/// Zeros (Keras' default bias initialiser).
Tensor zeros_initializer(const Shape& shape, DType dtype = DType::kFloat32);

}  // namespace tandem::nn
