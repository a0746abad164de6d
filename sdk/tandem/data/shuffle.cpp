// The shuffle node: tf.data's buffered shuffle, over source indices when its input reads a
// cheap random-access source, else over the elements themselves. Its iterators save the
// buffer (indices or sequence numbers), the RNG state and the input's position.
#include <algorithm>
#include <array>
#include <sstream>

#include "tandem/data/internal/iterators.h"
#include "tandem/data/internal/node.h"
#include "tandem/tensor/random.h"

namespace tandem::data::detail {
namespace {

using NodePtr = std::shared_ptr<const Node>;

std::array<uint64_t, 4> generator_state(const IteratorState& state, const std::string& name);

/// tf.data's algorithm over source indices: a buffer of up to buffer_size indices; each
/// output is a uniformly chosen buffer slot, refilled by the next input (or removed at the
/// end). The saved state is the buffer (indices), the RNG state and the input's position.
class ShuffleIndexIterator final : public ReadingIterator {
 public:
  ShuffleIndexIterator(const Node& node, std::unique_ptr<IteratorImpl> input,
                       std::shared_ptr<const Source> source, int64_t buffer_size,
                       Generator generator)
      : ReadingIterator(std::move(source)),
        prefix_(node.state_prefix()),
        input_(std::move(input)),
        buffer_size_(buffer_size),
        generator_(generator) {
    buffer_.reserve(static_cast<size_t>(std::min(buffer_size_, source_->size())));
  }

  bool next_index(int64_t& index) override {
    while (!input_done_ && static_cast<int64_t>(buffer_.size()) < buffer_size_) {
      int64_t in;
      if (input_->next_index(in)) {
        buffer_.push_back(in);
      } else {
        input_done_ = true;
      }
    }
    if (buffer_.empty()) return false;
    const size_t slot = static_cast<size_t>(generator_.uniform_int(buffer_.size()));
    index = buffer_[slot];
    int64_t in;
    if (!input_done_ && input_->next_index(in)) {
      buffer_[slot] = in;
    } else {
      input_done_ = true;
      buffer_[slot] = buffer_.back();
      buffer_.pop_back();
    }
    return true;
  }
  bool next(Element& out) override {
    int64_t index;
    if (!next_index(index)) return false;
    reader().read(index, out);
    return true;
  }
  int64_t skip(int64_t n) override {
    int64_t passed = 0, index;
    while (passed < n && next_index(index)) ++passed;
    return passed;
  }
  void save(IteratorState& state) const override {
    const auto rng = generator_.state();
    state.set_u64(prefix_ + "rng", {rng.begin(), rng.end()});
    state.set(prefix_ + "buffer", buffer_);
    state.set(prefix_ + "input_done", {input_done_ ? 1 : 0});
    input_->save(state);
  }
  void restore(const IteratorState& state) override {
    generator_.set_state(generator_state(state, prefix_ + "rng"));
    const IteratorState::Array& buffer = state.get(prefix_ + "buffer");
    TANDEM_CHECK(static_cast<int64_t>(buffer.size()) <= buffer_size_, "iterator state: shuffle ",
                 "buffer of ", buffer.size(), " entries exceeds buffer_size ", buffer_size_);
    for (int64_t index : buffer)
      TANDEM_CHECK(index >= 0 && index < source_->size(), "iterator state: shuffle buffer ",
                   "holds index ", index, " outside a source of ", source_->size(), " elements");
    buffer_ = buffer;
    input_done_ = state.get_scalar(prefix_ + "input_done") != 0;
    input_->restore(state);
  }

 private:
  std::string prefix_;
  std::unique_ptr<IteratorImpl> input_;
  int64_t buffer_size_;
  Generator generator_;
  std::vector<int64_t> buffer_;
  bool input_done_ = false;
};

/// The same algorithm over materialised elements, for inputs without cheap random access
/// (HDF5 files, batches, ...). Each buffer slot remembers the element's sequence number in
/// its input; restoring replays the input and keeps the elements whose numbers are saved.
class ShuffleElementIterator final : public IteratorImpl {
 public:
  ShuffleElementIterator(const Node& node, uint64_t epoch, int64_t buffer_size, Generator generator)
      : node_(node),
        epoch_(epoch),
        prefix_(node.state_prefix()),
        input_(node.input()->make_iterator(epoch)),
        buffer_size_(buffer_size),
        generator_(generator) {}

  bool next(Element& out) override {
    while (!input_done_ && static_cast<int64_t>(buffer_.size()) < buffer_size_) {
      Element in;
      if (input_->next(in)) {
        buffer_.push_back(std::move(in));
        tags_.push_back(consumed_++);
      } else {
        input_done_ = true;
      }
    }
    if (buffer_.empty()) return false;
    const size_t slot = static_cast<size_t>(generator_.uniform_int(buffer_.size()));
    out = std::move(buffer_[slot]);
    Element in;
    if (!input_done_ && input_->next(in)) {
      buffer_[slot] = std::move(in);
      tags_[slot] = consumed_++;
    } else {
      input_done_ = true;
      buffer_[slot] = std::move(buffer_.back());
      tags_[slot] = tags_.back();
      buffer_.pop_back();
      tags_.pop_back();
    }
    return true;
  }
  void save(IteratorState& state) const override {
    const auto rng = generator_.state();
    state.set_u64(prefix_ + "rng", {rng.begin(), rng.end()});
    state.set(prefix_ + "buffer", tags_);
    state.set(prefix_ + "consumed", {consumed_});
    state.set(prefix_ + "input_done", {input_done_ ? 1 : 0});
  }
  void restore(const IteratorState& state) override {
    generator_.set_state(generator_state(state, prefix_ + "rng"));
    const IteratorState::Array& tags = state.get(prefix_ + "buffer");
    const int64_t consumed = state.get_scalar(prefix_ + "consumed");
    TANDEM_CHECK(static_cast<int64_t>(tags.size()) <= buffer_size_, "iterator state: shuffle ",
                 "buffer of ", tags.size(), " entries exceeds buffer_size ", buffer_size_);
    std::vector<std::pair<int64_t, size_t>> order;  // (sequence number, slot)
    for (size_t slot = 0; slot < tags.size(); ++slot) order.emplace_back(tags[slot], slot);
    std::sort(order.begin(), order.end());
    std::unique_ptr<IteratorImpl> input = node_.input()->make_iterator(epoch_);
    std::vector<Element> buffer(tags.size());
    int64_t position = 0;
    for (const auto& [tag, slot] : order) {
      TANDEM_CHECK(tag >= position && tag < consumed, "iterator state: shuffle buffer holds ",
                   "sequence number ", tag, " (duplicate, or not below consumed=", consumed, ")");
      const bool ok = input->skip(tag - position) == tag - position && input->next(buffer[slot]);
      TANDEM_CHECK(ok, "iterator state: the shuffle's input ended after ", position,
                   " elements while restoring; the state does not match this dataset");
      position = tag + 1;
    }
    TANDEM_CHECK(input->skip(consumed - position) == consumed - position,
                 "iterator state: ", "the shuffle's input has fewer than ", consumed, " elements");
    input_ = std::move(input);
    buffer_ = std::move(buffer);
    tags_ = tags;
    consumed_ = consumed;
    input_done_ = state.get_scalar(prefix_ + "input_done") != 0;
  }

 private:
  const Node& node_;  // the shuffle node; it outlives its iterators (they hold it via Iterator)
  uint64_t epoch_;
  std::string prefix_;
  std::unique_ptr<IteratorImpl> input_;
  int64_t buffer_size_;
  Generator generator_;
  std::vector<Element> buffer_;
  std::vector<int64_t> tags_;
  int64_t consumed_ = 0;
  bool input_done_ = false;
};

std::array<uint64_t, 4> generator_state(const IteratorState& state, const std::string& name) {
  const std::vector<uint64_t> values = state.get_u64(name);
  TANDEM_CHECK(values.size() == 4, "iterator state entry '", name, "' should hold 4 values, ",
               "it holds ", values.size());
  return {values[0], values[1], values[2], values[3]};
}

class ShuffleNode final : public Node {
 public:
  ShuffleNode(NodePtr input, int64_t buffer_size, uint64_t seed, bool reshuffle)
      : Node(std::move(input), "shuffle"),
        buffer_size_(buffer_size),
        seed_(seed),
        reshuffle_(reshuffle) {
    auto source = this->input()->source();
    if (source && source->cheap_random_access()) source_ = source;
  }
  std::string describe() const override {
    std::ostringstream out;
    out << "shuffle(buffer_size=" << buffer_size_ << ", seed=" << seed_
        << ", reshuffle_each_iteration=" << (reshuffle_ ? "true" : "false") << ")";
    return out.str();
  }
  std::shared_ptr<const Source> source() const override { return source_; }
  std::unique_ptr<IteratorImpl> make_iterator(uint64_t epoch) const override {
    // The epoch is the Philox stream: every epoch gets its own order, reproducibly.
    const Generator generator(seed_, reshuffle_ ? epoch : 0);
    if (source_) {
      return std::make_unique<ShuffleIndexIterator>(*this, input()->make_iterator(epoch), source_,
                                                    buffer_size_, generator);
    }
    return std::make_unique<ShuffleElementIterator>(*this, epoch, buffer_size_, generator);
  }
  int64_t cardinality() const override { return input()->cardinality(); }
  NodePtr with_input(NodePtr input) const override {
    return std::make_shared<ShuffleNode>(std::move(input), buffer_size_, seed_, reshuffle_);
  }

 private:
  int64_t buffer_size_;
  uint64_t seed_;
  bool reshuffle_;
  std::shared_ptr<const Source> source_;  // set when shuffling indices
};

}  // namespace

std::shared_ptr<const Node> make_shuffle_node(std::shared_ptr<const Node> input,
                                              int64_t buffer_size, uint64_t seed,
                                              bool reshuffle_each_iteration) {
  return std::make_shared<ShuffleNode>(std::move(input), buffer_size, seed,
                                       reshuffle_each_iteration);
}

}  // namespace tandem::data::detail
