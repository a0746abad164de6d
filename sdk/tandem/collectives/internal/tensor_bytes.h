// Helpers of the collectives across workers (internal): tensor lists as bytes (count, then per
// tensor its dtype, rank, dims and data: what workers exchange to gather tensors of any shape),
// the tensors of one dtype as one buffer for a single reduction, the workers' pieces of a small
// all-reduce combined in worker order, and kMean's division of a CPU tensor after the sum.
#pragma once

#include <cstdint>
#include <cstring>
#include <functional>
#include <vector>

#include "tandem/collectives/internal/reduce_in_order.h"
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
/// Combines the workers' pieces of a small all-reduce into `buffer` (`count` elements of
/// `dtype`): piece(0) op piece(1) op ... op piece(size - 1), in worker order, so that every
/// worker gets the same bits. kMean sums (the caller divides, as after the transport's own
/// all-reduce). `piece(worker)` gives that worker's elements (a `const void*` aligned for
/// `dtype`), never inside `buffer`.
template <typename Piece>
void combine_worker_pieces(void* buffer, int64_t count, DType dtype, ReduceOp op, int size,
                           Piece&& piece) {
  const ReduceOp combine = op == ReduceOp::kMax ? ReduceOp::kMax : ReduceOp::kSum;
  dispatch_any_numeric(dtype, "all_reduce", [&]<typename T>() {
    std::memcpy(buffer, piece(0), static_cast<size_t>(count) * sizeof(T));
    detail::reduce_in_order(static_cast<T*>(buffer), count, size, combine, [&](int64_t worker) {
      return static_cast<const T*>(static_cast<const void*>(piece(static_cast<int>(worker))));
    });
  });
}
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
