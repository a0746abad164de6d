#include "tandem/text/char_tokenizer.h"

#include <algorithm>
#include <cstring>

#include "tandem/core/error.h"

namespace tandem::text {

namespace {

/// "'a' (97)" or "byte 10" for what cannot be shown as it is.
std::string show(unsigned char byte) {
  if (byte >= 0x20 && byte < 0x7f)
    return detail::str_cat("'", static_cast<char>(byte), "' (", int(byte), ")");
  return detail::str_cat("byte ", int(byte));
}

}  // namespace

CharTokenizer CharTokenizer::from_corpus(std::string_view corpus) {
  TANDEM_CHECK(!corpus.empty(), "CharTokenizer::from_corpus: the corpus is empty");
  bool seen[256] = {};
  for (char c : corpus) seen[static_cast<unsigned char>(c)] = true;
  CharTokenizer tokenizer;
  for (int b = 0; b < 256; ++b)
    if (seen[b]) tokenizer.vocabulary_.push_back(static_cast<char>(b));
  tokenizer.index();
  return tokenizer;
}

void CharTokenizer::index() {
  std::fill(std::begin(ids_), std::end(ids_), int16_t{-1});
  for (size_t i = 0; i < vocabulary_.size(); ++i)
    ids_[static_cast<unsigned char>(vocabulary_[i])] = static_cast<int16_t>(i);
}

Tensor CharTokenizer::encode(std::string_view text) const {
  Tensor ids = Tensor::empty(Shape{static_cast<int64_t>(text.size())}, DType::kInt64);
  int64_t* out = ids.data<int64_t>();
  for (size_t i = 0; i < text.size(); ++i) {
    const auto byte = static_cast<unsigned char>(text[i]);
    TANDEM_CHECK(ids_[byte] >= 0, "CharTokenizer::encode: ", show(byte), " at position ", i,
                 " is not in the vocabulary of ", vocabulary_.size(), " characters");
    out[i] = ids_[byte];
  }
  return ids;
}

std::string CharTokenizer::decode(const Tensor& ids) const {
  TANDEM_CHECK(ids.dtype() == DType::kInt64 || ids.dtype() == DType::kInt32,
               "CharTokenizer::decode: needs int32 or int64 ids, got ", ids.dtype());
  const std::vector<int64_t> values = ids.to_vector<int64_t>();
  std::string text(values.size(), '\0');
  for (size_t i = 0; i < values.size(); ++i) {
    TANDEM_CHECK(values[i] >= 0 && values[i] < vocabulary_size(), "CharTokenizer::decode: id ",
                 values[i], " at position ", i, " is outside the vocabulary [0, ",
                 vocabulary_size(), ")");
    text[i] = vocabulary_[static_cast<size_t>(values[i])];
  }
  return text;
}

TrackedState::State CharTokenizer::save_state() const {
  Tensor bytes = Tensor::empty(Shape{vocabulary_size()}, DType::kUInt8);
  if (!vocabulary_.empty()) std::memcpy(bytes.raw_data(), vocabulary_.data(), vocabulary_.size());
  return {{"vocabulary", bytes}};
}

void CharTokenizer::check_state(const TrackedState::State& state) const {
  const auto it = state.find("vocabulary");
  TANDEM_CHECK(it != state.end(), "CharTokenizer: the checkpoint holds no vocabulary");
  const Tensor& bytes = it->second;
  TANDEM_CHECK(bytes.dtype() == DType::kUInt8 && bytes.rank() == 1 && bytes.numel() >= 1 &&
                   bytes.numel() <= 256,
               "CharTokenizer: the saved vocabulary is ", bytes.dtype(), " ", bytes.shape(),
               ", expected uint8 [1..256]");
  const auto* b = static_cast<const unsigned char*>(bytes.raw_data());
  for (int64_t i = 1; i < bytes.numel(); ++i)
    TANDEM_CHECK(b[i] > b[i - 1],
                 "CharTokenizer: the saved vocabulary is not sorted distinct bytes (",
                 show(b[i - 1]), " then ", show(b[i]), " at ", i, ")");
}

void CharTokenizer::restore_state(const TrackedState::State& state) {
  const Tensor& bytes = state.at("vocabulary");
  vocabulary_.assign(static_cast<const char*>(bytes.raw_data()),
                     static_cast<size_t>(bytes.numel()));
  index();
}

}  // namespace tandem::text
