// TensorBoard's file format, written by hand (summary_writer.h): records framed as TFRecord
// (length, masked CRC-32C of the length, data, masked CRC-32C of the data) holding
// tensorflow.Event protocol buffers. Only the fields Tandem writes are encoded; the field
// numbers are those of tensorflow/core/util/event.proto and summary.proto.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace tandem::summary::detail {

/// CRC-32C (Castagnoli) of `data`, and TFRecord's masked form of a CRC.
uint32_t crc32c(std::string_view data);
uint32_t masked_crc32c(std::string_view data);

/// `payload` framed as one TFRecord.
std::string tfrecord(std::string_view payload);

/// A protocol buffer message under construction (proto3 wire format).
class ProtoWriter {
 public:
  ProtoWriter& varint(int field, uint64_t value);
  ProtoWriter& fixed64_double(int field, double value);
  ProtoWriter& fixed32_float(int field, float value);
  ProtoWriter& bytes(int field, std::string_view value);  ///< strings, nested messages
  ProtoWriter& packed_doubles(int field, const std::vector<double>& values);
  const std::string& data() const { return data_; }

 private:
  void key(int field, int wire_type);
  void raw_varint(uint64_t value);
  std::string data_;
};

/// tensorflow.HistogramProto's fields.
struct Histogram {
  double min = 0, max = 0, num = 0, sum = 0, sum_squares = 0;
  /// Bucket i counts the values from bucket_limit[i-1] (min for the first) up to, not
  /// including, bucket_limit[i] (the last includes max).
  std::vector<double> bucket_limit, bucket;
};

/// Encoded tensorflow.Event messages.
std::string file_version_event(double wall_time);
std::string scalar_event(double wall_time, int64_t step, const std::string& tag, float value);
std::string histogram_event(double wall_time, int64_t step, const std::string& tag,
                            const Histogram& histogram);
/// A string tensor of the "text" plugin (TensorBoard's Text dashboard).
std::string text_event(double wall_time, int64_t step, const std::string& tag,
                       const std::string& text);

}  // namespace tandem::summary::detail
