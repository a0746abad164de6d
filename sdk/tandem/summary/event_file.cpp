// TensorBoard's file format (internal/event_file.h).
#include "tandem/summary/internal/event_file.h"

#include "tandem/io/internal/proto_wire.h"
#include "tandem/io/tfrecord.h"

namespace tandem::summary::detail {

namespace {

using io::detail::ProtoWriter;

// event.proto: Event { double wall_time = 1; int64 step = 2; string file_version = 3;
// Summary summary = 5; }. summary.proto: Summary { repeated Value value = 1; } and
// Summary.Value { string tag = 1; float simple_value = 2; HistogramProto histo = 5;
// TensorProto tensor = 8; SummaryMetadata metadata = 9; }.
std::string event(double wall_time, int64_t step, const std::string& value) {
  ProtoWriter summary;
  summary.bytes(1, value);
  ProtoWriter e;
  e.fixed64_double(1, wall_time).varint(2, static_cast<uint64_t>(step)).bytes(5, summary.data());
  return e.data();
}

}  // namespace

std::string tfrecord(std::string_view payload) { return io::tfrecord_frame(payload); }

std::string file_version_event(double wall_time) {
  ProtoWriter e;
  e.fixed64_double(1, wall_time).bytes(3, "brain.Event:2");
  return e.data();
}

std::string scalar_event(double wall_time, int64_t step, const std::string& tag, float value) {
  ProtoWriter v;
  v.bytes(1, tag).fixed32_float(2, value);
  return event(wall_time, step, v.data());
}

std::string histogram_event(double wall_time, int64_t step, const std::string& tag,
                            const Histogram& h) {
  // HistogramProto { double min = 1; max = 2; num = 3; sum = 4; sum_squares = 5;
  // repeated double bucket_limit = 6 [packed]; repeated double bucket = 7 [packed]; }
  ProtoWriter histo;
  histo.fixed64_double(1, h.min)
      .fixed64_double(2, h.max)
      .fixed64_double(3, h.num)
      .fixed64_double(4, h.sum)
      .fixed64_double(5, h.sum_squares)
      .packed_doubles(6, h.bucket_limit)
      .packed_doubles(7, h.bucket);
  ProtoWriter v;
  v.bytes(1, tag).bytes(5, histo.data());
  return event(wall_time, step, v.data());
}

std::string text_event(double wall_time, int64_t step, const std::string& tag,
                       const std::string& text) {
  // SummaryMetadata { PluginData plugin_data = 1; } with PluginData { string plugin_name = 1; };
  // TensorProto { DataType dtype = 1 (DT_STRING = 7); TensorShapeProto tensor_shape = 2 (a
  // scalar: empty); repeated bytes string_val = 8; }.
  ProtoWriter plugin;
  plugin.bytes(1, "text");
  ProtoWriter metadata;
  metadata.bytes(1, plugin.data());
  ProtoWriter tensor;
  tensor.varint(1, 7).bytes(2, "").bytes(8, text);
  ProtoWriter v;
  v.bytes(1, tag).bytes(8, tensor.data()).bytes(9, metadata.data());
  return event(wall_time, step, v.data());
}

}  // namespace tandem::summary::detail
