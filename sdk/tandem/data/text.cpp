#include "tandem/data/text.h"

#include <cstring>
#include <fstream>
#include <sstream>

#include "tandem/data/internal/node.h"
#include "tandem/tensor/philox.h"

namespace tandem::data {
namespace detail {
namespace {

class RandomWindowsSource final : public Source {
 public:
  RandomWindowsSource(Tensor tokens, int64_t window, int64_t count, uint64_t seed)
      : tokens_(std::move(tokens)), window_(window), count_(count), seed_(seed) {}

  int64_t size() const override { return count_; }
  bool cheap_random_access() const override { return true; }
  std::vector<TensorSpec> element_spec() const override {
    return {{Shape{window_}, DType::kInt64}, {Shape{window_}, DType::kInt64}};
  }
  std::string describe() const override {
    std::ostringstream out;
    out << "random_windows(" << count_ << " windows of " << window_ << " from " << tokens_.numel()
        << " tokens, seed=" << seed_ << ")";
    return out.str();
  }

  /// Element `index`'s first token.
  int64_t offset(int64_t index) const {
    const philox::Block bits = philox::block(seed_, 0, static_cast<uint64_t>(index));
    const uint64_t wide = (static_cast<uint64_t>(bits.v[0]) << 32) | bits.v[1];
    return static_cast<int64_t>(wide % static_cast<uint64_t>(tokens_.numel() - window_));
  }

  class Reader final : public SourceReader {
   public:
    explicit Reader(const RandomWindowsSource& source) : source_(source) {}
    void read(int64_t index, Element& out) override {
      out.resize(2);
      out[0] = Tensor::empty(Shape{source_.window_}, DType::kInt64);
      out[1] = Tensor::empty(Shape{source_.window_}, DType::kInt64);
      fill(index, out[0].data<int64_t>(), out[1].data<int64_t>());
    }
    void gather(const std::vector<int64_t>& indices, Element& out) override {
      const auto rows = static_cast<int64_t>(indices.size());
      const int64_t w = source_.window_;
      out.resize(2);
      out[0] = Tensor::empty(Shape{rows, w}, DType::kInt64);
      out[1] = Tensor::empty(Shape{rows, w}, DType::kInt64);
      for (int64_t r = 0; r < rows; ++r)
        fill(indices[static_cast<size_t>(r)], out[0].data<int64_t>() + r * w,
             out[1].data<int64_t>() + r * w);
    }

   private:
    void fill(int64_t index, int64_t* x, int64_t* y) const {
      TANDEM_CHECK(index >= 0 && index < source_.count_, "element ", index, " requested from ",
                   source_.describe());
      const int64_t o = source_.offset(index);
      const int64_t* t = source_.tokens_.data<int64_t>();
      std::memcpy(x, t + o, static_cast<size_t>(source_.window_) * sizeof(int64_t));
      std::memcpy(y, t + o + 1, static_cast<size_t>(source_.window_) * sizeof(int64_t));
    }
    const RandomWindowsSource& source_;
  };

  std::unique_ptr<SourceReader> reader() const override { return std::make_unique<Reader>(*this); }

 private:
  Tensor tokens_;  // int64 [n], on the host
  int64_t window_, count_;
  uint64_t seed_;
};

}  // namespace
}  // namespace detail

std::string read_text_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  TANDEM_CHECK(in.good(), "read_text_file: cannot open \"", path, "\"");
  std::ostringstream bytes;
  bytes << in.rdbuf();
  TANDEM_CHECK(!in.bad(), "read_text_file: reading \"", path, "\" failed");
  return bytes.str();
}

Dataset random_windows(const Tensor& tokens, int64_t window, int64_t count, uint64_t seed) {
  TANDEM_CHECK(tokens.defined() && tokens.rank() == 1 &&
                   (tokens.dtype() == DType::kInt64 || tokens.dtype() == DType::kInt32),
               "data::random_windows: needs tokens int32 or int64 [n], got ",
               tokens.defined() ? tokens.shape() : Shape{}, " ",
               tokens.defined() ? tokens.dtype() : DType::kInt64);
  TANDEM_CHECK(window >= 1, "data::random_windows: window must be positive, got ", window);
  TANDEM_CHECK(tokens.numel() > window, "data::random_windows: ", tokens.numel(),
               " tokens hold no window of ", window, " and its next token (needs more than ",
               window, ")");
  TANDEM_CHECK(count >= 0, "data::random_windows: count must be non-negative, got ", count);
  const Tensor on_host = tokens.to(Device::cpu());
  Tensor host = Tensor::empty(Shape{tokens.numel()}, DType::kInt64);
  int64_t* to = host.data<int64_t>();
  if (on_host.dtype() == DType::kInt64) {
    std::memcpy(to, on_host.data<int64_t>(), static_cast<size_t>(host.numel()) * sizeof(int64_t));
  } else {
    const int32_t* from = on_host.data<int32_t>();
    for (int64_t i = 0; i < host.numel(); ++i) to[i] = from[i];
  }
  auto source = std::make_shared<detail::RandomWindowsSource>(std::move(host), window, count, seed);
  return Dataset(detail::make_source_node(std::move(source), "random_windows"));
}

}  // namespace tandem::data
