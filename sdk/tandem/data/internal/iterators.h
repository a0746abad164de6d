// Building blocks of the pipeline nodes' iterators (internal): iterators that read elements of a
// random-access source themselves, and the one-counter position that the source, take, skip and
// shard save and restore.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "tandem/core/error.h"
#include "tandem/data/internal/node.h"

namespace tandem::data::detail {

/// Base of iterators that materialise elements of a random-access source themselves.
class ReadingIterator : public IteratorImpl {
 public:
  explicit ReadingIterator(std::shared_ptr<const Source> source) : source_(std::move(source)) {}

 protected:
  SourceReader& reader() {
    if (!reader_) reader_ = source_->reader();
    return *reader_;
  }
  std::shared_ptr<const Source> source_;

 private:
  std::unique_ptr<SourceReader> reader_;
};

/// The saved position of an iterator that is one count (the source's and shard's "position",
/// take's "taken", skip's "skipped"): the entry "<depth>_<kind>/<name>" holding that count,
/// followed by the input's entries.
class SavedCounter {
 public:
  SavedCounter(const Node& node, std::string_view name)
      : key_(node.state_prefix() + std::string(name)) {}

  /// Adds {count}, then `input`'s entries (nullptr: a source, which has no input).
  void save(IteratorState& state, int64_t count, const IteratorImpl* input) const {
    state.set(key_, {count});
    if (input != nullptr) input->save(state);
  }
  /// The saved count; raises when the entry is missing or does not hold exactly one value.
  int64_t read(const IteratorState& state) const { return state.get_scalar(key_); }

 private:
  std::string key_;
};

/// Base of the counting pass-through iterators (take, skip, shard): an input, and one count
/// saved and restored with SavedCounter. next and next_index go through Derived::step, which
/// pulls from the input with the matching call and updates counted_.
template <typename Derived>
class CountingIterator : public IteratorImpl {
 public:
  bool next(Element& out) override {
    return static_cast<Derived*>(this)->step([&](IteratorImpl& in) { return in.next(out); });
  }
  bool next_index(int64_t& index) override {
    return static_cast<Derived*>(this)->step(
        [&](IteratorImpl& in) { return in.next_index(index); });
  }
  void save(IteratorState& state) const override { counter_.save(state, counted_, input_.get()); }
  void restore(const IteratorState& state) override {
    counted_ = counter_.read(state);
    input_->restore(state);
  }

 protected:
  /// `counter_name`: the entry's name after the node's prefix ("taken").
  CountingIterator(const Node& node, std::string_view counter_name,
                   std::unique_ptr<IteratorImpl> input)
      : input_(std::move(input)), counter_(node, counter_name) {}

  std::unique_ptr<IteratorImpl> input_;
  int64_t counted_ = 0;  ///< the saved count (what it counts: see each iterator)

 private:
  SavedCounter counter_;
};

/// The input's position at a consumer that runs behind the input (prefetch's queue, a
/// parallel map's window): the input's state at the last save or restore, and the elements
/// consumed since. save() recomputes it on a fresh input of the same epoch, moved to that state
/// and advanced by what was consumed: pipelines are deterministic, so this is the same
/// position (in index mode the advance reads no data).
class ConsumerPosition {
 public:
  /// `what` names the node in the error raised when the recomputation runs out of input.
  ConsumerPosition(std::shared_ptr<const Node> input, uint64_t epoch, std::string what)
      : input_(std::move(input)), epoch_(epoch), what_(std::move(what)) {}

  /// Counts elements handed to the consumer (or skipped past).
  void consumed(int64_t n = 1) { consumed_ += n; }
  /// Adds the input's entries at the consumer's position to `state`.
  void save(IteratorState& state) const {
    std::unique_ptr<IteratorImpl> replica = input_->make_iterator(epoch_);
    if (base_state_) replica->restore(*base_state_);
    const int64_t behind = consumed_ - base_position_;
    TANDEM_CHECK(replica->skip(behind) == behind, what_, ": the input ended while recomputing ",
                 "the saved position; is a map function not deterministic?");
    IteratorState input_state;
    replica->save(input_state);
    saved(state, std::move(input_state));
  }
  /// Adds `input_state`, the input's entries at the consumer's position (when the caller has
  /// them without recomputing), to `state`.
  void saved(IteratorState& state, IteratorState input_state) const {
    state.merge(input_state);
    base_state_ = std::move(input_state);
    base_position_ = consumed_;
  }
  /// The input was restored to `state`: nothing consumed since.
  void restored(const IteratorState& state) {
    base_state_ = state;
    base_position_ = 0;
    consumed_ = 0;
  }

 private:
  std::shared_ptr<const Node> input_;
  uint64_t epoch_;
  std::string what_;
  int64_t consumed_ = 0;                             // consumer side only
  mutable std::optional<IteratorState> base_state_;  // the input's state at base_position_
  mutable int64_t base_position_ = 0;
};

}  // namespace tandem::data::detail
