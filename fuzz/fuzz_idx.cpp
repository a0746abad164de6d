// fuzz_idx: data::idx(images, labels) on fuzzed IDX files (plain or gzip), then reads every
// element. Input: a little-endian uint32 n, then n bytes of the image file, then the label file
// (n is cut to what the input holds). Seeds: fuzz/corpus/fuzz_idx (Fashion-MNIST, cut short).
#include <algorithm>
#include <cstdint>
#include <cstring>

#include "fuzz_support.h"

namespace fz = tandem::fuzzing;

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  fz::quiet_logging();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 4) return 0;
  uint32_t images_size = 0;
  std::memcpy(&images_size, data, 4);  // the harness runs on little-endian machines
  images_size = static_cast<uint32_t>(std::min<size_t>(images_size, size - 4));
  const std::string images = fz::scratch().file("images-idx3-ubyte");
  const std::string labels = fz::scratch().file("labels-idx1-ubyte");
  fz::write_file(images, data + 4, images_size);
  fz::write_file(labels, data + 4 + images_size, size - 4 - images_size);
  fz::run_expecting_errors([&] {
    const tandem::data::Dataset dataset = tandem::data::idx(images, labels);
    (void)dataset.cardinality();
    (void)dataset.element_spec();
    (void)dataset.describe();
    // Single elements, then batches (the gather path), at most 64 of each.
    tandem::data::Iterator single = dataset.take(64).iterator();
    tandem::data::Element element;
    while (single.next(element)) {
    }
    tandem::data::Iterator batched = dataset.batch(3).take(64).iterator();
    while (batched.next(element)) {
    }
  });
  return 0;
}
