// Helpers of the collectives across workers (internal): tensor lists as bytes (count, then per
// tensor its dtype, rank, dims and data: what workers exchange to gather tensors of any shape),
// and kMean's division of a CPU tensor after the sum.
#pragma once

#include <vector>

#include "tandem/tensor/tensor.h"

namespace tandem::collectives {

std::vector<char> tensors_to_bytes(const std::vector<Tensor>& tensors);
/// The tensors (on the CPU) back; raises "`what`: a truncated piece" on short input.
std::vector<Tensor> tensors_from_bytes(const std::vector<char>& bytes, const char* what);
/// Divides every element of CPU tensor `t` by `n`.
void divide_elements(Tensor& t, int n);

}  // namespace tandem::collectives
