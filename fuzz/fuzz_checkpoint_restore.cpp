// fuzz_checkpoint_restore: Checkpoint::restore of a fuzzed ckpt-N.h5 into a small MLP, its Adam
// optimizer, a distributed dataset's position, two metrics and a counter (fuzz_support.h's
// TrainingState, like samples/fashion_mnist_mlp); after a restore that succeeds, one training
// step runs from the restored state. Seeds: fuzz/corpus/fuzz_checkpoint_restore.
#include <cstdint>

#include "fuzz_support.h"

namespace fz = tandem::fuzzing;

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  fz::quiet_logging();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = fz::scratch().file("ckpt-1.h5");
  fz::write_file(path, data, size);
  // A fresh state per input, so that an input's outcome does not depend on the ones before.
  fz::TrainingState state;
  fz::run_expecting_errors([&] {
    state.checkpoint().restore(path);
    state.train(/*steps=*/1);
  });
  return 0;
}
