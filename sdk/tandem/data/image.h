// Images for input pipelines: JPEG and PNG decoding (libjpeg-turbo, libpng), resizing as
// tf.image.resize does, crops and flips (random ones drawn from a seed, so a map stays
// deterministic), per-channel normalization; and image_dataset_from_directory, Keras's folder
// layout (one sub-folder per class).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tandem/data/dataset.h"

namespace tandem::data {

/// Decodes a JPEG into uint8 [height, width, channels]. channels 0 keeps the file's (1 or 3);
/// 1 or 3 converts. Corrupt or truncated data raises with libjpeg's message (a warning of
/// libjpeg, such as a premature end of the data, is an error here, as in tf.io.decode_jpeg).
Tensor decode_jpeg(std::string_view bytes, int channels = 0);
/// Decodes a PNG (any bit depth; 16-bit samples reduced to 8) into uint8 [height, width,
/// channels]. channels 0 keeps the file's (1 gray, 2 gray + alpha, 3 RGB, 4 RGBA; a palette
/// gives 3 or 4); 1, 3 or 4 converts. Corrupt data raises with libpng's message.
Tensor decode_png(std::string_view bytes, int channels = 0);
/// Encodes a uint8 [height, width, channels] image (channels 1 to 4: gray, gray + alpha, RGB,
/// RGBA) as a PNG (tf.io.encode_png); decode_png gives the same pixels back.
std::string encode_png(const Tensor& image);
/// decode_jpeg or decode_png, by the data's first bytes; anything else raises.
Tensor decode_image(std::string_view bytes, int channels = 0);
/// The same for bytes in a uint8 vector (a TFRecord record's bytes feature).
Tensor decode_image(const Tensor& bytes, int channels = 0);

/// tf.image.resize(image, [height, width], method="bilinear", antialias=False): half-pixel
/// centers, float32 [height, width, channels] from a uint8 or float32 [h, w, channels] image.
Tensor resize_bilinear(const Tensor& image, int64_t height, int64_t width);
/// tf.image.flip_left_right: the columns reversed.
Tensor flip_left_right(const Tensor& image);
/// Rows [top, top + height), columns [left, left + width) of an [h, w, c] image.
Tensor crop(const Tensor& image, int64_t top, int64_t left, int64_t height, int64_t width);
/// A crop of [height, width] at a position drawn from `seed` (the same seed, the same crop).
Tensor random_crop(const Tensor& image, int64_t height, int64_t width, uint64_t seed);
/// flip_left_right with probability 1/2, drawn from `seed`.
Tensor random_flip_left_right(const Tensor& image, uint64_t seed);
/// (image / scale - mean[c]) / stddev[c] per channel, as float32 or bfloat16 (one mean and
/// stddev, or one per channel). scale 255 maps uint8 pixels to [0, 1] first.
Tensor normalize(const Tensor& image, const std::vector<float>& mean,
                 const std::vector<float>& stddev, DType dtype = DType::kFloat32,
                 float scale = 255.0f);

/// Options of image_dataset_from_directory (keras.utils.image_dataset_from_directory).
struct ImageDirectoryOptions {
  /// Every image is resized to this [height, width] (bilinear, as Keras).
  int64_t height = 256;
  /// See height.
  int64_t width = 256;
  /// 1 (grayscale), 3 (rgb) or 4 (rgba).
  int channels = 3;
  /// Shuffles the file list with `seed` (numpy's RandomState(seed).shuffle, as Keras does, so
  /// the split is Keras's).
  bool shuffle = true;
  /// The shuffle's and split's seed.
  uint64_t seed = 0;
  /// The fraction held out for validation (0: none).
  double validation_split = 0.0;
  /// "training" or "validation" when validation_split > 0.
  std::string subset = {};
  /// Class names in label order; empty: the sub-folders, sorted (Keras's order).
  std::vector<std::string> class_names = {};
};

/// Images in `directory/CLASS/...` (jpg, jpeg, png; sub-folders of a class included) as
/// elements {float32 [height, width, channels] in [0, 255], int64 label}, labels numbered in
/// class order, files in Keras's order and split. Unbatched: add .shuffle/.batch as needed.
/// Decoding runs when an element is read (use map(fn, num_parallel_calls) after it, or batch
/// it: a batch reads its images in the order given). A file that cannot be decoded raises
/// naming it.
Dataset image_dataset_from_directory(const std::string& directory,
                                     const ImageDirectoryOptions& options = {});
/// The class names image_dataset_from_directory would use for `directory` (sorted).
std::vector<std::string> image_directory_classes(const std::string& directory);

}  // namespace tandem::data
