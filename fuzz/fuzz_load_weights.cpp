// fuzz_load_weights: tandem::load_weights (Keras's model.load_weights) of a fuzzed Keras weights
// file into a model with a nested Sequential, in every layout Keras writes, then one forward
// pass. Seeds: fuzz/corpus/fuzz_load_weights (Keras 3 and tf-keras files of that model, and
// the crafted ones of tests/checkpoint/fixtures/crafted/keras_*); dictionary: fuzz/hdf5.dict.
#include <cstdint>

#include "fuzz_support.h"

namespace fz = tandem::fuzzing;
namespace td = tandem;

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  fz::quiet_logging();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = fz::scratch().file("weights.h5");
  fz::write_file(path, data, size);
  // The model of tests/checkpoint/fixtures/keras_nested: Dense(16), Sequential(Dense(12),
  // Dense(6)), Dense(4) on 8 features.
  td::nn::Sequential inner({td::nn::Dense(12, td::nn::Activation::kRelu), td::nn::Dense(6)});
  td::nn::Sequential model({td::nn::Dense(16, td::nn::Activation::kRelu), inner, td::nn::Dense(4)});
  model.build({8});
  fz::run_expecting_errors([&] {
    td::load_weights(model, path);
    (void)model(td::Tensor::ones({2, 8})).to_vector<float>();
  });
  return 0;
}
