// Tensor construction, host/device copies, views and printing.
#include "tandem/tensor/tensor.h"

#include <cmath>
#include <functional>
#include <iomanip>
#include <optional>
#include <sstream>

#include "tandem/core/spans.h"
#include "tandem/tensor/internal/device_memory.h"
#include "tandem/tensor/philox.h"

namespace tandem {

namespace detail {
void throw_bad_data_access(DType have, DType want, Device device) {
  TANDEM_CHECK(device.is_cpu(), "Tensor::data: the tensor lives on ", device,
               "; copy it with .to(Device::cpu()) first");
  TANDEM_THROW("Tensor::data: the tensor holds ", have, ", not ", want);
}
}  // namespace detail

const TensorImpl& Tensor::impl() const {
  TANDEM_CHECK(impl_ != nullptr, "use of an undefined tensor (e.g. the gradient of a variable "
                                 "the target does not depend on)");
  return *impl_;
}

const Shape& Tensor::shape() const { return impl().shape; }
DType Tensor::dtype() const { return impl().dtype; }
Device Tensor::device() const { return impl().storage->device(); }

void* Tensor::raw_data() const {
  const TensorImpl& i = impl();
  return static_cast<char*>(i.storage->data()) + i.offset_bytes;
}

bool Tensor::shares_storage_with(const Tensor& other) const {
  return defined() && other.defined() && impl_->storage == other.impl_->storage &&
         impl_->offset_bytes == other.impl_->offset_bytes;
}

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device) {
  for (int64_t d : shape) TANDEM_CHECK(d >= 0, "Tensor::empty: negative dimension in ", shape);
  auto impl = std::make_shared<TensorImpl>();
  const size_t nbytes = shape.nbytes(dtype_size(dtype));  // raises when it overflows
  impl->storage = std::make_shared<Storage>(nbytes, allocator_for(device));
  impl->shape = shape;
  impl->dtype = dtype;
  return Tensor(std::move(impl));
}

Tensor Tensor::full(const Shape& shape, double value, DType dtype, Device device) {
  Tensor t = empty(shape, dtype, device);
  t.fill_(value);
  return t;
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, Device device) {
  return full(shape, 0.0, dtype, device);
}
Tensor Tensor::ones(const Shape& shape, DType dtype, Device device) {
  return full(shape, 1.0, dtype, device);
}
Tensor Tensor::scalar(double value, DType dtype, Device device) {
  return full(Shape{}, value, dtype, device);
}
Tensor Tensor::zeros_like(const Tensor& o) { return zeros(o.shape(), o.dtype(), o.device()); }
Tensor Tensor::ones_like(const Tensor& o) { return ones(o.shape(), o.dtype(), o.device()); }
Tensor Tensor::empty_like(const Tensor& o) { return empty(o.shape(), o.dtype(), o.device()); }

Tensor Tensor::arange(int64_t n, DType dtype, Device device) {
  TANDEM_CHECK(n >= 0, "Tensor::arange: n must be non-negative, got ", n);
  Tensor t = empty(Shape{n}, dtype, Device::cpu());
  dispatch_dtype(dtype, [&]<typename T>() {
    T* out = t.data<T>();
    for (int64_t i = 0; i < n; ++i) out[i] = static_cast<T>(i);
  });
  return t.to(device);
}

Tensor Tensor::uniform(const Shape& shape, Generator& generator, double low, double high,
                       DType dtype, Device device) {
  TANDEM_CHECK(low <= high, "Tensor::uniform: low ", low, " exceeds high ", high);
  Tensor t = empty(shape, dtype, Device::cpu());
  const int64_t n = t.numel();
  const uint64_t seed = generator.seed(), stream = generator.stream();
  dispatch_floating(dtype, "Tensor::uniform", [&]<typename T>() {
    T* out = t.data<T>();
    if constexpr (std::is_same_v<T, float>) {
      // Four floats per Philox block: element i takes lane i % 4 of block first + i / 4.
      const uint64_t first = generator.reserve(static_cast<uint64_t>((n + 3) / 4));
      for (int64_t i = 0; i < n; ++i) {
        const philox::Block b = philox::block(seed, stream, first + i / 4);
        const float u = philox::to_unit_float(b.v[i % 4]);
        out[i] = static_cast<float>(low + (high - low) * u);
      }
    } else {
      // Two doubles per block: element i takes lanes (2k, 2k+1), k = i % 2.
      const uint64_t first = generator.reserve(static_cast<uint64_t>((n + 1) / 2));
      for (int64_t i = 0; i < n; ++i) {
        const philox::Block b = philox::block(seed, stream, first + i / 2);
        const int k = static_cast<int>(i % 2) * 2;
        out[i] = low + (high - low) * philox::to_unit_double(b.v[k], b.v[k + 1]);
      }
    }
  });
  return t.to(device);
}

Tensor Tensor::normal(const Shape& shape, Generator& generator, double mean, double stddev,
                      DType dtype, Device device) {
  TANDEM_CHECK(stddev >= 0, "Tensor::normal: stddev must be non-negative, got ", stddev);
  Tensor t = empty(shape, dtype, Device::cpu());
  const int64_t n = t.numel();
  const uint64_t seed = generator.seed(), stream = generator.stream();
  // Box-Muller: one block gives two uniform pairs (float) or one pair (double); each pair
  // gives two normals (cos and sin branch). Element i uses pair i / 2 and branch i % 2.
  const uint64_t first = generator.reserve(static_cast<uint64_t>((n + 1) / 2));
  constexpr double kTwoPi = 6.283185307179586;
  dispatch_floating(dtype, "Tensor::normal", [&]<typename T>() {
    T* out = t.data<T>();
    for (int64_t i = 0; i < n; ++i) {
      const philox::Block b = philox::block(seed, stream, first + i / 2);
      const double u1 = 1.0 - philox::to_unit_double(b.v[0], b.v[1]);  // (0, 1]
      const double u2 = philox::to_unit_double(b.v[2], b.v[3]);
      const double r = std::sqrt(-2.0 * std::log(u1));
      const double z = (i % 2 == 0) ? r * std::cos(kTwoPi * u2) : r * std::sin(kTwoPi * u2);
      out[i] = static_cast<T>(mean + stddev * z);
    }
  });
  return t.to(device);
}

Tensor Tensor::to(Device device) const {
  if (this->device() == device) return *this;
  // A GPU value read back waits for the GPU's queued work: the timeline's host synchronisation.
  std::optional<profile::Span> sync;
  if (this->device().is_cuda() && device.is_cpu()) sync.emplace(profile::Phase::kHostSync);
  Tensor out = empty(shape(), dtype(), device);
  copy_bytes(out.raw_data(), device, raw_data(), this->device(), nbytes());
  return out;
}

Tensor Tensor::clone() const {
  Tensor out = empty(shape(), dtype(), device());
  copy_bytes(out.raw_data(), device(), raw_data(), device(), nbytes());
  return out;
}

void Tensor::copy_from(const Tensor& source) {
  TANDEM_CHECK(source.shape() == shape() && source.dtype() == dtype(), "Tensor::copy_from: ",
               "source ", source.shape(), " ", source.dtype(), " does not match destination ",
               shape(), " ", dtype());
  copy_bytes(raw_data(), device(), source.raw_data(), source.device(), nbytes());
}

void Tensor::fill_(double value) {
  if (numel() == 0) return;
  Tensor host = device().is_cpu() ? *this : empty(shape(), dtype(), Device::cpu());
  dispatch_dtype(dtype(), [&]<typename T>() {
    T* out = host.data<T>();
    const T v = static_cast<T>(value);
    for (int64_t i = 0, n = numel(); i < n; ++i) out[i] = v;
  });
  if (!device().is_cpu()) copy_from(host);
}

Tensor Tensor::view_as(const Shape& shape, size_t extra_offset_bytes) const {
  const TensorImpl& i = impl();
  TANDEM_CHECK(extra_offset_bytes + static_cast<size_t>(shape.numel()) * dtype_size(i.dtype) <=
                   i.storage->nbytes() - i.offset_bytes,
               "view of shape ", shape, " does not fit in a tensor of shape ", i.shape);
  auto view = std::make_shared<TensorImpl>();
  view->storage = i.storage;
  view->offset_bytes = i.offset_bytes + extra_offset_bytes;
  view->shape = shape;
  view->dtype = i.dtype;
  return Tensor(std::move(view));
}

std::string Tensor::to_string(int64_t max_elements) const {
  std::ostringstream out;
  if (!defined()) return "Tensor(undefined)";
  out << "Tensor(shape=" << shape() << ", dtype=" << dtype() << ", device=" << device();
  const Tensor host = to(Device::cpu());
  const std::vector<double> values = host.to_vector<double>();
  const auto& dims = shape().dims();
  const std::vector<int64_t> strides = shape().strides();
  out << ",\n  ";
  if (dims.empty()) {
    out << values[0] << ")";
    return out.str();
  }
  // Prints nested brackets; elements past max_elements are elided with "...".
  int64_t printed = 0;
  std::function<void(size_t, int64_t)> print = [&](size_t axis, int64_t base) {
    out << "[";
    for (int64_t k = 0; k < dims[axis]; ++k) {
      if (printed >= max_elements) {
        out << "...";
        break;
      }
      if (k) out << (axis + 1 == dims.size() ? ", " : ",\n   ");
      if (axis + 1 == dims.size()) {
        out << std::setprecision(6) << values[base + k];
        ++printed;
      } else {
        print(axis + 1, base + k * strides[axis]);
      }
    }
    out << "]";
  };
  print(0, 0);
  out << ")";
  return out.str();
}

std::ostream& operator<<(std::ostream& out, const Tensor& tensor) {
  return out << tensor.to_string();
}

}  // namespace tandem
