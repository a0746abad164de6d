// CharTokenizer: a character-level vocabulary built from a corpus (nanoGPT's shakespeare_char),
// saved and restored with the rest of a checkpoint.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "tandem/checkpoint/tracked_state.h"
#include "tandem/tensor/tensor.h"

namespace tandem::text {

/// Maps each distinct byte of a corpus to an id: the bytes sorted, id i the i-th (nanoGPT's
/// `chars = sorted(list(set(data)))`). Track it in a Checkpoint ({"tokenizer", &tokenizer}) and
/// its vocabulary is saved with the model (/training_state/user/tokenizer/vocabulary, uint8
/// [V]): a resumed run or a generation run decodes with the vocabulary the model was trained on.
class CharTokenizer : public TrackedState {
 public:
  /// An empty vocabulary (restore one from a checkpoint, or build one with from_corpus).
  CharTokenizer() { index(); }
  /// The distinct bytes of `corpus` (which must not be empty), sorted.
  static CharTokenizer from_corpus(std::string_view corpus);

  /// The number of ids: the distinct bytes.
  int64_t vocabulary_size() const { return static_cast<int64_t>(vocabulary_.size()); }
  /// The bytes, in id order.
  const std::string& vocabulary() const { return vocabulary_; }
  /// `text` as int64 ids [text.size()]; a byte outside the vocabulary raises, naming it and
  /// its position.
  Tensor encode(std::string_view text) const;
  /// The bytes of int32 or int64 ids (any shape, row-major); an id outside [0, V) raises.
  std::string decode(const Tensor& ids) const;

  TrackedState::State save_state() const override;
  /// Accepts any vocabulary of distinct bytes in increasing order (the saved one replaces this
  /// one, whatever its size); names what is wrong otherwise.
  void check_state(const TrackedState::State& state) const override;
  void restore_state(const TrackedState::State& state) override;

 private:
  void index();
  std::string vocabulary_;
  int16_t ids_[256] = {};  // byte -> id, -1 when not in the vocabulary
};

}  // namespace tandem::text
