// Helpers of the collectives across workers (internal): tensor lists as bytes (count, then per
// tensor its dtype, rank, dims and data: what workers exchange to gather tensors of any shape),
// the tensors of one dtype as one buffer for a single reduction, and kMean's division of a CPU
// tensor after the sum.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "tandem/collectives/reduce_op.h"
#include "tandem/tensor/tensor.h"

namespace tandem::collectives {

std::vector<char> tensors_to_bytes(const std::vector<Tensor>& tensors);
/// The tensors (on the CPU) back; raises "`what`: a truncated piece" on short input.
std::vector<Tensor> tensors_from_bytes(const std::vector<char>& bytes, const char* what);
/// Calls `reduce(buffer, count, dtype)` once per dtype among `tensors` (CPU tensors; dtypes in
/// order of first appearance), on one contiguous buffer of all the elements of that dtype: the
/// tensor itself when it is alone of its dtype, else `pack` holding them in order, copied back
/// into the tensors afterwards. Dtypes with no elements are skipped.
void for_each_dtype_group(
    std::vector<Tensor>& tensors, std::vector<char>& pack,
    const std::function<void(void* buffer, int64_t count, DType dtype)>& reduce);
/// A collective call's signature, the same in every process of a job: FNV-1a over its label and
/// parameters (sizes, dtypes, op, root). Workers compare it before they move data.
uint64_t call_signature(const char* label, const std::vector<int64_t>& parameters);
/// The parameters of an all-reduce's signature (op, then each tensor's dtype and element
/// count); raises "`transport` `label`: ..." unless every tensor is a defined CPU tensor.
std::vector<int64_t> all_reduce_parameters(const std::vector<Tensor>& tensors, ReduceOp op,
                                           const char* transport, const char* label);
/// Raises that `workers` (in order) made another collective call than worker `rank` at call
/// number `call` of `label`, out of `size` workers.
[[noreturn]] void raise_different_call(const char* label, uint64_t call, int size,
                                       const std::vector<int>& workers, int rank);
/// Divides every element of CPU tensor `t` by `n`.
void divide_elements(Tensor& t, int n);

}  // namespace tandem::collectives
