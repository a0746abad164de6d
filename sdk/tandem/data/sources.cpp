// In-memory sources (from_tensor_slices, range) and the dispatch of data::hdf5 to the HDF5
// reader, which exists only in builds with HDF5.
#include <cstring>
#include <sstream>

#include "tandem/data/internal/node.h"

namespace tandem::data {
namespace detail {
namespace {

/// Rows of a few host tensors sharing dim 0.
class TensorSlicesSource final : public Source {
 public:
  TensorSlicesSource(std::vector<Tensor> tensors, std::string name)
      : tensors_(std::move(tensors)), name_(std::move(name)), size_(tensors_[0].dim(0)) {
    for (const Tensor& t : tensors_) {
      row_shapes_.push_back(drop_first_dim(t.shape()));
      row_bytes_.push_back(row_shapes_.back().nbytes(dtype_size(t.dtype())));
    }
  }

  int64_t size() const override { return size_; }
  bool cheap_random_access() const override { return true; }
  std::vector<TensorSpec> element_spec() const override {
    std::vector<TensorSpec> spec;
    for (size_t c = 0; c < tensors_.size(); ++c)
      spec.push_back({row_shapes_[c], tensors_[c].dtype()});
    return spec;
  }
  std::string describe() const override {
    std::ostringstream out;
    out << name_ << "(" << size_ << " elements of";
    for (size_t c = 0; c < tensors_.size(); ++c)
      out << (c ? "," : "") << " " << row_shapes_[c] << " " << tensors_[c].dtype();
    out << ")";
    return out.str();
  }

  class Reader final : public SourceReader {
   public:
    explicit Reader(const TensorSlicesSource& source) : source_(source) {}
    void read(int64_t index, Element& out) override {
      check_index(index);
      out.resize(source_.tensors_.size());
      for (size_t c = 0; c < out.size(); ++c) {
        out[c] = Tensor::empty(source_.row_shapes_[c], source_.tensors_[c].dtype());
        copy_row(c, index, out[c].raw_data());
      }
    }
    void gather(const std::vector<int64_t>& indices, Element& out) override {
      out.resize(source_.tensors_.size());
      const auto rows = static_cast<int64_t>(indices.size());
      for (size_t c = 0; c < out.size(); ++c) {
        out[c] =
            Tensor::empty(prepend_dim(rows, source_.row_shapes_[c]), source_.tensors_[c].dtype());
        char* dst = static_cast<char*>(out[c].raw_data());
        for (int64_t r = 0; r < rows; ++r) {
          check_index(indices[r]);
          copy_row(c, indices[r], dst + static_cast<size_t>(r) * source_.row_bytes_[c]);
        }
      }
    }

   private:
    void check_index(int64_t index) const {
      TANDEM_CHECK(index >= 0 && index < source_.size_, "element ", index, " requested from ",
                   source_.describe());
    }
    void copy_row(size_t c, int64_t index, void* dst) const {
      const size_t n = source_.row_bytes_[c];
      if (n == 0) return;
      std::memcpy(dst, static_cast<const char*>(source_.tensors_[c].raw_data()) + index * n, n);
    }
    const TensorSlicesSource& source_;
  };

  // Readers refer to the source; the nodes keep it alive while iterators exist.
  std::unique_ptr<SourceReader> reader() const override { return std::make_unique<Reader>(*this); }

 private:
  std::vector<Tensor> tensors_;
  std::string name_;
  int64_t size_;
  std::vector<Shape> row_shapes_;
  std::vector<size_t> row_bytes_;
};

Dataset slices_dataset(std::vector<Tensor> tensors, std::string name) {
  TANDEM_CHECK(!tensors.empty(), "data::from_tensor_slices: no tensors given");
  std::vector<Tensor> host;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    TANDEM_CHECK(t.defined(), "data::from_tensor_slices: tensor ", i, " is undefined");
    TANDEM_CHECK(t.rank() >= 1, "data::from_tensor_slices: tensor ", i, " is a scalar; ",
                 "every tensor needs a dim 0 to slice along");
    TANDEM_CHECK(t.dim(0) == tensors[0].dim(0), "data::from_tensor_slices: tensor ", i, " has ",
                 t.dim(0), " rows (shape ", t.shape(), ") but tensor 0 has ", tensors[0].dim(0),
                 " (shape ", tensors[0].shape(), ")");
    // A private copy: later writes to the caller's tensor do not change the dataset.
    host.push_back(t.device().is_cpu() ? t.clone() : t.to(Device::cpu()));
  }
  auto source = std::make_shared<TensorSlicesSource>(std::move(host), name);
  return Dataset(make_source_node(std::move(source), std::move(name)));
}

}  // namespace
}  // namespace detail

Dataset from_tensor_slices(std::vector<Tensor> tensors) {
  return detail::slices_dataset(std::move(tensors), "tensor_slices");
}

Dataset range(int64_t n) {
  TANDEM_CHECK(n >= 0, "data::range: n must be non-negative, got ", n);
  return detail::slices_dataset({Tensor::arange(n, DType::kInt64)}, "range");
}

Dataset hdf5(std::vector<std::string> files, std::vector<std::string> dataset_names,
             int64_t chunk_rows) {
#if TANDEM_WITH_HDF5
  return Dataset(detail::make_source_node(
      detail::make_hdf5_source(std::move(files), std::move(dataset_names), chunk_rows), "hdf5"));
#else
  (void)files;
  (void)dataset_names;
  (void)chunk_rows;
  throw NotBuiltError(
      "data::hdf5: Tandem was built without HDF5 (TANDEM_WITH_HDF5=0). Install libhdf5-dev "
      "(scripts/setup does) and re-run CMake; it sets TANDEM_WITH_HDF5=1 when it finds HDF5");
#endif
}

}  // namespace tandem::data
