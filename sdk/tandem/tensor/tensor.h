// Tensor: a handle to a contiguous row-major array (shape, dtype, device) over shared storage.
// Copies of a Tensor alias the same data; views (reshape, slice along axis 0) share storage.
#pragma once

#include <cstdint>
#include <cstring>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "tandem/core/device.h"
#include "tandem/core/dtype.h"
#include "tandem/core/error.h"
#include "tandem/core/shape.h"
#include "tandem/tensor/allocator.h"
#include "tandem/tensor/random.h"

namespace tandem {

/// A block of device or host memory, returned to its allocator when the last owner goes.
class Storage {
 public:
  /// Allocates `nbytes` bytes from `allocator`.
  Storage(size_t nbytes, Allocator& allocator)
      : nbytes_(nbytes), allocator_(&allocator), data_(allocator.allocate(nbytes)) {}
  ~Storage() { allocator_->deallocate(data_, nbytes_); }
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  /// The first byte (device memory for a CUDA allocator).
  void* data() const { return data_; }
  /// The size requested at construction, in bytes.
  size_t nbytes() const { return nbytes_; }
  /// The device the memory lives on (the allocator's).
  Device device() const { return allocator_->device(); }

 private:
  size_t nbytes_;
  Allocator* allocator_;
  void* data_;
};

/// The shared state behind a Tensor handle. Its address is the tensor's identity for tapes.
struct TensorImpl {
  /// The memory, shared by views of the same tensor.
  std::shared_ptr<Storage> storage;
  /// Where the tensor's first element lies in `storage`, in bytes.
  size_t offset_bytes = 0;
  /// The tensor's dimensions.
  Shape shape;
  /// The element type.
  DType dtype = DType::kFloat32;
};

/// A handle to a dense, row-major array of `dtype()` elements on `device()`. Copies alias the
/// same data (Tensor b = a; b.fill_(0) changes a); clone() copies. Ops are in tandem::ops and
/// the arithmetic operators; the factories below make new tensors.
class Tensor {
 public:
  /// An undefined tensor (no storage); gradients of unconnected variables are undefined.
  Tensor() = default;

  // ---- factories -------------------------------------------------------------------------
  /// Uninitialised memory of `shape` (its contents are whatever the allocator held).
  static Tensor empty(const Shape& shape, DType dtype = DType::kFloat32,
                      Device device = Device::cpu());
  /// Every element 0.
  static Tensor zeros(const Shape& shape, DType dtype = DType::kFloat32,
                      Device device = Device::cpu());
  /// Every element 1.
  static Tensor ones(const Shape& shape, DType dtype = DType::kFloat32,
                     Device device = Device::cpu());
  /// Every element `value` (converted to `dtype`).
  static Tensor full(const Shape& shape, double value, DType dtype = DType::kFloat32,
                     Device device = Device::cpu());
  /// A rank-0 tensor holding `value`.
  static Tensor scalar(double value, DType dtype = DType::kFloat32, Device device = Device::cpu());
  /// Copies `values` into a new CPU tensor of `shape` (numel must match), dtype from T.
  template <typename T>
  static Tensor from_vector(const std::vector<T>& values, const Shape& shape);
  template <typename T>
  /// The same as a rank-1 tensor of values.size() elements:
  /// `Tensor::from_vector(std::vector<float>{1, 2, 3})`.
  static Tensor from_vector(const std::vector<T>& values) {
    return from_vector(values, Shape{static_cast<int64_t>(values.size())});
  }
  /// [0, 1, ..., n-1].
  static Tensor arange(int64_t n, DType dtype = DType::kInt64, Device device = Device::cpu());
  /// Uniform in [low, high) drawn from `generator` (Philox; identical on every device).
  static Tensor uniform(const Shape& shape, Generator& generator, double low = 0.0,
                        double high = 1.0, DType dtype = DType::kFloat32,
                        Device device = Device::cpu());
  /// Normal(mean, stddev) drawn from `generator` (Box-Muller over Philox).
  static Tensor normal(const Shape& shape, Generator& generator, double mean = 0.0,
                       double stddev = 1.0, DType dtype = DType::kFloat32,
                       Device device = Device::cpu());
  /// Zeros of `other`'s shape, dtype and device.
  static Tensor zeros_like(const Tensor& other);
  /// Ones of `other`'s shape, dtype and device.
  static Tensor ones_like(const Tensor& other);
  /// Uninitialised memory of `other`'s shape, dtype and device.
  static Tensor empty_like(const Tensor& other);

  // ---- properties ------------------------------------------------------------------------
  /// False for a default-constructed tensor (e.g. the gradient of an unconnected variable).
  bool defined() const { return impl_ != nullptr; }
  /// The dimensions ([] for a scalar).
  const Shape& shape() const;
  /// The size of axis `axis`; negative axes count from the end.
  int64_t dim(int64_t axis) const { return shape()[axis]; }
  /// The number of axes (0 for a scalar).
  int64_t rank() const { return shape().rank(); }
  /// The number of elements.
  int64_t numel() const { return shape().numel(); }
  /// The element type.
  DType dtype() const;
  /// Where the data lives: Device::cpu() or Device::cuda(i).
  Device device() const;
  /// numel() times the element size, in bytes.
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype()); }
  /// Identity used by gradient tapes: equal for handles of the same tensor, not for views.
  const TensorImpl* id() const { return impl_.get(); }
  /// True when both handles view the same bytes of the same storage.
  bool shares_storage_with(const Tensor& other) const;

  // ---- element access (CPU tensors) -----------------------------------------------------
  /// Typed pointer to the first element; raises unless the dtype is T and the tensor is on CPU.
  template <typename T>
  T* data() const;
  /// Untyped pointer to the first element, on whichever device the tensor lives.
  void* raw_data() const;
  /// The value of a one-element tensor, converted to T (copied to the host if needed).
  template <typename T>
  T item() const;
  /// All elements converted to T, row-major (copied to the host if needed).
  template <typename T>
  std::vector<T> to_vector() const;

  // ---- copies and views -----------------------------------------------------------------
  /// This tensor on `device` (the same handle when already there).
  Tensor to(Device device) const;
  /// A deep copy with its own storage.
  Tensor clone() const;
  /// Copies `source` (same shape and dtype, any device) into this tensor's memory.
  void copy_from(const Tensor& source);
  /// Fills every element with `value`.
  void fill_(double value);
  /// A view with another shape of the same numel (records on gradient tapes: ops::reshape).
  Tensor reshape(const Shape& shape) const;
  /// Rows [begin, end) along axis 0 as a view (records on gradient tapes: ops::slice).
  Tensor slice(int64_t begin, int64_t end) const;
  /// A view without tape recording (internal building block of ops::reshape / ops::slice).
  Tensor view_as(const Shape& shape, size_t extra_offset_bytes = 0) const;

  /// "Tensor(shape=[2, 3], dtype=float32, device=cpu, [[...]])", the values in nested brackets;
  /// elements past `max_elements` are elided with "...". Copies to the host when needed.
  std::string to_string(int64_t max_elements = 64) const;

 private:
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}
  const TensorImpl& impl() const;

  std::shared_ptr<TensorImpl> impl_;
};

/// Writes tensor.to_string().
std::ostream& operator<<(std::ostream& out, const Tensor& tensor);

// ---- arithmetic operators (defined in ops.cpp; they record on gradient tapes) ------------
/// \name Arithmetic operators
///@{

/// Element-wise a + b, a - b, a * b, a / b and -a, as ops::add, ops::sub, ops::mul, ops::div and
/// ops::neg: tensors broadcast (NumPy rules) and a double applies to every element. They
/// record on gradient tapes.
Tensor operator+(const Tensor& a, const Tensor& b);
Tensor operator-(const Tensor& a, const Tensor& b);
Tensor operator*(const Tensor& a, const Tensor& b);
Tensor operator/(const Tensor& a, const Tensor& b);
Tensor operator-(const Tensor& a);
Tensor operator+(const Tensor& a, double b);
Tensor operator-(const Tensor& a, double b);
Tensor operator*(const Tensor& a, double b);
Tensor operator/(const Tensor& a, double b);
Tensor operator*(double a, const Tensor& b);
///@}

// ---- template definitions ------------------------------------------------------------------

template <typename T>
Tensor Tensor::from_vector(const std::vector<T>& values, const Shape& shape) {
  TANDEM_CHECK(static_cast<int64_t>(values.size()) == shape.numel(), "Tensor::from_vector: ",
               values.size(), " values do not fill shape ", shape, " (", shape.numel(),
               " elements)");
  Tensor t = empty(shape, dtype_of<T>);
  if constexpr (std::is_same_v<T, bool>) {
    bool* out = t.data<bool>();
    for (size_t i = 0; i < values.size(); ++i) out[i] = values[i];
  } else {
    if (!values.empty()) std::memcpy(t.raw_data(), values.data(), values.size() * sizeof(T));
  }
  return t;
}

namespace detail {
[[noreturn]] void throw_bad_data_access(DType have, DType want, Device device);
}

template <typename T>
T* Tensor::data() const {
  const TensorImpl& i = impl();
  if (i.dtype != dtype_of<T> || !i.storage->device().is_cpu()) [[unlikely]]
    detail::throw_bad_data_access(i.dtype, dtype_of<T>, i.storage->device());
  return reinterpret_cast<T*>(static_cast<char*>(i.storage->data()) + i.offset_bytes);
}

template <typename T>
std::vector<T> Tensor::to_vector() const {
  const Tensor host = to(Device::cpu());
  std::vector<T> out(static_cast<size_t>(host.numel()));
  dispatch_dtype(host.dtype(), [&]<typename S>() {
    const S* src = reinterpret_cast<const S*>(host.raw_data());
    for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<T>(src[i]);
  });
  return out;
}

template <typename T>
T Tensor::item() const {
  TANDEM_CHECK(defined() && numel() == 1, "Tensor::item: needs exactly one element, shape is ",
               defined() ? shape() : Shape{});
  return to_vector<T>()[0];
}

}  // namespace tandem
