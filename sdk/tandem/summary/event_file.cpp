// TensorBoard's file format (internal/event_file.h).
#include "tandem/summary/internal/event_file.h"

#include <array>
#include <cstring>

namespace tandem::summary::detail {

namespace {

std::array<uint32_t, 256> crc32c_table() {
  std::array<uint32_t, 256> table{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t crc = i;
    for (int bit = 0; bit < 8; ++bit) crc = (crc >> 1) ^ ((crc & 1) ? 0x82F63B78u : 0u);
    table[i] = crc;
  }
  return table;
}

void append_le(std::string& out, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xff));
}

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

uint32_t crc32c(std::string_view data) {
  static const std::array<uint32_t, 256> table = crc32c_table();
  uint32_t crc = 0xFFFFFFFFu;
  for (const char c : data) crc = table[(crc ^ static_cast<uint8_t>(c)) & 0xff] ^ (crc >> 8);
  return crc ^ 0xFFFFFFFFu;
}

uint32_t masked_crc32c(std::string_view data) {
  const uint32_t crc = crc32c(data);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

std::string tfrecord(std::string_view payload) {
  std::string out, length;
  append_le(length, payload.size(), 8);
  out += length;
  append_le(out, masked_crc32c(length), 4);
  out.append(payload);
  append_le(out, masked_crc32c(payload), 4);
  return out;
}

void ProtoWriter::raw_varint(uint64_t value) {
  while (value >= 0x80) {
    data_.push_back(static_cast<char>((value & 0x7f) | 0x80));
    value >>= 7;
  }
  data_.push_back(static_cast<char>(value));
}

void ProtoWriter::key(int field, int wire_type) {
  raw_varint((static_cast<uint64_t>(field) << 3) | static_cast<uint64_t>(wire_type));
}

ProtoWriter& ProtoWriter::varint(int field, uint64_t value) {
  key(field, 0);
  raw_varint(value);
  return *this;
}

ProtoWriter& ProtoWriter::fixed64_double(int field, double value) {
  key(field, 1);
  uint64_t bits = 0;
  std::memcpy(&bits, &value, sizeof(bits));
  append_le(data_, bits, 8);
  return *this;
}

ProtoWriter& ProtoWriter::fixed32_float(int field, float value) {
  key(field, 5);
  uint32_t bits = 0;
  std::memcpy(&bits, &value, sizeof(bits));
  append_le(data_, bits, 4);
  return *this;
}

ProtoWriter& ProtoWriter::bytes(int field, std::string_view value) {
  key(field, 2);
  raw_varint(value.size());
  data_.append(value);
  return *this;
}

ProtoWriter& ProtoWriter::packed_doubles(int field, const std::vector<double>& values) {
  std::string packed;
  for (const double v : values) {
    uint64_t bits = 0;
    std::memcpy(&bits, &v, sizeof(bits));
    append_le(packed, bits, 8);
  }
  return bytes(field, packed);
}

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
