// JPEG and PNG decoding (image.h) with libjpeg-turbo and libpng; compiled only when CMake found
// both (TANDEM_WITH_IMAGES; no_image_codecs.cpp otherwise). libjpeg reports errors by longjmp:
// everything the jump passes over is plain C data, and what outlives it is on the heap.
// jpeglib.h needs size_t and FILE declared before it.
#include <cstddef>
#include <cstdio>
// (a block of its own: the order matters)
#include <jpeglib.h>
#include <png.h>

#include <algorithm>
#include <csetjmp>
#include <cstring>
#include <memory>

#include "tandem/core/error.h"
#include "tandem/data/image.h"

namespace tandem::data {

namespace {

/// Decoded images larger than this raise, from their header's size, before the decoder
/// allocates (a damaged header cannot ask for gigabytes; a progressive JPEG's coefficients take
/// twice the decoded bytes).
constexpr uint64_t kMaxImageBytes = uint64_t{1} << 27;

void check_size(const char* what, uint64_t height, uint64_t width, uint64_t channels) {
  TANDEM_CHECK(height > 0 && width > 0, what, ": the image is ", height, "x", width);
  TANDEM_CHECK(height * width * channels <= kMaxImageBytes, what, ": a ", height, "x", width, "x",
               channels, " image is larger than ", kMaxImageBytes, " bytes decoded");
}

struct JpegErrors {
  jpeg_error_mgr manager;
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
};

[[noreturn]] void jpeg_fail(j_common_ptr cinfo) {
  auto* errors = reinterpret_cast<JpegErrors*>(cinfo->err);
  (*cinfo->err->format_message)(cinfo, errors->message);
  std::longjmp(errors->jump, 1);
}

// Warnings (level -1: corrupt or truncated data that libjpeg would patch over) are errors.
void jpeg_message(j_common_ptr cinfo, int level) {
  if (level < 0) jpeg_fail(cinfo);
}

/// What the decoder fills; on the heap, so the longjmp leaves it intact.
struct JpegJob {
  jpeg_decompress_struct cinfo;
  JpegErrors errors;
  Tensor out;
  bool created = false;
};

/// The decoding, between setjmp and the jumps: returns false after a jump.
bool run_jpeg(JpegJob& job, const unsigned char* data, unsigned long size, int channels) {
  if (setjmp(job.errors.jump) != 0) return false;
  jpeg_create_decompress(&job.cinfo);
  job.created = true;
  jpeg_mem_src(&job.cinfo, data, size);
  jpeg_read_header(&job.cinfo, TRUE);
  if (uint64_t{job.cinfo.image_width} * job.cinfo.image_height *
          static_cast<uint64_t>(std::max(job.cinfo.num_components, 3)) >
      kMaxImageBytes) {
    std::snprintf(job.errors.message, sizeof job.errors.message,
                  "a %ux%u image of %d components is larger than %llu bytes decoded",
                  job.cinfo.image_width, job.cinfo.image_height, job.cinfo.num_components,
                  static_cast<unsigned long long>(kMaxImageBytes));
    return false;
  }
  const int stored = job.cinfo.num_components == 1 ? 1 : 3;
  const int want = channels == 0 ? stored : channels;
  job.cinfo.out_color_space = want == 1 ? JCS_GRAYSCALE : JCS_RGB;
  // TensorFlow's default (decode_jpeg's dct_method ""), so the pixels are its pixels.
  job.cinfo.dct_method = JDCT_IFAST;
  jpeg_start_decompress(&job.cinfo);
  const uint64_t height = job.cinfo.output_height, width = job.cinfo.output_width;
  if (height == 0 || width == 0 || height * width * static_cast<uint64_t>(want) > kMaxImageBytes ||
      job.cinfo.output_components != want) {
    std::snprintf(job.errors.message, sizeof job.errors.message,
                  "a %llux%llux%d image is empty or larger than %llu bytes decoded",
                  static_cast<unsigned long long>(height), static_cast<unsigned long long>(width),
                  job.cinfo.output_components, static_cast<unsigned long long>(kMaxImageBytes));
    return false;
  }
  job.out = Tensor::empty(Shape{static_cast<int64_t>(height), static_cast<int64_t>(width), want},
                          DType::kUInt8);
  auto* pixels = static_cast<unsigned char*>(job.out.raw_data());
  const size_t row = static_cast<size_t>(width) * static_cast<size_t>(want);
  while (job.cinfo.output_scanline < job.cinfo.output_height) {
    JSAMPROW rows[1] = {pixels + row * job.cinfo.output_scanline};
    jpeg_read_scanlines(&job.cinfo, rows, 1);
  }
  jpeg_finish_decompress(&job.cinfo);
  return true;
}

}  // namespace

Tensor decode_jpeg(std::string_view bytes, int channels) {
  TANDEM_CHECK(channels == 0 || channels == 1 || channels == 3,
               "decode_jpeg: channels must be 0, 1 or 3, got ", channels);
  TANDEM_CHECK(!bytes.empty(), "decode_jpeg: no data");
  auto job = std::make_unique<JpegJob>();
  job->cinfo.err = jpeg_std_error(&job->errors.manager);
  job->errors.manager.error_exit = jpeg_fail;
  job->errors.manager.emit_message = jpeg_message;
  job->errors.message[0] = '\0';
  const bool ok = run_jpeg(*job, reinterpret_cast<const unsigned char*>(bytes.data()),
                           static_cast<unsigned long>(bytes.size()), channels);
  if (job->created) jpeg_destroy_decompress(&job->cinfo);
  TANDEM_CHECK(ok, "decode_jpeg: invalid JPEG data (", bytes.size(),
               " bytes): ", job->errors.message);
  return std::move(job->out);
}

Tensor decode_png(std::string_view bytes, int channels) {
  TANDEM_CHECK(channels >= 0 && channels <= 4 && channels != 2,
               "decode_png: channels must be 0, 1, 3 or 4, got ", channels);
  TANDEM_CHECK(!bytes.empty(), "decode_png: no data");
  png_image image;
  std::memset(&image, 0, sizeof image);
  image.version = PNG_IMAGE_VERSION;
  // Frees what libpng holds on every path out.
  const auto release = [](png_image* i) { png_image_free(i); };
  const std::unique_ptr<png_image, decltype(release)> guard(&image, release);
  TANDEM_CHECK(png_image_begin_read_from_memory(&image, bytes.data(), bytes.size()) != 0,
               "decode_png: invalid PNG data (", bytes.size(), " bytes): ", image.message);
  const bool color = (image.format & PNG_FORMAT_FLAG_COLOR) != 0;
  const bool alpha = (image.format & PNG_FORMAT_FLAG_ALPHA) != 0;
  const int stored = (color ? 3 : 1) + (alpha ? 1 : 0);
  const int want = channels == 0 ? stored : channels;
  // Read as stored (libpng's own conversions would compose alpha onto a background); the
  // channels are then converted as TensorFlow's decode_png does.
  image.format = stored == 1   ? PNG_FORMAT_GRAY
                 : stored == 2 ? PNG_FORMAT_GA
                 : stored == 3 ? PNG_FORMAT_RGB
                               : PNG_FORMAT_RGBA;
  check_size("decode_png", image.height, image.width, 4);
  const auto h = static_cast<int64_t>(image.height), w = static_cast<int64_t>(image.width);
  Tensor raw = Tensor::empty(Shape{h, w, stored}, DType::kUInt8);
  TANDEM_CHECK(png_image_finish_read(&image, nullptr, raw.raw_data(), 0, nullptr) != 0,
               "decode_png: invalid PNG data (", bytes.size(), " bytes): ", image.message);
  if (want == stored) return raw;
  Tensor out = Tensor::empty(Shape{h, w, want}, DType::kUInt8);
  const uint8_t* in = raw.data<uint8_t>();
  uint8_t* o = out.data<uint8_t>();
  for (int64_t p = 0; p < h * w; ++p, in += stored, o += want) {
    uint8_t gray = in[0];
    if (color && want < 3 && (in[0] != in[1] || in[0] != in[2])) {
      // libpng's png_set_rgb_to_gray with TensorFlow's weights (0.299, 0.587), in 1/32768.
      gray = static_cast<uint8_t>((9797u * in[0] + 19234u * in[1] + 3737u * in[2]) >> 15);
    }
    const uint8_t a = alpha ? in[stored - 1] : 255;
    if (want == 1) {
      o[0] = gray;
    } else {
      for (int k = 0; k < 3; ++k) o[k] = color ? in[k] : gray;
      if (want == 4) o[3] = a;
    }
  }
  return out;
}

std::string encode_png(const Tensor& image) {
  TANDEM_CHECK(image.defined() && image.dtype() == DType::kUInt8 && image.rank() == 3 &&
                   image.dim(2) >= 1 && image.dim(2) <= 4 && image.dim(0) >= 1 && image.dim(1) >= 1,
               "encode_png: expected a uint8 [height, width, 1 to 4 channels] image, got ",
               image.defined() ? image.to_string(0) : std::string("an undefined tensor"));
  check_size("encode_png", static_cast<uint64_t>(image.dim(0)), static_cast<uint64_t>(image.dim(1)),
             static_cast<int>(image.dim(2)));
  const Tensor host = image.to(Device::cpu());
  png_image png;
  std::memset(&png, 0, sizeof png);
  png.version = PNG_IMAGE_VERSION;
  png.width = static_cast<png_uint_32>(image.dim(1));
  png.height = static_cast<png_uint_32>(image.dim(0));
  const int64_t channels = image.dim(2);
  png.format = channels == 1   ? PNG_FORMAT_GRAY
               : channels == 2 ? PNG_FORMAT_GA
               : channels == 3 ? PNG_FORMAT_RGB
                               : PNG_FORMAT_RGBA;
  const auto release = [](png_image* i) { png_image_free(i); };
  const std::unique_ptr<png_image, decltype(release)> guard(&png, release);
  png_alloc_size_t size = 0;  // first the size, then the bytes
  TANDEM_CHECK(png_image_write_to_memory(&png, nullptr, &size, 0, host.raw_data(), 0, nullptr) != 0,
               "encode_png: ", png.message);
  std::string out(size, '\0');
  TANDEM_CHECK(
      png_image_write_to_memory(&png, out.data(), &size, 0, host.raw_data(), 0, nullptr) != 0,
      "encode_png: ", png.message);
  out.resize(size);
  return out;
}

}  // namespace tandem::data
