// fuzz_image: data::decode_image (JPEG or PNG by the first bytes) on fuzzed data, at each
// channel count it takes, then resize_bilinear and flip_left_right of what decodes. Input: the
// encoded image. Seeds: fuzz/corpus/fuzz_image (the TensorFlow-written images of
// tests/fixtures/images).
#include <cstdint>

#include "fuzz_support.h"

namespace data = tandem::data;

TANDEM_FUZZ_QUIET_INITIALIZE()

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* input, size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(input), size);
  for (const int channels : {0, 1, 3}) {
    tandem::fuzzing::run_expecting_errors([&] {
      const tandem::Tensor image = data::decode_image(bytes, channels);
      (void)data::resize_bilinear(image, 5, 7);
      (void)data::flip_left_right(image);
    });
  }
  return 0;
}
