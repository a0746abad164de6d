// Helpers of the collectives across workers: tensor lists as bytes, kMean's division.
#include "tandem/collectives/internal/tensor_bytes.h"

#include <cstring>
#include <string>

#include "tandem/core/error.h"

namespace tandem::collectives {

namespace {

/// A tensor list as bytes: count, then per tensor dtype, rank, dims and data.
void append(std::vector<char>& out, const void* data, size_t bytes) {
  if (bytes == 0) return;
  const size_t at = out.size();
  out.resize(at + bytes);
  std::memcpy(out.data() + at, data, bytes);
}

}  // namespace

uint64_t call_signature(const char* label, const std::vector<int64_t>& parameters) {
  uint64_t hash = 1469598103934665603ull;
  auto mix = [&](const void* data, size_t bytes) {
    for (size_t i = 0; i < bytes; ++i) {
      hash ^= static_cast<const unsigned char*>(data)[i];
      hash *= 1099511628211ull;
    }
  };
  mix(label, std::strlen(label));
  for (const int64_t parameter : parameters) mix(&parameter, sizeof(parameter));
  return hash;
}

std::vector<int64_t> all_reduce_parameters(const std::vector<Tensor>& tensors, ReduceOp op,
                                           const char* transport, const char* label) {
  std::vector<int64_t> parameters = {static_cast<int64_t>(op)};
  for (const Tensor& t : tensors) {
    TANDEM_CHECK(t.defined() && t.device().is_cpu(), transport, " ", label,
                 ": tensors must be defined CPU tensors");
    parameters.push_back(static_cast<int64_t>(t.dtype()));
    parameters.push_back(t.numel());
  }
  return parameters;
}

void raise_different_call(const char* label, uint64_t call, int size,
                          const std::vector<int>& workers, int rank) {
  std::string list;
  for (const int w : workers) list += (list.empty() ? "" : ", ") + std::to_string(w);
  TANDEM_THROW(label, " #", call, " across ", size,
               " workers: ", workers.size() == 1 ? "worker " : "workers ", list,
               " made a different collective call than worker ", rank,
               " (another call, or other sizes or dtypes); every worker must make the same "
               "collective calls in the same order");
}

void for_each_dtype_group(
    std::vector<Tensor>& tensors, std::vector<char>& pack,
    const std::function<void(void* buffer, int64_t count, DType dtype)>& reduce) {
  std::vector<bool> done(tensors.size(), false);
  for (size_t first = 0; first < tensors.size(); ++first) {
    if (done[first]) continue;
    const DType dtype = tensors[first].dtype();
    std::vector<size_t> group;
    int64_t count = 0;
    for (size_t i = first; i < tensors.size(); ++i) {
      if (done[i] || tensors[i].dtype() != dtype) continue;
      group.push_back(i);
      count += tensors[i].numel();
      done[i] = true;
    }
    if (count == 0) continue;
    if (group.size() == 1) {
      reduce(tensors[group[0]].raw_data(), count, dtype);
      continue;
    }
    pack.resize(static_cast<size_t>(count) * dtype_size(dtype));
    char* out = pack.data();
    for (size_t i : group) {
      std::memcpy(out, tensors[i].raw_data(), tensors[i].nbytes());
      out += tensors[i].nbytes();
    }
    reduce(pack.data(), count, dtype);
    const char* in = pack.data();
    for (size_t i : group) {
      std::memcpy(tensors[i].raw_data(), in, tensors[i].nbytes());
      in += tensors[i].nbytes();
    }
  }
}

std::vector<char> tensors_to_bytes(const std::vector<Tensor>& tensors) {
  std::vector<char> out;
  const int64_t count = static_cast<int64_t>(tensors.size());
  append(out, &count, sizeof(count));
  for (const Tensor& t : tensors) {
    const int64_t dtype = static_cast<int64_t>(t.dtype());
    const int64_t rank = t.rank();
    append(out, &dtype, sizeof(dtype));
    append(out, &rank, sizeof(rank));
    for (int64_t d : t.shape().dims()) append(out, &d, sizeof(d));
    if (t.nbytes() > 0) append(out, t.raw_data(), t.nbytes());
  }
  return out;
}

std::vector<Tensor> tensors_from_bytes(const std::vector<char>& bytes, const char* what) {
  size_t at = 0;
  auto read = [&](void* dst, size_t n) {
    TANDEM_CHECK(at + n <= bytes.size(), what, ": a truncated piece");
    std::memcpy(dst, bytes.data() + at, n);
    at += n;
  };
  int64_t count = 0;
  read(&count, sizeof(count));
  std::vector<Tensor> out;
  for (int64_t i = 0; i < count; ++i) {
    int64_t dtype = 0, rank = 0;
    read(&dtype, sizeof(dtype));
    read(&rank, sizeof(rank));
    std::vector<int64_t> dims(static_cast<size_t>(rank));
    for (int64_t& d : dims) read(&d, sizeof(d));
    Tensor t = Tensor::empty(Shape(dims), static_cast<DType>(dtype));
    if (t.nbytes() > 0) read(t.raw_data(), t.nbytes());
    out.push_back(std::move(t));
  }
  return out;
}

void divide_elements(Tensor& t, int n) {
  if (t.numel() == 0) return;
  dispatch_any_numeric(t.dtype(), "all_reduce(mean)", [&]<typename T>() {
    using Value = compute_type_t<T>;  // float for the 16-bit types
    T* p = t.data<T>();
    for (int64_t i = 0; i < t.numel(); ++i)
      p[i] = static_cast<T>(static_cast<Value>(p[i]) / static_cast<Value>(n));
  });
}

}  // namespace tandem::collectives
