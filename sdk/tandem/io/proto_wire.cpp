// The protocol buffer wire format (internal/proto_wire.h).
#include "tandem/io/internal/proto_wire.h"

#include <cstring>

#include "tandem/core/error.h"

namespace tandem::io::detail {

namespace {

void append_le(std::string& out, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xff));
}

}  // namespace

void append_varint(std::string& out, uint64_t value) {
  while (value >= 0x80) {
    out.push_back(static_cast<char>((value & 0x7f) | 0x80));
    value >>= 7;
  }
  out.push_back(static_cast<char>(value));
}

void ProtoWriter::key(int field, WireType wire_type) {
  append_varint(data_, (static_cast<uint64_t>(field) << 3) | static_cast<uint64_t>(wire_type));
}

ProtoWriter& ProtoWriter::varint(int field, uint64_t value) {
  key(field, WireType::kVarint);
  append_varint(data_, value);
  return *this;
}

ProtoWriter& ProtoWriter::fixed64_double(int field, double value) {
  key(field, WireType::kFixed64);
  uint64_t bits = 0;
  std::memcpy(&bits, &value, sizeof(bits));
  append_le(data_, bits, 8);
  return *this;
}

ProtoWriter& ProtoWriter::fixed32_float(int field, float value) {
  key(field, WireType::kFixed32);
  uint32_t bits = 0;
  std::memcpy(&bits, &value, sizeof(bits));
  append_le(data_, bits, 4);
  return *this;
}

ProtoWriter& ProtoWriter::bytes(int field, std::string_view value) {
  key(field, WireType::kLengthDelimited);
  append_varint(data_, value.size());
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

ProtoWriter& ProtoWriter::packed_floats(int field, const std::vector<float>& values) {
  std::string packed;
  for (const float v : values) {
    uint32_t bits = 0;
    std::memcpy(&bits, &v, sizeof(bits));
    append_le(packed, bits, 4);
  }
  return bytes(field, packed);
}

ProtoWriter& ProtoWriter::packed_varints(int field, const std::vector<int64_t>& values) {
  std::string packed;
  for (const int64_t v : values) append_varint(packed, static_cast<uint64_t>(v));
  return bytes(field, packed);
}

void ProtoReader::fail(const std::string& problem, size_t offset) const {
  TANDEM_THROW(what_, ": ", problem, " at byte ", offset);
}

uint64_t ProtoReader::varint(std::string_view data, size_t& pos, size_t base) const {
  uint64_t value = 0;
  const size_t start = pos;
  for (int shift = 0; shift < 64; shift += 7) {
    if (pos >= data.size()) fail("truncated varint", base + start);
    const auto byte = static_cast<uint8_t>(data[pos++]);
    value |= static_cast<uint64_t>(byte & 0x7f) << shift;
    if ((byte & 0x80) == 0) return value;
  }
  fail("varint longer than 10 bytes", base + start);
}

bool ProtoReader::next(ProtoField& field) {
  if (pos_ >= data_.size()) return false;
  field.offset = base_ + pos_;
  const uint64_t key = varint(data_, pos_, base_);
  const uint64_t number = key >> 3;
  if (number == 0 || number > (uint64_t{1} << 29) - 1)
    fail("invalid field number " + std::to_string(number), field.offset);
  field.field = static_cast<int>(number);
  const auto type = static_cast<int>(key & 7);
  auto take = [&](size_t n) {
    if (n > data_.size() - pos_)
      fail("field " + std::to_string(number) + " runs past the end of its message (" +
               std::to_string(n) + " bytes, " + std::to_string(data_.size() - pos_) + " left)",
           field.offset);
    const std::string_view out = data_.substr(pos_, n);
    pos_ += n;
    return out;
  };
  auto little_endian = [](std::string_view b) {
    uint64_t v = 0;
    for (size_t i = b.size(); i-- > 0;) v = (v << 8) | static_cast<uint8_t>(b[i]);
    return v;
  };
  switch (type) {
    case 0:
      field.wire_type = WireType::kVarint;
      field.number = varint(data_, pos_, base_);
      return true;
    case 1:
      field.wire_type = WireType::kFixed64;
      field.number = little_endian(take(8));
      return true;
    case 2: {
      field.wire_type = WireType::kLengthDelimited;
      const uint64_t length = varint(data_, pos_, base_);
      if (length > data_.size() - pos_)
        fail("field " + std::to_string(number) + " declares " + std::to_string(length) +
                 " bytes, " + std::to_string(data_.size() - pos_) + " left in its message",
             field.offset);
      field.bytes = take(static_cast<size_t>(length));
      return true;
    }
    case 5:
      field.wire_type = WireType::kFixed32;
      field.number = little_endian(take(4));
      return true;
    default:
      fail("unsupported wire type " + std::to_string(type) + " of field " + std::to_string(number),
           field.offset);
  }
}

}  // namespace tandem::io::detail
