// ReduceOp: how values from several replicas combine (binding name tandem::ReduceOp).
// Kept in its own header so losses, metrics and optimizers can name it cheaply.
#pragma once

#include <cstdint>
#include <ostream>
#include <string_view>

namespace tandem {

/// How a collective or strategy.reduce combines the values of the replicas.
enum class ReduceOp : uint8_t {
  kSum,   ///< element-wise sum (gradients combine this way)
  kMean,  ///< element-wise sum divided by the number of replicas (or by the total count with an
          ///< axis)
  kMax,   ///< element-wise maximum (NaN wins, so a non-finite flag is never lost)
};

/// "sum", "mean", "max".
std::string_view reduce_op_name(ReduceOp op);
/// Writes reduce_op_name(op).
std::ostream& operator<<(std::ostream& out, ReduceOp op);

}  // namespace tandem
