// Host loops for cross-replica reductions: fixed order, so results are reproducible.
#include "tandem/distribute/internal/host_reduce.h"

#include <algorithm>
#include <cstring>
#include <sstream>

#include "tandem/collectives/internal/reduce_in_order.h"

namespace tandem::detail {

namespace {

std::string shapes_of(const std::vector<Tensor>& values) {
  std::ostringstream out;
  for (size_t i = 0; i < values.size(); ++i)
    out << (i ? ", " : "") << "replica " << i << ": " << values[i].dtype() << values[i].shape();
  return out.str();
}

}  // namespace

Tensor combine_elementwise(const std::vector<Tensor>& values, ReduceOp op, const char* what) {
  TANDEM_CHECK(!values.empty(), what, ": no values to reduce");
  for (const Tensor& v : values) {
    TANDEM_CHECK(v.defined(), what, ": a replica's value is undefined");
    TANDEM_CHECK(v.shape() == values[0].shape() && v.dtype() == values[0].dtype(), what,
                 ": element-wise reduction needs equal shapes and dtypes, got ", shapes_of(values),
                 " (pass axis= to reduce along a dimension whose size differs)");
  }
  Tensor out = values[0].to(Device::cpu()).clone();
  dispatch_numeric(out.dtype(), what, [&]<typename T>() {
    Tensor host;  // the value being added, on the CPU (one at a time)
    reduce_in_order(out.data<T>(), out.numel(), static_cast<int64_t>(values.size()), op,
                    [&](int64_t k) -> const T* {
                      host = values[static_cast<size_t>(k)].to(Device::cpu());
                      return host.data<T>();
                    });
  });
  return out;
}

Tensor reduce_over_axis(const Tensor& x, int64_t axis, ReduceOp op, const char* what) {
  TANDEM_CHECK(x.defined(), what, ": the value is undefined");
  TANDEM_CHECK(x.rank() > 0, what, ": axis ", axis, " given, but the value is a scalar");
  const Tensor host = x.to(Device::cpu());
  const size_t a = host.shape().normalize_axis(axis);
  std::vector<int64_t> dims = host.shape().dims();
  int64_t outer = 1, inner = 1;
  for (size_t d = 0; d < a; ++d) outer *= dims[d];
  for (size_t d = a + 1; d < dims.size(); ++d) inner *= dims[d];
  const int64_t length = dims[a];
  TANDEM_CHECK(op != ReduceOp::kMax || length > 0 || outer * inner == 0, what,
               ": the maximum over an empty axis ", axis, " of shape ", host.shape(),
               " is undefined");
  dims.erase(dims.begin() + static_cast<std::ptrdiff_t>(a));
  Tensor out = Tensor::zeros(Shape(dims), host.dtype());
  dispatch_numeric(host.dtype(), what, [&]<typename T>() {
    const T* in = host.data<T>();
    T* acc = out.data<T>();
    for (int64_t o = 0; o < outer; ++o) {
      T* row = acc + o * inner;
      const T* block = in + o * length * inner;
      if (length > 0) std::memcpy(row, block, static_cast<size_t>(inner) * sizeof(T));
      // kMean sums here: the caller divides by the count it means.
      reduce_in_order(row, inner, length, op == ReduceOp::kMax ? ReduceOp::kMax : ReduceOp::kSum,
                      [&](int64_t l) { return block + l * inner; });
    }
  });
  return out;
}

Tensor divide_by(const Tensor& x, double divisor) {
  Tensor out = x.to(Device::cpu()).clone();
  dispatch_numeric(out.dtype(), "divide", [&]<typename T>() {
    T* data = out.data<T>();
    const T d = static_cast<T>(divisor);
    for (int64_t i = 0; i < out.numel(); ++i) data[i] = static_cast<T>(data[i] / d);
  });
  return out;
}

Tensor concat_along(const std::vector<Tensor>& parts, int64_t axis, const char* what) {
  TANDEM_CHECK(!parts.empty(), what, ": nothing to concatenate");
  for (const Tensor& p : parts) TANDEM_CHECK(p.defined(), what, ": a replica's value is undefined");
  const Shape& first = parts[0].shape();
  TANDEM_CHECK(first.rank() > 0, what, ": cannot concatenate scalars along axis ", axis,
               " (give each replica's value a leading dimension, e.g. reshape({1}))");
  const size_t a = first.normalize_axis(axis);
  std::vector<int64_t> dims = first.dims();
  dims[a] = 0;
  for (const Tensor& p : parts) {
    bool compatible = p.rank() == first.rank() && p.dtype() == parts[0].dtype();
    for (size_t d = 0; compatible && d < dims.size(); ++d)
      compatible = d == a || p.shape().dims()[d] == first.dims()[d];
    TANDEM_CHECK(compatible, what, ": values must agree in dtype and in every dimension but axis ",
                 axis, "; got ", shapes_of(parts));
    dims[a] += p.shape().dims()[a];
  }
  Tensor out = Tensor::empty(Shape(dims), parts[0].dtype());
  int64_t outer = 1;
  for (size_t d = 0; d < a; ++d) outer *= dims[d];
  const size_t element = dtype_size(out.dtype());
  // Row o of the output is the concatenation of row o of every part.
  char* dst = static_cast<char*>(out.raw_data());
  std::vector<Tensor> host;
  host.reserve(parts.size());
  for (const Tensor& p : parts) host.push_back(p.to(Device::cpu()));
  for (int64_t o = 0; o < outer; ++o) {
    for (const Tensor& p : host) {
      const size_t row_bytes =
          static_cast<size_t>(p.numel() / std::max<int64_t>(outer, 1)) * element;
      if (row_bytes == 0) continue;
      std::memcpy(dst, static_cast<const char*>(p.raw_data()) + o * row_bytes, row_bytes);
      dst += row_bytes;
    }
  }
  return out;
}

}  // namespace tandem::detail
