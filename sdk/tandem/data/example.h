// tf.train.Example records: building and serializing them (for TFRecordWriter), and parsing
// them into tensors with a feature spec as tf.io.parse_single_example takes one. The protocol
// buffer wire format is decoded by hand (docs/datasets.md says why).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "tandem/data/dataset.h"

namespace tandem::data {

/// One tf.train.Feature: a list of byte strings, floats or int64s.
struct Feature {
  /// Which list the feature holds.
  enum class Kind { kBytes, kFloat, kInt64 };
  /// The list's kind.
  Kind kind = Kind::kFloat;
  /// The values of a kBytes feature.
  std::vector<std::string> bytes;
  /// The values of a kFloat feature.
  std::vector<float> floats;
  /// The values of a kInt64 feature.
  std::vector<int64_t> int64s;
  friend bool operator==(const Feature&, const Feature&) = default;
};

/// A tf.train.Example: named features.
class Example {
 public:
  /// Sets feature `name` to a bytes list.
  Example& set_bytes(const std::string& name, std::vector<std::string> values);
  /// Sets feature `name` to a float list.
  Example& set_floats(const std::string& name, std::vector<float> values);
  /// Sets feature `name` to an int64 list.
  Example& set_int64s(const std::string& name, std::vector<int64_t> values);
  /// The features by name.
  const std::map<std::string, Feature>& features() const { return features_; }
  /// The serialized tf.train.Example (features in name order; packed float and int64 lists,
  /// as TensorFlow writes them).
  std::string serialize() const;
  /// Decodes a serialized tf.train.Example; raises on malformed bytes, naming what is wrong
  /// and its byte offset in the record.
  static Example parse(std::string_view serialized);

 private:
  std::map<std::string, Feature> features_;
};

/// tf.io.FixedLenFeature: shape.numel() values in every example, as a tensor of `shape`.
/// dtype kFloat32 reads a float list, kInt64 (or kInt32, checked to fit) an int64 list, kUInt8
/// a bytes list of exactly one value (shape must be {}), as a uint8 tensor [length].
struct FixedLenFeature {
  /// The tensor's shape ({} for one value).
  Shape shape;
  /// kFloat32, kInt64, kInt32 or kUInt8 (bytes).
  DType dtype = DType::kFloat32;
  /// Used when an example lacks the feature (shape.numel() values, or one repeated); without
  /// it, a missing feature raises.
  std::optional<std::vector<double>> default_value = std::nullopt;
};

/// tf.io.VarLenFeature: any number of values, as a 1-D tensor [count] (ragged across examples),
/// or padded with `pad_value` (and truncated) to [padded_length] when that is set. dtype kUInt8
/// reads a bytes list: its values concatenated.
struct VarLenFeature {
  /// kFloat32, kInt64, kInt32 or kUInt8 (bytes).
  DType dtype = DType::kFloat32;
  /// When set, the tensor is [padded_length]: values past it are dropped, missing ones padded.
  std::optional<int64_t> padded_length = std::nullopt;
  /// The padding value.
  double pad_value = 0.0;
};

/// A feature spec: the element's components, in this order.
using FeatureSpec =
    std::vector<std::pair<std::string, std::variant<FixedLenFeature, VarLenFeature>>>;

/// Parses one serialized tf.train.Example into one tensor per spec entry (in the spec's
/// order). A missing feature without a default, a list of the wrong kind or length, or
/// malformed bytes raise naming the feature (and the byte offset).
Element parse_example(std::string_view serialized, const FeatureSpec& spec);
/// The same for a record held in a uint8 tensor (as data::tfrecord yields them).
Element parse_example(const Tensor& serialized, const FeatureSpec& spec);

}  // namespace tandem::data
