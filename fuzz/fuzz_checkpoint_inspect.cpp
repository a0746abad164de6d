// fuzz_checkpoint_inspect: inspect_checkpoint (what `tandem-ckpt inspect FILE` prints) on a
// fuzzed checkpoint file. Seeds: fuzz/corpus/fuzz_checkpoint_inspect; dictionary: fuzz/hdf5.dict.
#include <cstdint>

#include "fuzz_support.h"
#include "tandem/checkpoint/inspect.h"

namespace fz = tandem::fuzzing;

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  fz::quiet_logging();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = fz::scratch().file("ckpt-1.h5");
  fz::write_file(path, data, size);
  fz::run_expecting_errors([&] { (void)tandem::inspect_checkpoint(path); });
  return 0;
}
