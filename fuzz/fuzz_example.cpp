// fuzz_example: one fuzzed serialized tf.train.Example, decoded whole (data::Example::parse),
// parsed with a feature spec of every kind (data::parse_example) and, when it decodes,
// re-serialized and decoded again to the same features (the same bytes once more). Seeds:
// fuzz/corpus/fuzz_example (the records of the TensorFlow-written fixture
// tests/fixtures/tfrecord/examples.tfrecord).
#include <cstdint>
#include <cstdlib>

#include "fuzz_support.h"

namespace data = tandem::data;

TANDEM_FUZZ_QUIET_INITIALIZE()

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* input, size_t size) {
  const std::string_view record(reinterpret_cast<const char*>(input), size);
  const data::FeatureSpec spec = {
      {"image", data::FixedLenFeature{{}, tandem::DType::kUInt8}},
      {"label", data::FixedLenFeature{{}, tandem::DType::kInt64, std::vector<double>{-1}}},
      {"values", data::FixedLenFeature{{3}, tandem::DType::kFloat32, std::vector<double>{0}}},
      {"tokens", data::VarLenFeature{tandem::DType::kInt64}},
      {"names", data::VarLenFeature{tandem::DType::kUInt8, 16}},
      {"weights", data::VarLenFeature{tandem::DType::kFloat32, 2, -1.0}},
      {"small", data::VarLenFeature{tandem::DType::kInt32}}};
  tandem::fuzzing::run_expecting_errors([&] { (void)data::parse_example(record, spec); });
  tandem::fuzzing::run_expecting_errors([&] {
    const data::Example example = data::Example::parse(record);
    // What decodes, re-encodes to bytes that decode to the same features: compared as bytes
    // (a float feature may hold NaN).
    const std::string encoded = example.serialize();
    if (data::Example::parse(encoded).serialize() != encoded) std::abort();
  });
  return 0;
}
