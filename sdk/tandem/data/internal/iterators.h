// Building blocks of the pipeline nodes' iterators (internal): iterators that read elements of a
// random-access source themselves, and the one-counter position that the source, take, skip and
// shard save and restore.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>

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

}  // namespace tandem::data::detail
