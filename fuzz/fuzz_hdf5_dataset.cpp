// fuzz_hdf5_dataset: data::hdf5({file}, {"x", "y"}, chunk_rows=3) on a fuzzed HDF5 file, then
// reads every element (in chunks of 3 rows, several hyperslab reads per file). Seeds:
// fuzz/corpus/fuzz_hdf5_dataset (files Tandem's HDF5 writer made); dictionary: fuzz/hdf5.dict.
#include <cstdint>

#include "fuzz_support.h"

namespace fz = tandem::fuzzing;

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  fz::quiet_logging();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = fz::scratch().file("examples.h5");
  fz::write_file(path, data, size);
  fz::run_expecting_errors([&] {
    const tandem::data::Dataset dataset =
        tandem::data::hdf5({path}, {"x", "y"}, /*chunk_rows=*/3);
    (void)dataset.cardinality();
    (void)dataset.element_spec();
    (void)dataset.describe();
    tandem::data::Iterator single = dataset.take(256).iterator();
    tandem::data::Element element;
    while (single.next(element)) {
    }
    tandem::data::Iterator batched = dataset.batch(2).take(64).iterator();
    while (batched.next(element)) {
    }
  });
  return 0;
}
