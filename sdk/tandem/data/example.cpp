// tf.train.Example (example.h), on the wire format of tensorflow/core/example/example.proto and
// feature.proto: Example { Features features = 1; }, Features { map<string, Feature> feature =
// 1; } (entries: key = 1, value = 2), Feature { oneof kind { BytesList bytes_list = 1;
// FloatList float_list = 2; Int64List int64_list = 3; } }, BytesList { repeated bytes value =
// 1; }, FloatList { repeated float value = 1 [packed]; }, Int64List { repeated int64 value = 1
// [packed]; }. Readers accept packed and unpacked lists alike, as protobuf parsers must.
#include "tandem/data/example.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <type_traits>

#include "tandem/core/error.h"
#include "tandem/io/internal/proto_wire.h"

namespace tandem::data {

namespace {

using io::detail::ProtoField;
using io::detail::ProtoReader;
using io::detail::ProtoWriter;
using io::detail::WireType;

/// One feature as it lies in the record: its kind and the list message's bytes.
struct RawFeature {
  Feature::Kind kind = Feature::Kind::kFloat;
  std::string_view list;  // the BytesList / FloatList / Int64List message
  size_t offset = 0;      // of `list` in the record
  bool present = false;
};

const char* kind_name(Feature::Kind kind) {
  switch (kind) {
    case Feature::Kind::kBytes:
      return "bytes_list";
    case Feature::Kind::kFloat:
      return "float_list";
    case Feature::Kind::kInt64:
      return "int64_list";
  }
  return "?";
}

/// Calls fn(name, raw) for every feature of a serialized Example, in the record's order.
template <typename Fn>
void for_each_feature(std::string_view serialized, const Fn& fn) {
  const std::string what = "tf.train.Example";
  ProtoReader example(serialized, what);
  ProtoField field;
  while (example.next(field)) {
    if (field.field != 1) continue;  // unknown fields are skipped, as protobuf does
    if (field.wire_type != WireType::kLengthDelimited)
      example.fail("Example.features is not a message", field.offset);
    const size_t features_at = static_cast<size_t>(field.bytes.data() - serialized.data());
    ProtoReader features(field.bytes, what, features_at);
    ProtoField entry;
    while (features.next(entry)) {
      if (entry.field != 1) continue;
      if (entry.wire_type != WireType::kLengthDelimited)
        features.fail("Features.feature entry is not a message", entry.offset);
      const size_t entry_at = static_cast<size_t>(entry.bytes.data() - serialized.data());
      ProtoReader map_entry(entry.bytes, what, entry_at);
      std::string_view name;
      RawFeature raw;
      ProtoField kv;
      while (map_entry.next(kv)) {
        if (kv.wire_type != WireType::kLengthDelimited) continue;
        if (kv.field == 1) {
          name = kv.bytes;
        } else if (kv.field == 2) {
          const size_t feature_at = static_cast<size_t>(kv.bytes.data() - serialized.data());
          ProtoReader feature(kv.bytes, what, feature_at);
          ProtoField list;
          raw = RawFeature{};
          raw.present = true;  // an empty Feature: no kind (read as an empty list)
          raw.kind = Feature::Kind::kFloat;
          raw.offset = feature_at;
          while (feature.next(list)) {
            if (list.field < 1 || list.field > 3) continue;
            if (list.wire_type != WireType::kLengthDelimited)
              feature.fail("Feature's list is not a message", list.offset);
            raw.kind = list.field == 1   ? Feature::Kind::kBytes
                       : list.field == 2 ? Feature::Kind::kFloat
                                         : Feature::Kind::kInt64;
            raw.list = list.bytes;
            raw.offset = static_cast<size_t>(list.bytes.data() - serialized.data());
          }
        }
      }
      fn(name, raw);
    }
  }
}

/// The values of a list message, decoded by kind into `add` calls: add(float) for floats,
/// add(int64_t) for int64s, add(std::string_view) for bytes.
template <typename Add>
void decode_list(std::string_view serialized, const RawFeature& raw, const std::string& name,
                 const Add& add) {
  const std::string what = "tf.train.Example feature '" + name + "'";
  ProtoReader list(raw.list, what, raw.offset);
  ProtoField value;
  while (list.next(value)) {
    if (value.field != 1) continue;
    const size_t at = value.offset;
    if (raw.kind == Feature::Kind::kBytes) {
      if (value.wire_type != WireType::kLengthDelimited)
        list.fail("a bytes_list value is not length-delimited", at);
      add(value.bytes);
    } else if (raw.kind == Feature::Kind::kFloat) {
      if (value.wire_type == WireType::kFixed32) {
        float f;
        const auto bits = static_cast<uint32_t>(value.number);
        std::memcpy(&f, &bits, 4);
        add(f);
      } else if (value.wire_type == WireType::kLengthDelimited) {
        if (value.bytes.size() % 4 != 0)
          list.fail("a packed float_list of " + std::to_string(value.bytes.size()) +
                        " bytes (not a multiple of 4)",
                    at);
        for (size_t i = 0; i < value.bytes.size(); i += 4) {
          uint32_t bits = 0;
          for (int b = 3; b >= 0; --b)
            bits = (bits << 8) | static_cast<uint8_t>(value.bytes[i + static_cast<size_t>(b)]);
          float f;
          std::memcpy(&f, &bits, 4);
          add(f);
        }
      } else {
        list.fail("a float_list value of the wrong wire type", at);
      }
    } else {
      if (value.wire_type == WireType::kVarint) {
        add(static_cast<int64_t>(value.number));
      } else if (value.wire_type == WireType::kLengthDelimited) {
        const size_t base = static_cast<size_t>(value.bytes.data() - serialized.data());
        size_t pos = 0;
        while (pos < value.bytes.size())
          add(static_cast<int64_t>(list.varint(value.bytes, pos, base)));
      } else {
        list.fail("an int64_list value of the wrong wire type", at);
      }
    }
  }
}

std::string label(const std::string& name) { return "parse_example: feature '" + name + "'"; }

bool reads_kind(DType dtype, Feature::Kind kind) {
  switch (dtype) {
    case DType::kFloat32:
      return kind == Feature::Kind::kFloat;
    case DType::kInt64:
    case DType::kInt32:
      return kind == Feature::Kind::kInt64;
    case DType::kUInt8:
      return kind == Feature::Kind::kBytes;
    default:
      return false;
  }
}

Feature::Kind kind_for(DType dtype, const std::string& name) {
  TANDEM_CHECK(dtype == DType::kFloat32 || dtype == DType::kInt64 || dtype == DType::kInt32 ||
                   dtype == DType::kUInt8,
               label(name), ": dtype ", dtype,
               " cannot be parsed (float32, int64, int32, or uint8 for bytes)");
  return dtype == DType::kFloat32 ? Feature::Kind::kFloat
         : dtype == DType::kUInt8 ? Feature::Kind::kBytes
                                  : Feature::Kind::kInt64;
}

/// A feature's values gathered as doubles/int64s or bytes, then written into a tensor.
struct Values {
  std::vector<float> floats;
  std::vector<int64_t> ints;
  std::string bytes;  // bytes values concatenated
  int64_t bytes_count = 0;
  int64_t count(Feature::Kind kind) const {
    return kind == Feature::Kind::kFloat   ? static_cast<int64_t>(floats.size())
           : kind == Feature::Kind::kInt64 ? static_cast<int64_t>(ints.size())
                                           : bytes_count;
  }
};

Values gather(std::string_view serialized, const RawFeature& raw, const std::string& name) {
  Values v;
  decode_list(serialized, raw, name, [&](auto value) {
    using T = decltype(value);
    if constexpr (std::is_same_v<T, float>) {
      v.floats.push_back(value);
    } else if constexpr (std::is_same_v<T, int64_t>) {
      v.ints.push_back(value);
    } else {
      v.bytes.append(value);
      ++v.bytes_count;
    }
  });
  return v;
}

/// `n` values into a new tensor of `shape`, padding with `pad` past the values held.
Tensor fill(const Values& v, Feature::Kind kind, DType dtype, const Shape& shape, double pad,
            const std::string& name) {
  if (dtype == DType::kUInt8) {
    Tensor t = Tensor::empty(shape, DType::kUInt8);
    const size_t n = std::min(v.bytes.size(), static_cast<size_t>(shape.numel()));
    if (n > 0) std::memcpy(t.raw_data(), v.bytes.data(), n);
    if (static_cast<int64_t>(n) < shape.numel())
      std::memset(static_cast<uint8_t*>(t.raw_data()) + n, static_cast<int>(pad),
                  static_cast<size_t>(shape.numel()) - n);
    return t;
  }
  Tensor t = Tensor::empty(shape, dtype);
  const int64_t n = std::min(v.count(kind), shape.numel());
  if (dtype == DType::kFloat32) {
    auto* out = t.data<float>();
    for (int64_t i = 0; i < shape.numel(); ++i)
      out[i] = i < n ? v.floats[static_cast<size_t>(i)] : static_cast<float>(pad);
  } else if (dtype == DType::kInt64) {
    auto* out = t.data<int64_t>();
    for (int64_t i = 0; i < shape.numel(); ++i)
      out[i] = i < n ? v.ints[static_cast<size_t>(i)] : static_cast<int64_t>(pad);
  } else {
    auto* out = t.data<int32_t>();
    for (int64_t i = 0; i < shape.numel(); ++i) {
      const int64_t x = i < n ? v.ints[static_cast<size_t>(i)] : static_cast<int64_t>(pad);
      TANDEM_CHECK(
          x >= std::numeric_limits<int32_t>::min() && x <= std::numeric_limits<int32_t>::max(),
          label(name), ": value ", x, " (index ", i, ") does not fit int32");
      out[i] = static_cast<int32_t>(x);
    }
  }
  return t;
}

Tensor parse_fixed(std::string_view serialized, const RawFeature* raw, const std::string& name,
                   const FixedLenFeature& f) {
  const Feature::Kind kind = kind_for(f.dtype, name);
  TANDEM_CHECK(f.dtype != DType::kUInt8 || f.shape.rank() == 0, label(name),
               ": a FixedLenFeature of bytes holds one value (shape {}), not shape ", f.shape);
  if (raw == nullptr) {
    TANDEM_CHECK(f.default_value.has_value(), label(name),
                 " is missing from the example and has no default_value");
    const std::vector<double>& d = *f.default_value;
    TANDEM_CHECK(f.dtype != DType::kUInt8, label(name),
                 ": a default for a bytes feature is not supported");
    TANDEM_CHECK(static_cast<int64_t>(d.size()) == f.shape.numel() || d.size() == 1, label(name),
                 ": default_value holds ", d.size(), " values, shape ", f.shape, " needs ",
                 f.shape.numel());
    Values v;
    for (int64_t i = 0; i < f.shape.numel(); ++i) {
      const double x = d.size() == 1 ? d[0] : d[static_cast<size_t>(i)];
      v.floats.push_back(static_cast<float>(x));
      v.ints.push_back(static_cast<int64_t>(x));
    }
    return fill(v, kind, f.dtype, f.shape, 0.0, name);
  }
  const bool empty = raw->list.empty();
  TANDEM_CHECK(empty || reads_kind(f.dtype, raw->kind), label(name), " holds a ",
               kind_name(raw->kind), ", not the ", kind_name(kind), " that dtype ", f.dtype,
               " reads");
  const Values v = gather(serialized, *raw, name);
  if (f.dtype == DType::kUInt8) {
    TANDEM_CHECK(v.bytes_count == 1, label(name), " holds ", v.bytes_count,
                 " bytes values; a FixedLenFeature of bytes needs exactly 1");
    return fill(v, kind, f.dtype, Shape{static_cast<int64_t>(v.bytes.size())}, 0.0, name);
  }
  TANDEM_CHECK(v.count(kind) == f.shape.numel(), label(name), " holds ", v.count(kind),
               " values; its FixedLenFeature of shape ", f.shape, " needs ", f.shape.numel());
  return fill(v, kind, f.dtype, f.shape, 0.0, name);
}

Tensor parse_var(std::string_view serialized, const RawFeature* raw, const std::string& name,
                 const VarLenFeature& f) {
  const Feature::Kind kind = kind_for(f.dtype, name);
  TANDEM_CHECK(!f.padded_length || *f.padded_length >= 0, label(name), ": padded_length ",
               f.padded_length.value_or(0), " is negative");
  Values v;
  if (raw != nullptr) {
    TANDEM_CHECK(raw->list.empty() || reads_kind(f.dtype, raw->kind), label(name), " holds a ",
                 kind_name(raw->kind), ", not the ", kind_name(kind), " that dtype ", f.dtype,
                 " reads");
    v = gather(serialized, *raw, name);
  }
  const int64_t held =
      f.dtype == DType::kUInt8 ? static_cast<int64_t>(v.bytes.size()) : v.count(kind);
  const int64_t length = f.padded_length.value_or(held);
  return fill(v, kind, f.dtype, Shape{length}, f.pad_value, name);
}

}  // namespace

Example& Example::set_bytes(const std::string& name, std::vector<std::string> values) {
  Feature& f = features_[name] = Feature{};
  f.kind = Feature::Kind::kBytes;
  f.bytes = std::move(values);
  return *this;
}

Example& Example::set_floats(const std::string& name, std::vector<float> values) {
  Feature& f = features_[name] = Feature{};
  f.kind = Feature::Kind::kFloat;
  f.floats = std::move(values);
  return *this;
}

Example& Example::set_int64s(const std::string& name, std::vector<int64_t> values) {
  Feature& f = features_[name] = Feature{};
  f.kind = Feature::Kind::kInt64;
  f.int64s = std::move(values);
  return *this;
}

std::string Example::serialize() const {
  ProtoWriter features;
  for (const auto& [name, f] : features_) {
    ProtoWriter list;
    if (f.kind == Feature::Kind::kBytes) {
      for (const std::string& b : f.bytes) list.bytes(1, b);
    } else if (f.kind == Feature::Kind::kFloat) {
      if (!f.floats.empty()) list.packed_floats(1, f.floats);
    } else if (!f.int64s.empty()) {
      list.packed_varints(1, f.int64s);
    }
    ProtoWriter feature;
    feature.bytes(f.kind == Feature::Kind::kBytes   ? 1
                  : f.kind == Feature::Kind::kFloat ? 2
                                                    : 3,
                  list.data());
    ProtoWriter entry;
    entry.bytes(1, name).bytes(2, feature.data());
    features.bytes(1, entry.data());
  }
  ProtoWriter example;
  example.bytes(1, features.data());
  return example.data();
}

Example Example::parse(std::string_view serialized) {
  Example out;
  for_each_feature(serialized, [&](std::string_view name, const RawFeature& raw) {
    const std::string key(name);
    const Values v = gather(serialized, raw, key);
    Feature& f = out.features_[key] = Feature{};
    f.kind = raw.kind;
    f.floats = v.floats;
    f.int64s = v.ints;
    if (raw.kind == Feature::Kind::kBytes)
      decode_list(serialized, raw, key, [&](auto value) {
        if constexpr (std::is_same_v<decltype(value), std::string_view>)
          f.bytes.emplace_back(value);
      });
  });
  return out;
}

Element parse_example(std::string_view serialized, const FeatureSpec& spec) {
  // The last entry of a name wins, as for protobuf maps.
  std::vector<RawFeature> found(spec.size());
  for_each_feature(serialized, [&](std::string_view name, const RawFeature& raw) {
    for (size_t k = 0; k < spec.size(); ++k)
      if (spec[k].first == name) found[k] = raw;
  });
  Element out;
  out.reserve(spec.size());
  for (size_t k = 0; k < spec.size(); ++k) {
    const RawFeature* raw = found[k].present ? &found[k] : nullptr;
    const std::string& name = spec[k].first;
    out.push_back(std::visit(
        [&](const auto& f) -> Tensor {
          if constexpr (std::is_same_v<std::decay_t<decltype(f)>, FixedLenFeature>)
            return parse_fixed(serialized, raw, name, f);
          else
            return parse_var(serialized, raw, name, f);
        },
        spec[k].second));
  }
  return out;
}

Element parse_example(const Tensor& serialized, const FeatureSpec& spec) {
  TANDEM_CHECK(serialized.dtype() == DType::kUInt8 && serialized.rank() <= 1,
               "parse_example: a serialized record is a uint8 vector, got ", serialized.dtype(),
               " ", serialized.shape());
  const Tensor host = serialized.to(Device::cpu());
  return parse_example(std::string_view(static_cast<const char*>(host.raw_data()),
                                        static_cast<size_t>(host.numel())),
                       spec);
}

}  // namespace tandem::data
