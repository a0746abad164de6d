// The protocol buffer wire format, by hand (internal): ProtoWriter builds a message field by
// field (TensorBoard events, tf.train.Example); ProtoReader walks one, checking every length
// against the bytes left, so damaged or hostile input raises instead of reading past its end.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace tandem::io::detail {

/// Wire types of a field's key.
enum class WireType : int { kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kFixed32 = 5 };

/// A protocol buffer message under construction (proto3 wire format).
class ProtoWriter {
 public:
  ProtoWriter& varint(int field, uint64_t value);
  ProtoWriter& fixed64_double(int field, double value);
  ProtoWriter& fixed32_float(int field, float value);
  ProtoWriter& bytes(int field, std::string_view value);  ///< strings, nested messages
  ProtoWriter& packed_doubles(int field, const std::vector<double>& values);
  ProtoWriter& packed_floats(int field, const std::vector<float>& values);
  ProtoWriter& packed_varints(int field, const std::vector<int64_t>& values);
  const std::string& data() const { return data_; }

 private:
  void key(int field, WireType wire_type);
  std::string data_;
};

/// Appends `value` as a base-128 varint.
void append_varint(std::string& out, uint64_t value);

/// One field read by ProtoReader: its number and wire type, and its value (varint and fixed
/// values in `number`, length-delimited ones as a view into the message).
struct ProtoField {
  int field = 0;
  WireType wire_type = WireType::kVarint;
  uint64_t number = 0;
  std::string_view bytes;
  size_t offset = 0;  ///< of the field's key, from the start of the outermost message
};

/// Walks the fields of one message. Errors raise tandem::Error as "<what>: <problem> at byte
/// <offset>", offsets counted from the outermost message (`base` for a nested one).
class ProtoReader {
 public:
  ProtoReader(std::string_view message, std::string what, size_t base = 0)
      : data_(message), what_(std::move(what)), base_(base) {}
  /// Reads the next field; false at the end of the message.
  bool next(ProtoField& field);
  /// Reads a varint from `data` starting at `pos` (advanced past it).
  uint64_t varint(std::string_view data, size_t& pos, size_t base) const;
  /// Raises "<what>: <problem> at byte <offset>".
  [[noreturn]] void fail(const std::string& problem, size_t offset) const;
  const std::string& what() const { return what_; }

 private:
  std::string_view data_;
  std::string what_;
  size_t base_;
  size_t pos_ = 0;
};

}  // namespace tandem::io::detail
