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

/// `payload` framed as one TFRecord.
std::string tfrecord(std::string_view payload);

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
