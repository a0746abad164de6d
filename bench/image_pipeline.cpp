// Examples per second of an image input pipeline over TFRecord files of tf.train.Examples
// {image: PNG or JPEG bytes, label: int64}: parse, decode, augment (random 24x24 crop resized
// back to 28x28, random flip, per-channel normalization), batch, prefetch. The same pipeline in
// tf.data is bench/peers/tf_image_pipeline.py; bench/image_pipeline.sh runs both side by side.
//
//   bench_image_pipeline --files 'DIR/*.tfrecord' [--epochs 3] [--batch 256] [--threads N]
//
// Prints one line per epoch ("epoch E: S s, N examples, X examples/s, mean pixel M") and the
// median.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "tandem/tandem.h"
#include "timing.h"

namespace {

namespace td = tandem;
namespace data = tandem::data;

struct Args {
  std::string files;
  int epochs = 3;
  int64_t batch = 256;
  int64_t threads = data::kAutotune;
};

Args parse_args(int argc, char** argv) {
  Args args;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--files") {
      args.files = value;
    } else if (flag == "--epochs") {
      args.epochs = std::atoi(value.c_str());
    } else if (flag == "--batch") {
      args.batch = std::atoll(value.c_str());
    } else if (flag == "--threads") {
      args.threads = std::atoll(value.c_str());
    } else {
      std::fprintf(stderr, "bench_image_pipeline: unknown flag '%s'\n", flag.c_str());
      std::exit(2);
    }
  }
  if (args.files.empty() || args.epochs < 1 || args.batch < 1) {
    std::fprintf(stderr,
                 "usage: bench_image_pipeline --files 'DIR/*.tfrecord' [--epochs N] "
                 "[--batch B] [--threads T]\n");
    std::exit(2);
  }
  return args;
}

/// A per-example seed from its bytes (FNV-1a): the augmentation is the same on every run.
uint64_t seed_of(const td::Tensor& bytes) {
  uint64_t hash = 1469598103934665603ull;
  const auto* p = bytes.data<uint8_t>();
  for (int64_t i = 0; i < bytes.numel(); ++i) hash = (hash ^ p[i]) * 1099511628211ull;
  return hash;
}

data::Dataset pipeline(const Args& args) {
  const data::FeatureSpec spec = {{"image", data::FixedLenFeature{{}, td::DType::kUInt8}},
                                  {"label", data::FixedLenFeature{{}, td::DType::kInt64}}};
  auto augment = [spec](data::Element record) {
    data::Element example = data::parse_example(record[0], spec);
    const uint64_t seed = seed_of(example[0]);
    td::Tensor image = data::decode_image(example[0], /*channels=*/1);
    image = data::random_crop(image, 24, 24, seed);
    image = data::resize_bilinear(image, 28, 28);
    image = data::random_flip_left_right(image, seed + 1);
    image = data::normalize(image, {0.2860f * 255.0f}, {0.3530f * 255.0f}, td::DType::kFloat32,
                            /*scale=*/1.0f);
    return data::Element{image, example[1]};
  };
  return data::tfrecord(data::list_files(args.files))
      .map(augment, args.threads)
      .batch(args.batch)
      .prefetch(2);
}

}  // namespace

int main(int argc, char** argv) {
  const Args args = parse_args(argc, argv);
  const data::Dataset ds = pipeline(args);
  std::printf("tandem: %s\n", ds.describe().c_str());
  std::vector<double> rates;
  for (int epoch = 0; epoch < args.epochs; ++epoch) {
    const double start = td::bench::now_seconds();
    int64_t examples = 0;
    double pixel_sum = 0;  // a check that both pipelines computed the same kind of images
    for (const data::Element& batch : ds) {
      examples += batch[0].dim(0);
      const float* pixels = batch[0].data<float>();
      for (int64_t i = 0; i < batch[0].numel(); ++i) pixel_sum += pixels[i];
    }
    const double seconds = td::bench::now_seconds() - start;
    rates.push_back(static_cast<double>(examples) / seconds);
    std::printf("epoch %d: %.3f s, %lld examples, %.0f examples/s, mean pixel %.4f\n", epoch,
                seconds, static_cast<long long>(examples), rates.back(),
                pixel_sum / (static_cast<double>(examples) * 28 * 28));
    std::fflush(stdout);
  }
  std::sort(rates.begin(), rates.end());
  std::printf("median examples/s: %.0f\n", rates[rates.size() / 2]);
  return 0;
}
