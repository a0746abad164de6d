// Image transformations (image.h) and image_dataset_from_directory; the decoders are in
// image_codecs.cpp.
#include "tandem/data/image.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <sstream>

#include "tandem/core/error.h"
#include "tandem/core/half.h"
#include "tandem/data/internal/node.h"
#include "tandem/tensor/random.h"

namespace tandem::data {

namespace {

namespace fs = std::filesystem;

/// [h, w, c] of a host image; raises naming `what` otherwise.
void check_image(const Tensor& image, const char* what) {
  TANDEM_CHECK(image.rank() == 3 && image.device().is_cpu(), what,
               ": an image is a host tensor [height, width, channels], got ", image.shape(), " on ",
               image.device());
  TANDEM_CHECK(image.dtype() == DType::kUInt8 || image.dtype() == DType::kFloat32, what,
               ": images are uint8 or float32, got ", image.dtype());
}

/// Pixel (y, x, c) of a uint8 or float32 image as float.
struct Pixels {
  explicit Pixels(const Tensor& image)
      : u8(image.dtype() == DType::kUInt8 ? image.data<uint8_t>() : nullptr),
        f32(image.dtype() == DType::kFloat32 ? image.data<float>() : nullptr) {}
  float operator[](int64_t i) const { return u8 != nullptr ? static_cast<float>(u8[i]) : f32[i]; }
  const uint8_t* u8;
  const float* f32;
};

/// TensorFlow's resize weights with half-pixel centers: source rows (or columns) lower and
/// upper of each output one, and the weight of upper.
struct Weights {
  std::vector<int64_t> lower, upper;
  std::vector<float> lerp;
};

Weights weights(int64_t in, int64_t out) {
  Weights w;
  const float scale = static_cast<float>(in) / static_cast<float>(out);
  for (int64_t i = 0; i < out; ++i) {
    const float at = (static_cast<float>(i) + 0.5f) * scale - 0.5f;
    const float floor = std::floor(at);
    w.lower.push_back(std::max<int64_t>(static_cast<int64_t>(floor), 0));
    w.upper.push_back(std::min<int64_t>(static_cast<int64_t>(std::ceil(at)), in - 1));
    w.lerp.push_back(at - floor);
  }
  return w;
}

/// A uniform integer in [0, bound) from Philox(seed, stream): each use of a seed its stream.
int64_t draw(uint64_t seed, uint64_t stream, int64_t bound) {
  Generator g(seed, stream);
  return static_cast<int64_t>(g.uniform_int(static_cast<uint64_t>(bound)));
}

}  // namespace

Tensor decode_image(std::string_view bytes, int channels) {
  const auto starts = [&](std::string_view magic) {
    return bytes.substr(0, magic.size()) == magic;
  };
  if (starts("\xff\xd8\xff")) return decode_jpeg(bytes, channels);
  if (starts("\x89PNG\r\n\x1a\n")) return decode_png(bytes, channels);
  TANDEM_THROW("decode_image: the data (", bytes.size(), " bytes) is neither JPEG nor PNG",
               starts("GIF8") ? " (a GIF: not supported)"
               : starts("BM") ? " (a BMP: not supported)"
                              : "");
}

Tensor decode_image(const Tensor& bytes, int channels) {
  TANDEM_CHECK(bytes.dtype() == DType::kUInt8 && bytes.rank() <= 1,
               "decode_image: encoded bytes are a uint8 vector, got ", bytes.dtype(), " ",
               bytes.shape());
  const Tensor host = bytes.to(Device::cpu());
  return decode_image(std::string_view(static_cast<const char*>(host.raw_data()),
                                       static_cast<size_t>(host.numel())),
                      channels);
}

Tensor resize_bilinear(const Tensor& image, int64_t height, int64_t width) {
  check_image(image, "resize_bilinear");
  TANDEM_CHECK(height > 0 && width > 0, "resize_bilinear: the size must be positive, got ", height,
               "x", width);
  const int64_t in_h = image.dim(0), in_w = image.dim(1), c = image.dim(2);
  TANDEM_CHECK(in_h > 0 && in_w > 0, "resize_bilinear: the image is empty: ", image.shape());
  const Weights ys = weights(in_h, height), xs = weights(in_w, width);
  const Pixels in(image);
  Tensor out = Tensor::empty(Shape{height, width, c}, DType::kFloat32);
  float* o = out.data<float>();
  for (int64_t y = 0; y < height; ++y) {
    const int64_t top_row = ys.lower[y] * in_w * c, bottom_row = ys.upper[y] * in_w * c;
    const float y_lerp = ys.lerp[y];
    for (int64_t x = 0; x < width; ++x) {
      const int64_t left = xs.lower[x] * c, right = xs.upper[x] * c;
      const float x_lerp = xs.lerp[x];
      for (int64_t k = 0; k < c; ++k) {
        const float top_left = in[top_row + left + k], top_right = in[top_row + right + k];
        const float bottom_left = in[bottom_row + left + k];
        const float bottom_right = in[bottom_row + right + k];
        // TensorFlow's compute_lerp, rounding each step alike (no contraction in this file).
        const float top = top_left + (top_right - top_left) * x_lerp;
        const float bottom = bottom_left + (bottom_right - bottom_left) * x_lerp;
        *o++ = top + (bottom - top) * y_lerp;
      }
    }
  }
  return out;
}

Tensor crop(const Tensor& image, int64_t top, int64_t left, int64_t height, int64_t width) {
  check_image(image, "crop");
  TANDEM_CHECK(top >= 0 && left >= 0 && height > 0 && width > 0 && top + height <= image.dim(0) &&
                   left + width <= image.dim(1),
               "crop: [", top, ", ", top + height, ") x [", left, ", ", left + width,
               ") is not inside an image of ", image.shape());
  const int64_t c = image.dim(2);
  const size_t element = dtype_size(image.dtype());
  Tensor out = Tensor::empty(Shape{height, width, c}, image.dtype());
  const size_t row = static_cast<size_t>(width * c) * element;
  for (int64_t y = 0; y < height; ++y)
    std::memcpy(static_cast<char*>(out.raw_data()) + static_cast<size_t>(y) * row,
                static_cast<const char*>(image.raw_data()) +
                    static_cast<size_t>(((top + y) * image.dim(1) + left) * c) * element,
                row);
  return out;
}

Tensor flip_left_right(const Tensor& image) {
  check_image(image, "flip_left_right");
  const int64_t h = image.dim(0), w = image.dim(1), c = image.dim(2);
  const size_t pixel = static_cast<size_t>(c) * dtype_size(image.dtype());
  Tensor out = Tensor::empty(image.shape(), image.dtype());
  const auto* src = static_cast<const char*>(image.raw_data());
  auto* dst = static_cast<char*>(out.raw_data());
  for (int64_t y = 0; y < h; ++y)
    for (int64_t x = 0; x < w; ++x)
      std::memcpy(dst + static_cast<size_t>(y * w + x) * pixel,
                  src + static_cast<size_t>(y * w + (w - 1 - x)) * pixel, pixel);
  return out;
}

Tensor random_crop(const Tensor& image, int64_t height, int64_t width, uint64_t seed) {
  check_image(image, "random_crop");
  TANDEM_CHECK(height > 0 && width > 0 && height <= image.dim(0) && width <= image.dim(1),
               "random_crop: a ", height, "x", width, " crop does not fit an image of ",
               image.shape());
  const int64_t top = draw(seed, 0, image.dim(0) - height + 1);
  const int64_t left = draw(seed, 1, image.dim(1) - width + 1);
  return crop(image, top, left, height, width);
}

Tensor random_flip_left_right(const Tensor& image, uint64_t seed) {
  check_image(image, "random_flip_left_right");
  return draw(seed, 0, 2) == 1 ? flip_left_right(image) : image;
}

Tensor normalize(const Tensor& image, const std::vector<float>& mean,
                 const std::vector<float>& stddev, DType dtype, float scale) {
  check_image(image, "normalize");
  const int64_t c = image.dim(2);
  const auto fits = [&](const std::vector<float>& v) {
    return v.size() == 1 || static_cast<int64_t>(v.size()) == c;
  };
  TANDEM_CHECK(fits(mean) && fits(stddev), "normalize: ", mean.size(), " means and ", stddev.size(),
               " standard deviations for ", c, " channels (give 1 or ", c, ")");
  TANDEM_CHECK(dtype == DType::kFloat32 || dtype == DType::kBFloat16,
               "normalize: the output is float32 or bfloat16, got ", dtype);
  TANDEM_CHECK(scale > 0.0f, "normalize: scale must be positive, got ", scale);
  for (const float s : stddev)
    TANDEM_CHECK(s > 0.0f, "normalize: a standard deviation must be positive, got ", s);
  const Pixels in(image);
  Tensor out = Tensor::empty(image.shape(), dtype);
  const int64_t n = image.numel();
  for (int64_t i = 0; i < n; ++i) {
    const auto k = static_cast<size_t>(i % c);
    const float m = mean.size() == 1 ? mean[0] : mean[k];
    const float s = stddev.size() == 1 ? stddev[0] : stddev[k];
    const float value = (in[i] / scale - m) / s;
    if (dtype == DType::kFloat32)
      out.data<float>()[i] = value;
    else
      out.data<bfloat16>()[i] = bfloat16(value);  // rounded to nearest even
  }
  return out;
}

// ---- image_dataset_from_directory -----------------------------------------------------------

namespace {

bool image_file(const fs::path& path) {
  std::string ext = path.extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(),
                 [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
  // Keras's formats: its file list (and so its split) includes BMP and GIF files, which
  // decode_image refuses by name.
  return ext == ".jpg" || ext == ".jpeg" || ext == ".png" || ext == ".bmp" || ext == ".gif";
}

/// numpy's RandomState(seed).shuffle of n items, as the permutation it applies: Fisher-Yates
/// from the end, each index drawn by masked rejection from MT19937 seeded as numpy seeds an
/// integer (init_genrand).
std::vector<size_t> numpy_shuffle(size_t n, uint64_t seed) {
  TANDEM_CHECK(seed <= 0xffffffffu, "image_dataset_from_directory: seed ", seed,
               " must be below 2^32 (numpy's RandomState, as Keras)");
  std::mt19937 rng(static_cast<uint32_t>(seed));
  std::vector<size_t> order(n);
  for (size_t i = 0; i < n; ++i) order[i] = i;
  for (size_t i = n; i-- > 1;) {
    uint32_t mask = static_cast<uint32_t>(i);
    for (int shift = 1; shift <= 16; shift <<= 1) mask |= mask >> shift;
    uint32_t j;
    do {
      j = static_cast<uint32_t>(rng()) & mask;
    } while (j > i);
    std::swap(order[i], order[j]);
  }
  return order;
}

class ImageFilesSource final : public detail::Source {
 public:
  ImageFilesSource(std::vector<std::string> paths, std::vector<int64_t> labels,
                   const ImageDirectoryOptions& options)
      : paths_(std::move(paths)), labels_(std::move(labels)), options_(options) {}
  int64_t size() const override { return static_cast<int64_t>(paths_.size()); }
  bool cheap_random_access() const override { return true; }
  std::vector<TensorSpec> element_spec() const override {
    return {{Shape{options_.height, options_.width, options_.channels}, DType::kFloat32},
            {Shape{}, DType::kInt64}};
  }
  std::string describe() const override {
    std::ostringstream out;
    out << "image_dataset_from_directory(" << paths_.size() << " files, " << options_.height << "x"
        << options_.width << "x" << options_.channels << ")";
    return out.str();
  }
  std::vector<std::string> files() const override { return paths_; }
  // AutoShardPolicy::kFile: each worker the images dealt to it, with their labels.
  std::shared_ptr<const detail::Source> with_files(std::vector<std::string> files) const override {
    std::vector<std::string> paths;
    std::vector<int64_t> labels;
    size_t next = 0;
    for (size_t i = 0; i < paths_.size() && next < files.size(); ++i) {
      if (paths_[i] != files[next]) continue;
      paths.push_back(paths_[i]);
      labels.push_back(labels_[i]);
      ++next;
    }
    TANDEM_CHECK(next == files.size(), "image_dataset_from_directory: '", files[next],
                 "' is not one of its files");
    return std::make_shared<ImageFilesSource>(std::move(paths), std::move(labels), options_);
  }

  class Reader final : public detail::SourceReader {
   public:
    explicit Reader(const ImageFilesSource& source) : source_(source) {}
    void read(int64_t index, Element& out) override {
      TANDEM_CHECK(index >= 0 && index < source_.size(), "image_dataset_from_directory: index ",
                   index, " out of range");
      const std::string& path = source_.paths_[static_cast<size_t>(index)];
      std::ifstream in(path, std::ios::binary);
      TANDEM_CHECK(in.good(), "image_dataset_from_directory: cannot open '", path, "'");
      const std::string bytes((std::istreambuf_iterator<char>(in)),
                              std::istreambuf_iterator<char>());
      Tensor image;
      try {
        image = decode_image(bytes, source_.options_.channels);
      } catch (const NotBuiltError&) {
        throw;
      } catch (const Error& e) {
        TANDEM_THROW("image_dataset_from_directory: '", path, "': ", e.what());
      }
      out = {resize_bilinear(image, source_.options_.height, source_.options_.width),
             Tensor::scalar(static_cast<double>(source_.labels_[static_cast<size_t>(index)]),
                            DType::kInt64)};
    }

   private:
    const ImageFilesSource& source_;
  };
  std::unique_ptr<detail::SourceReader> reader() const override {
    return std::make_unique<Reader>(*this);
  }

 private:
  std::vector<std::string> paths_;
  std::vector<int64_t> labels_;
  ImageDirectoryOptions options_;
};

}  // namespace

std::vector<std::string> image_directory_classes(const std::string& directory) {
  std::error_code ec;
  TANDEM_CHECK(fs::is_directory(directory, ec), "image_dataset_from_directory: '", directory,
               "' is not a directory");
  std::vector<std::string> classes;
  for (const auto& entry : fs::directory_iterator(directory, ec))
    if (entry.is_directory() && entry.path().filename().string().rfind('.', 0) != 0)
      classes.push_back(entry.path().filename().string());
  std::sort(classes.begin(), classes.end());
  return classes;
}

Dataset image_dataset_from_directory(const std::string& directory,
                                     const ImageDirectoryOptions& options) {
  TANDEM_CHECK(options.height > 0 && options.width > 0,
               "image_dataset_from_directory: ", "image size ", options.height, "x", options.width,
               " must be positive");
  TANDEM_CHECK(options.channels == 1 || options.channels == 3 || options.channels == 4,
               "image_dataset_from_directory: channels must be 1, 3 or 4, got ", options.channels);
  TANDEM_CHECK(options.validation_split >= 0.0 && options.validation_split < 1.0,
               "image_dataset_from_directory: validation_split must lie in [0, 1), got ",
               options.validation_split);
  TANDEM_CHECK(options.validation_split == 0.0 || options.subset == "training" ||
                   options.subset == "validation",
               "image_dataset_from_directory: with a validation_split, subset must be ",
               "\"training\" or \"validation\", got \"", options.subset, "\"");
  const std::vector<std::string> classes =
      options.class_names.empty() ? image_directory_classes(directory) : options.class_names;
  TANDEM_CHECK(!classes.empty(), "image_dataset_from_directory: '", directory,
               "' has no class sub-folders");
  // Keras's order: classes in order; in each, folders by path, files by name.
  std::vector<std::string> paths;
  std::vector<int64_t> labels;
  for (size_t label = 0; label < classes.size(); ++label) {
    const fs::path root = fs::path(directory) / classes[label];
    std::error_code ec;
    TANDEM_CHECK(fs::is_directory(root, ec), "image_dataset_from_directory: class folder '",
                 root.string(), "' does not exist");
    std::vector<std::pair<std::string, std::string>> found;  // (folder, file name)
    for (auto it = fs::recursive_directory_iterator(root, ec);
         it != fs::recursive_directory_iterator(); it.increment(ec)) {
      if (ec) break;
      if (it->is_regular_file() && image_file(it->path()))
        found.emplace_back(it->path().parent_path().string(), it->path().filename().string());
    }
    std::sort(found.begin(), found.end());
    for (const auto& [folder, name] : found) {
      paths.push_back((fs::path(folder) / name).string());
      labels.push_back(static_cast<int64_t>(label));
    }
  }
  TANDEM_CHECK(!paths.empty(), "image_dataset_from_directory: no image files under '", directory,
               "'");
  if (options.shuffle) {
    const std::vector<size_t> order = numpy_shuffle(paths.size(), options.seed);
    std::vector<std::string> p(paths.size());
    std::vector<int64_t> l(paths.size());
    for (size_t i = 0; i < order.size(); ++i) {
      p[i] = paths[order[i]];
      l[i] = labels[order[i]];
    }
    paths = std::move(p);
    labels = std::move(l);
  }
  if (options.validation_split > 0.0) {
    const auto held =
        static_cast<size_t>(options.validation_split * static_cast<double>(paths.size()));
    const size_t first = options.subset == "training" ? 0 : paths.size() - held;
    const size_t last = options.subset == "training" ? paths.size() - held : paths.size();
    paths = std::vector<std::string>(paths.begin() + static_cast<std::ptrdiff_t>(first),
                                     paths.begin() + static_cast<std::ptrdiff_t>(last));
    labels = std::vector<int64_t>(labels.begin() + static_cast<std::ptrdiff_t>(first),
                                  labels.begin() + static_cast<std::ptrdiff_t>(last));
    TANDEM_CHECK(!paths.empty(), "image_dataset_from_directory: the ", options.subset,
                 " subset of ", held, " held-out files is empty");
  }
  return Dataset(detail::make_source_node(
      std::make_shared<ImageFilesSource>(std::move(paths), std::move(labels), options),
      "image_directory"));
}

}  // namespace tandem::data
