// Row-sparse gradients across replicas (an embedding table's: each replica's batch touches a
// few rows of it). Every replica finds the rows of its gradient that are not all zero bits and
// the replicas exchange their counts (one small all-gather); where gathering every replica's
// rows moves fewer bytes than the dense all-reduce of the table, they all-gather rows and
// indices and each adds them up itself, in replica order, exactly as the in-process reduction
// (reduce_in_order) adds the dense tables: replica 0's value, then + replica 1's, ..., where an
// untouched row contributes +0. The result is the dense all-reduce's bit for bit (-0 included).
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "tandem/autograd/tape.h"
#include "tandem/distribute/internal/gradient_reducer.h"
#include "tandem/distribute/replica_context.h"

namespace tandem {

namespace {

/// Rows of g [rows, width] with any element whose bits are not zero (so -0 counts as touched).
template <typename T>
std::vector<int64_t> touched_rows(const Tensor& g) {
  const int64_t rows = g.dim(0), width = g.dim(1);
  const T* data = g.data<T>();
  std::vector<int64_t> out;
  for (int64_t r = 0; r < rows; ++r) {
    const T* row = data + r * width;
    bool any = false;
    for (int64_t c = 0; c < width && !any; ++c) {
      T zero{};
      any = std::memcmp(&row[c], &zero, sizeof(T)) != 0;
    }
    if (any) out.push_back(r);
  }
  return out;
}

std::vector<int64_t> touched_rows(const Tensor& g) {
  return g.dtype() == DType::kFloat32 ? touched_rows<float>(g) : touched_rows<double>(g);
}

/// The sum of every replica's rows, as reduce_in_order adds the dense tables. `indices`
/// [replicas * slots] and `values` [replicas * slots, width] are the gathered rows (replica r's
/// first counts[r] slots used).
template <typename T>
Tensor add_in_replica_order(const Tensor& indices, const Tensor& values,
                            const std::vector<int64_t>& counts, int64_t slots, int64_t rows,
                            int64_t width) {
  Tensor sum = Tensor::zeros(Shape{rows, width}, values.dtype());
  T* out = sum.data<T>();
  const int64_t* index = indices.data<int64_t>();
  const T* in = values.data<T>();
  std::vector<uint8_t> mark(static_cast<size_t>(rows), 0);
  for (size_t r = 0; r < counts.size(); ++r) {
    const int64_t first = static_cast<int64_t>(r) * slots;
    for (int64_t k = 0; k < counts[r]; ++k) {
      T* row = out + index[first + k] * width;
      const T* add = in + (first + k) * width;
      if (r == 0) {
        std::copy_n(add, width, row);  // the accumulator starts as replica 0's value
      } else {
        for (int64_t c = 0; c < width; ++c) row[c] = static_cast<T>(row[c] + add[c]);
      }
    }
    if (r == 0) continue;
    // The dense sum adds replica r's +0 to the rows it did not touch: only a -0 (in a row
    // replica 0 touched) changes, to +0.
    for (int64_t k = 0; k < counts[r]; ++k) mark[static_cast<size_t>(index[first + k])] = 1;
    for (int64_t k = 0; k < counts[0]; ++k) {
      const int64_t at = index[k];
      if (mark[static_cast<size_t>(at)]) continue;
      T* row = out + at * width;
      for (int64_t c = 0; c < width; ++c) row[c] = static_cast<T>(row[c] + T(0));
    }
    for (int64_t k = 0; k < counts[r]; ++k) mark[static_cast<size_t>(index[first + k])] = 0;
  }
  return sum;
}

}  // namespace

std::vector<Tensor> ReplicaContext::sum_across_replicas(const std::vector<Tensor>& gradients,
                                                        const std::vector<bool>& row_sparse) {
  if (num_replicas_ == 1) return gradients;
  // Every replica decides alike: the flags come from the variables, and every replica passes
  // gradients of the same shapes, dtypes and devices, undefined in the same places.
  std::vector<bool> candidate(gradients.size(), false);
  bool any = false;
  for (size_t i = 0; i < gradients.size() && i < row_sparse.size(); ++i) {
    const Tensor& g = gradients[i];
    candidate[i] = row_sparse[i] && g.defined() && g.device().is_cpu() && g.rank() == 2 &&
                   (g.dtype() == DType::kFloat32 || g.dtype() == DType::kFloat64) &&
                   reducer_->wire_dtype(g.dtype()) == g.dtype();
    any = any || candidate[i];
  }
  if (!any) return sum_across_replicas(gradients);
  // Gradient buckets, when they packed this step's gradients, serve them all (densely).
  return reducer_->sum(gradients, nullptr, [&](const std::vector<Tensor>& values) {
    return sum_with_row_sparse(values, candidate);
  });
}

std::vector<Tensor> ReplicaContext::sum_with_row_sparse(const std::vector<Tensor>& gradients,
                                                        const std::vector<bool>& gather_candidate) {
  const autograd::NoRecordGuard no_record;
  std::vector<size_t> which;
  std::vector<std::vector<int64_t>> mine;
  std::vector<int64_t> my_counts;
  for (size_t i = 0; i < gradients.size(); ++i) {
    if (!gather_candidate[i]) continue;
    which.push_back(i);
    mine.push_back(touched_rows(gradients[i]));
    my_counts.push_back(static_cast<int64_t>(mine.back().size()));
  }
  // Every replica's counts, [replica][candidate].
  const std::vector<int64_t> counts =
      all_gather(Tensor::from_vector(my_counts)).to_vector<int64_t>();
  const size_t candidates = which.size();
  const auto replicas = static_cast<size_t>(num_replicas_);
  std::vector<int64_t> slots(candidates, 0);
  std::vector<bool> gather(candidates, false);
  std::vector<Tensor> dense = gradients;
  for (size_t f = 0; f < candidates; ++f) {
    for (size_t r = 0; r < replicas; ++r) slots[f] = std::max(slots[f], counts[r * candidates + f]);
    const Tensor& g = gradients[which[f]];
    const auto element = static_cast<int64_t>(dtype_size(g.dtype()));
    const int64_t width = g.dim(1);
    // Bytes each replica receives: every replica's rows padded to the largest count (values and
    // an int64 index each), against the table the all-reduce moves.
    const int64_t gathered = num_replicas_ * slots[f] * (width * element + 8);
    gather[f] = gathered < g.dim(0) * width * element;
    if (gather[f]) dense[which[f]] = Tensor();
  }
  std::vector<Tensor> summed = all_reduce_gradients(dense);
  for (size_t f = 0; f < candidates; ++f) {
    if (!gather[f]) {
      ++row_sparse_counts_.dense;
      continue;
    }
    ++row_sparse_counts_.gathered;
    const Tensor& g = gradients[which[f]];
    const int64_t rows = g.dim(0), width = g.dim(1), used = my_counts[f];
    std::vector<int64_t> per_replica(replicas);
    for (size_t r = 0; r < replicas; ++r) per_replica[r] = counts[r * candidates + f];
    if (slots[f] == 0) {  // no replica touched a row: zeros, as the dense sum of zeros
      summed[which[f]] = Tensor::zeros(Shape{rows, width}, g.dtype());
      continue;
    }
    std::vector<int64_t> index(static_cast<size_t>(slots[f]), 0);
    std::copy(mine[f].begin(), mine[f].end(), index.begin());
    Tensor values = Tensor::zeros(Shape{slots[f], width}, g.dtype());
    const size_t row_bytes = static_cast<size_t>(width) * dtype_size(g.dtype());
    for (int64_t k = 0; k < used; ++k)
      std::memcpy(
          static_cast<char*>(values.raw_data()) + k * row_bytes,
          static_cast<const char*>(g.raw_data()) + mine[f][static_cast<size_t>(k)] * row_bytes,
          row_bytes);
    const Tensor all_index = all_gather(Tensor::from_vector(index));
    const Tensor all_values = all_gather(values);
    summed[which[f]] =
        g.dtype() == DType::kFloat32
            ? add_in_replica_order<float>(all_index, all_values, per_replica, slots[f], rows, width)
            : add_in_replica_order<double>(all_index, all_values, per_replica, slots[f], rows,
                                           width);
  }
  return summed;
}

}  // namespace tandem
