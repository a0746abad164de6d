// A strict JSON reader (internal to Tandem): TF_CONFIG, and tests that check what the SDK writes
// (Chrome traces). Values as a tree; anything that is not JSON (trailing commas, bare words,
// unterminated strings, text after the value) throws std::runtime_error naming the offset, and
// so does nesting deeper than JsonReader::kMaxDepth (a recursive reader must not let the text
// decide how deep its stack goes).
#pragma once

#include <cctype>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace tandem::detail {

struct Json {
  enum class Kind { kNull, kBool, kNumber, kString, kArray, kObject } kind = Kind::kNull;
  bool boolean = false;
  double number = 0;
  std::string string;
  std::vector<Json> array;
  std::map<std::string, Json> object;

  bool has(const std::string& key) const { return object.count(key) > 0; }
  const Json& operator[](const std::string& key) const {
    auto it = object.find(key);
    if (it == object.end()) throw std::runtime_error("json: no key \"" + key + "\"");
    return it->second;
  }
};

/// A value back as compact JSON text (numbers with 17 significant digits), for messages that
/// show what a value was.
inline std::string to_text(const Json& value) {
  switch (value.kind) {
    case Json::Kind::kNull:
      return "null";
    case Json::Kind::kBool:
      return value.boolean ? "true" : "false";
    case Json::Kind::kNumber: {
      char text[32];
      std::snprintf(text, sizeof(text), "%.17g", value.number);
      // The shortest form that reads back the same (0.001, not 0.0010000000000000000208).
      for (int digits = 1; digits <= 17; ++digits) {
        char shorter[32];
        std::snprintf(shorter, sizeof(shorter), "%.*g", digits, value.number);
        if (std::strtod(shorter, nullptr) == value.number) return shorter;
      }
      return text;
    }
    case Json::Kind::kString:
      return "\"" + value.string + "\"";
    case Json::Kind::kArray: {
      std::string out = "[";
      for (size_t i = 0; i < value.array.size(); ++i)
        out += (i ? ", " : "") + to_text(value.array[i]);
      return out + "]";
    }
    case Json::Kind::kObject: {
      std::string out = "{";
      bool first = true;
      for (const auto& [key, item] : value.object) {
        out += (first ? "\"" : ", \"") + key + "\": " + to_text(item);
        first = false;
      }
      return out + "}";
    }
  }
  return "?";
}

class JsonReader {
 public:
  /// Objects and arrays nested deeper than this are refused.
  static constexpr int kMaxDepth = 64;

  static Json parse(std::string_view text) {
    JsonReader reader(text);
    Json value = reader.value();
    reader.space();
    if (reader.at_ != text.size()) reader.fail("text after the value");
    return value;
  }

 private:
  explicit JsonReader(std::string_view text) : text_(text) {}

  [[noreturn]] void fail(const std::string& what) const {
    throw std::runtime_error("json: " + what + " at offset " + std::to_string(at_));
  }
  void space() {
    while (at_ < text_.size() && std::isspace(static_cast<unsigned char>(text_[at_]))) ++at_;
  }
  char peek() {
    space();
    if (at_ >= text_.size()) fail("unexpected end");
    return text_[at_];
  }
  void expect(char c) {
    if (peek() != c) fail(std::string("expected '") + c + "'");
    ++at_;
  }
  void word(std::string_view w) {
    if (text_.substr(at_, w.size()) != w) fail("bad literal");
    at_ += w.size();
  }

  /// Four hex digits of a \\u escape.
  uint32_t hex4() {
    if (at_ + 4 > text_.size()) fail("short \\u escape");
    uint32_t value = 0;
    for (int i = 0; i < 4; ++i) {
      const char c = text_[at_++];
      value <<= 4;
      if (c >= '0' && c <= '9') {
        value |= static_cast<uint32_t>(c - '0');
      } else if (c >= 'a' && c <= 'f') {
        value |= static_cast<uint32_t>(c - 'a' + 10);
      } else if (c >= 'A' && c <= 'F') {
        value |= static_cast<uint32_t>(c - 'A' + 10);
      } else {
        fail("bad \\u escape (four hex digits expected)");
      }
    }
    return value;
  }

  static void append_utf8(std::string& out, uint32_t code) {
    if (code < 0x80) {
      out += static_cast<char>(code);
    } else if (code < 0x800) {
      out += static_cast<char>(0xC0 | (code >> 6));
      out += static_cast<char>(0x80 | (code & 0x3F));
    } else if (code < 0x10000) {
      out += static_cast<char>(0xE0 | (code >> 12));
      out += static_cast<char>(0x80 | ((code >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (code & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | (code >> 18));
      out += static_cast<char>(0x80 | ((code >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((code >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (code & 0x3F));
    }
  }

  std::string string() {
    expect('"');
    std::string out;
    while (true) {
      if (at_ >= text_.size()) fail("unterminated string");
      const char c = text_[at_++];
      if (c == '"') return out;
      if (static_cast<unsigned char>(c) < 0x20) fail("control character in a string");
      if (c != '\\') {
        out += c;
        continue;
      }
      if (at_ >= text_.size()) fail("unterminated escape");
      const char e = text_[at_++];
      switch (e) {
        case '"':
        case '\\':
        case '/':
          out += e;
          break;
        case 'b':
          out += '\b';
          break;
        case 'f':
          out += '\f';
          break;
        case 'n':
          out += '\n';
          break;
        case 'r':
          out += '\r';
          break;
        case 't':
          out += '\t';
          break;
        case 'u': {
          // UTF-16 code units (a surrogate pair for code points beyond U+FFFF), written as UTF-8:
          // "\u0177orker" must not read as "worker".
          uint32_t code = hex4();
          if (code >= 0xD800 && code <= 0xDBFF) {
            if (text_.substr(at_, 2) != "\\u") fail("unpaired surrogate in a \\u escape");
            at_ += 2;
            const uint32_t low = hex4();
            if (low < 0xDC00 || low > 0xDFFF) fail("unpaired surrogate in a \\u escape");
            code = 0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00);
          } else if (code >= 0xDC00 && code <= 0xDFFF) {
            fail("unpaired surrogate in a \\u escape");
          }
          append_utf8(out, code);
          break;
        }
        default:
          fail("bad escape");
      }
    }
  }

  /// Counts the objects and arrays open around the value being read.
  class Nesting {
   public:
    explicit Nesting(JsonReader& reader) : reader_(reader) {
      if (++reader_.depth_ > kMaxDepth)
        reader_.fail("objects and arrays nested deeper than " + std::to_string(kMaxDepth) +
                     " levels");
    }
    ~Nesting() { --reader_.depth_; }
    Nesting(const Nesting&) = delete;
    Nesting& operator=(const Nesting&) = delete;

   private:
    JsonReader& reader_;
  };

  Json value() {
    Json v;
    const char c = peek();
    if (c == '{') {
      const Nesting nesting(*this);
      v.kind = Json::Kind::kObject;
      ++at_;
      if (peek() == '}') {
        ++at_;
        return v;
      }
      while (true) {
        std::string key = string();
        expect(':');
        v.object[key] = value();
        if (peek() == ',') {
          ++at_;
          continue;
        }
        expect('}');
        return v;
      }
    }
    if (c == '[') {
      const Nesting nesting(*this);
      v.kind = Json::Kind::kArray;
      ++at_;
      if (peek() == ']') {
        ++at_;
        return v;
      }
      while (true) {
        v.array.push_back(value());
        if (peek() == ',') {
          ++at_;
          continue;
        }
        expect(']');
        return v;
      }
    }
    if (c == '"') {
      v.kind = Json::Kind::kString;
      v.string = string();
      return v;
    }
    if (c == 't') return word("true"), v.kind = Json::Kind::kBool, v.boolean = true, v;
    if (c == 'f') return word("false"), v.kind = Json::Kind::kBool, v;
    if (c == 'n') return word("null"), v;
    // A number: -?digits(.digits)?([eE][+-]?digits)?
    const size_t start = at_;
    if (text_[at_] == '-') ++at_;
    auto digits = [&] {
      const size_t from = at_;
      while (at_ < text_.size() && std::isdigit(static_cast<unsigned char>(text_[at_]))) ++at_;
      if (at_ == from) fail("bad number");
    };
    digits();
    if (at_ < text_.size() && text_[at_] == '.') ++at_, digits();
    if (at_ < text_.size() && (text_[at_] == 'e' || text_[at_] == 'E')) {
      ++at_;
      if (at_ < text_.size() && (text_[at_] == '+' || text_[at_] == '-')) ++at_;
      digits();
    }
    v.kind = Json::Kind::kNumber;
    v.number = std::strtod(std::string(text_.substr(start, at_ - start)).c_str(), nullptr);
    return v;
  }

  std::string_view text_;
  size_t at_ = 0;
  int depth_ = 0;
};

}  // namespace tandem::detail
