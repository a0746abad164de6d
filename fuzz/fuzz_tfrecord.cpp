// fuzz_tfrecord: io::TFRecordReader and data::tfrecord on a fuzzed TFRecord file, every record
// then parsed as a tf.train.Example. Input: one byte of options (bits 0-1: compression 0 none,
// 1 GZIP, 2 ZLIB; bit 2: skip_damaged), then the file. Seeds: fuzz/corpus/fuzz_tfrecord (the
// TensorFlow-written fixtures of tests/fixtures/tfrecord).
#include <cstdint>

#include "fuzz_support.h"

namespace data = tandem::data;

TANDEM_FUZZ_QUIET_INITIALIZE()

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* input, size_t size) {
  if (size < 1) return 0;
  const int compression = input[0] & 3;
  if (compression == 3) return 0;
  const tandem::io::TFRecordReadOptions options{
      .compression = static_cast<tandem::io::Compression>(compression),
      .skip_damaged = (input[0] & 4) != 0};
  const std::string path = tandem::fuzzing::scratch().file("records.tfrecord");
  tandem::fuzzing::write_file(path, input + 1, size - 1);
  const data::FeatureSpec spec = {
      {"image", data::FixedLenFeature{{}, tandem::DType::kUInt8}},
      {"label", data::FixedLenFeature{{}, tandem::DType::kInt64, std::vector<double>{0}}},
      {"values", data::VarLenFeature{tandem::DType::kFloat32, 4}},
      {"tokens", data::VarLenFeature{tandem::DType::kInt32}}};
  tandem::fuzzing::run_expecting_errors([&] {
    tandem::io::TFRecordReader reader(path, options);
    std::string record;
    for (int n = 0; n < 256 && reader.next(record); ++n)
      tandem::fuzzing::run_expecting_errors([&] { (void)data::parse_example(record, spec); });
  });
  tandem::fuzzing::run_expecting_errors([&] {
    const data::Dataset dataset = data::tfrecord({path}, options);
    (void)dataset.describe();
    data::Iterator it = dataset.take(64).iterator();
    data::Element element;
    while (it.next(element))
      tandem::fuzzing::run_expecting_errors([&] {
        (void)data::Example::parse(std::string_view(static_cast<const char*>(element[0].raw_data()),
                                                    static_cast<size_t>(element[0].numel())));
      });
  });
  return 0;
}
