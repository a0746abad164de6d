// The pipeline nodes other than prefetch: the generic source node and map, shuffle, batch,
// repeat, take, skip, shard. Each node makes iterators; each iterator saves its position as
// a few counters (and, for shuffle, its buffer as indices) under "<depth>_<kind>/...".
#include <algorithm>
#include <array>
#include <limits>
#include <sstream>

#include "tandem/data/internal/node.h"
#include "tandem/tensor/random.h"

namespace tandem::data::detail {
namespace {

using NodePtr = std::shared_ptr<const Node>;

std::vector<TensorSpec> spec_of(const Element& element) {
  std::vector<TensorSpec> spec;
  for (const Tensor& t : element) spec.push_back({t.shape(), t.dtype()});
  return spec;
}

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

// ---- source ----------------------------------------------------------------------------------

class SourceIterator final : public ReadingIterator {
 public:
  SourceIterator(const Node& node, std::shared_ptr<const Source> source)
      : ReadingIterator(std::move(source)), prefix_(node.state_prefix()), size_(source_->size()) {}

  bool next_index(int64_t& index) override {
    if (position_ >= size_) return false;
    index = position_++;
    return true;
  }
  bool next(Element& out) override {
    int64_t index;
    if (!next_index(index)) return false;
    reader().read(index, out);
    return true;
  }
  int64_t skip(int64_t n) override {
    const int64_t passed = std::clamp<int64_t>(size_ - position_, 0, n);
    position_ += passed;
    return passed;
  }
  void save(IteratorState& state) const override { state.set(prefix_ + "position", {position_}); }
  void restore(const IteratorState& state) override {
    const int64_t position = state.get_scalar(prefix_ + "position");
    TANDEM_CHECK(position >= 0 && position <= size_, "iterator state: position ", position,
                 " is outside a source of ", size_, " elements");
    position_ = position;
  }

 private:
  std::string prefix_;
  int64_t size_;
  int64_t position_ = 0;
};

class SourceNode final : public Node {
 public:
  SourceNode(std::shared_ptr<const Source> source, std::string kind)
      : Node(nullptr, std::move(kind)), source_(std::move(source)) {}
  std::string describe() const override { return source_->describe(); }
  std::shared_ptr<const Source> source() const override { return source_; }
  std::unique_ptr<IteratorImpl> make_iterator(uint64_t) const override {
    return std::make_unique<SourceIterator>(*this, source_);
  }
  int64_t cardinality() const override { return source_->size(); }
  std::vector<TensorSpec> element_spec() const override { return source_->element_spec(); }
  NodePtr with_input(NodePtr) const override {
    TANDEM_THROW("internal error: a source node has no input");
  }

 private:
  std::shared_ptr<const Source> source_;
};

// ---- map -------------------------------------------------------------------------------------

using MapFn = std::function<Element(Element)>;

class MappedReader final : public SourceReader {
 public:
  MappedReader(std::unique_ptr<SourceReader> base, std::shared_ptr<const MapFn> fn)
      : base_(std::move(base)), fn_(std::move(fn)) {}
  void read(int64_t index, Element& out) override {
    Element element;
    base_->read(index, element);
    out = (*fn_)(std::move(element));
  }

 private:
  std::unique_ptr<SourceReader> base_;
  std::shared_ptr<const MapFn> fn_;
};

/// A random-access source seen through a map function.
class MappedSource final : public Source {
 public:
  MappedSource(std::shared_ptr<const Source> base, std::shared_ptr<const MapFn> fn)
      : base_(std::move(base)), fn_(std::move(fn)) {}
  int64_t size() const override { return base_->size(); }
  bool cheap_random_access() const override { return base_->cheap_random_access(); }
  std::unique_ptr<SourceReader> reader() const override {
    return std::make_unique<MappedReader>(base_->reader(), fn_);
  }
  std::vector<TensorSpec> element_spec() const override {
    TANDEM_CHECK(size() > 0, "element_spec of a map over an empty dataset is unknown");
    Element element;
    reader()->read(0, element);
    return spec_of(element);
  }
  std::string describe() const override { return "map(" + base_->describe() + ")"; }

 private:
  std::shared_ptr<const Source> base_;
  std::shared_ptr<const MapFn> fn_;
};

class MapIterator final : public IteratorImpl {
 public:
  MapIterator(std::unique_ptr<IteratorImpl> input, std::shared_ptr<const MapFn> fn)
      : input_(std::move(input)), fn_(std::move(fn)) {}
  bool next(Element& out) override {
    Element element;
    if (!input_->next(element)) return false;
    out = (*fn_)(std::move(element));
    return true;
  }
  bool next_index(int64_t& index) override { return input_->next_index(index); }
  // The function is pure, so skipped elements need not be computed.
  int64_t skip(int64_t n) override { return input_->skip(n); }
  void save(IteratorState& state) const override { input_->save(state); }
  void restore(const IteratorState& state) override { input_->restore(state); }

 private:
  std::unique_ptr<IteratorImpl> input_;
  std::shared_ptr<const MapFn> fn_;
};

class MapNode final : public Node {
 public:
  MapNode(NodePtr input, std::shared_ptr<const MapFn> fn)
      : Node(std::move(input), "map"), fn_(std::move(fn)) {
    if (auto base = this->input()->source()) mapped_ = std::make_shared<MappedSource>(base, fn_);
  }
  std::string describe() const override { return "map"; }
  std::shared_ptr<const Source> source() const override { return mapped_; }
  std::unique_ptr<IteratorImpl> make_iterator(uint64_t epoch) const override {
    return std::make_unique<MapIterator>(input()->make_iterator(epoch), fn_);
  }
  int64_t cardinality() const override { return input()->cardinality(); }
  std::vector<TensorSpec> element_spec() const override {
    if (mapped_) return mapped_->element_spec();
    Element element;
    TANDEM_CHECK(make_iterator(0)->next(element),
                 "element_spec of a map over an empty dataset is unknown");
    return spec_of(element);
  }
  NodePtr with_input(NodePtr input) const override {
    return std::make_shared<MapNode>(std::move(input), fn_);
  }

 private:
  std::shared_ptr<const MapFn> fn_;
  std::shared_ptr<const Source> mapped_;
};

// ---- shuffle ---------------------------------------------------------------------------------

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

// ---- batch -----------------------------------------------------------------------------------

class BatchIterator final : public IteratorImpl {
 public:
  BatchIterator(std::unique_ptr<IteratorImpl> input, std::shared_ptr<const Source> source,
                int64_t batch_size, bool drop_remainder)
      : input_(std::move(input)),
        source_(std::move(source)),
        batch_size_(batch_size),
        drop_remainder_(drop_remainder) {}

  bool next(Element& out) override {
    if (source_) {
      // Index mode: collect the indices, then copy each row straight into the batch.
      indices_.clear();
      int64_t index;
      while (static_cast<int64_t>(indices_.size()) < batch_size_ && input_->next_index(index))
        indices_.push_back(index);
      const auto rows = static_cast<int64_t>(indices_.size());
      if (rows == 0 || (drop_remainder_ && rows < batch_size_)) return false;
      if (!reader_) reader_ = source_->reader();
      reader_->gather(indices_, out);
      return true;
    }
    Element element;
    if (!input_->next(element)) return false;
    stacker_.start(element, batch_size_);
    while (stacker_.rows() < batch_size_ && input_->next(element)) stacker_.append(element);
    if (drop_remainder_ && stacker_.rows() < batch_size_) return false;
    out = stacker_.finish();
    return true;
  }
  int64_t skip(int64_t n) override {
    for (int64_t i = 0; i < n; ++i) {
      const int64_t rows = input_->skip(batch_size_);
      if (rows == 0 || (drop_remainder_ && rows < batch_size_)) return i;
    }
    return n;
  }
  void save(IteratorState& state) const override { input_->save(state); }
  void restore(const IteratorState& state) override { input_->restore(state); }

 private:
  std::unique_ptr<IteratorImpl> input_;
  std::shared_ptr<const Source> source_;
  std::unique_ptr<SourceReader> reader_;
  int64_t batch_size_;
  bool drop_remainder_;
  std::vector<int64_t> indices_;
  Stacker stacker_;
};

class BatchNode final : public Node {
 public:
  BatchNode(NodePtr input, int64_t batch_size, bool drop_remainder)
      : Node(std::move(input), "batch"), batch_size_(batch_size), drop_remainder_(drop_remainder) {}
  std::string describe() const override {
    std::ostringstream out;
    out << "batch(" << batch_size_ << (drop_remainder_ ? ", drop_remainder=true" : "") << ")";
    return out.str();
  }
  std::unique_ptr<IteratorImpl> make_iterator(uint64_t epoch) const override {
    return std::make_unique<BatchIterator>(input()->make_iterator(epoch), input()->source(),
                                           batch_size_, drop_remainder_);
  }
  int64_t cardinality() const override {
    const int64_t n = input()->cardinality();
    if (n < 0) return n;
    return drop_remainder_ ? n / batch_size_ : (n + batch_size_ - 1) / batch_size_;
  }
  std::vector<TensorSpec> element_spec() const override {
    std::vector<TensorSpec> spec = input()->element_spec();
    for (TensorSpec& s : spec) s.shape = prepend_dim(drop_remainder_ ? batch_size_ : -1, s.shape);
    return spec;
  }
  NodePtr with_input(NodePtr input) const override {
    return std::make_shared<BatchNode>(std::move(input), batch_size_, drop_remainder_);
  }
  int64_t batch_size() const override { return batch_size_; }
  bool drop_remainder() const override { return drop_remainder_; }

 private:
  int64_t batch_size_;
  bool drop_remainder_;
};

// ---- repeat ----------------------------------------------------------------------------------

class RepeatIterator final : public IteratorImpl {
 public:
  RepeatIterator(const Node& node, uint64_t epoch, int64_t count)
      : node_(node), prefix_(node.state_prefix()), epoch_(epoch), count_(count) {
    if (count_ == 0) {
      done_ = true;
    } else {
      input_ = node_.input()->make_iterator(pass_epoch(0));
    }
  }

  bool next(Element& out) override {
    return step([&](IteratorImpl& in) { return in.next(out); });
  }
  bool next_index(int64_t& index) override {
    return step([&](IteratorImpl& in) { return in.next_index(index); });
  }
  int64_t skip(int64_t n) override {
    int64_t passed = 0;
    while (passed < n && !done_) {
      const int64_t s = input_->skip(n - passed);
      passed += s;
      produced_ += s;
      if (passed < n) next_pass();
    }
    return passed;
  }
  void save(IteratorState& state) const override {
    state.set(prefix_ + "pass", {pass_, produced_, done_ ? 1 : 0});
    if (input_) input_->save(state);
  }
  void restore(const IteratorState& state) override {
    const IteratorState::Array& pass = state.get(prefix_ + "pass");
    TANDEM_CHECK(pass.size() == 3 && pass[0] >= 0 && (count_ < 0 || pass[0] <= count_),
                 "iterator state: bad repeat position");
    pass_ = pass[0];
    produced_ = pass[1];
    done_ = pass[2] != 0;
    input_.reset();
    if (!done_) {
      input_ = node_.input()->make_iterator(pass_epoch(pass_));
      input_->restore(state);
    }
  }

 private:
  /// Epoch of the input's pass p: passes continue the numbering of the outer epochs, so
  /// shuffle().repeat(3) walks epochs 0, 1, 2 and its next iterator 3, 4, 5.
  uint64_t pass_epoch(int64_t pass) const {
    if (count_ > 0) return epoch_ * static_cast<uint64_t>(count_) + static_cast<uint64_t>(pass);
    return (epoch_ << 32) + static_cast<uint64_t>(pass);
  }
  /// Moves to the next pass after the input ended; an empty pass ends the repeat (otherwise
  /// repeating an empty dataset forever would spin).
  void next_pass() {
    if (produced_ == 0 || (count_ >= 0 && pass_ + 1 >= count_)) {
      done_ = true;
      input_.reset();
      return;
    }
    ++pass_;
    produced_ = 0;
    input_ = node_.input()->make_iterator(pass_epoch(pass_));
  }
  template <typename Pull>
  bool step(Pull&& pull) {
    while (!done_) {
      if (pull(*input_)) {
        ++produced_;
        return true;
      }
      next_pass();
    }
    return false;
  }

  const Node& node_;
  std::string prefix_;
  uint64_t epoch_;
  int64_t count_;
  int64_t pass_ = 0;
  int64_t produced_ = 0;  // elements of the current pass so far
  bool done_ = false;
  std::unique_ptr<IteratorImpl> input_;
};

class RepeatNode final : public Node {
 public:
  RepeatNode(NodePtr input, int64_t count) : Node(std::move(input), "repeat"), count_(count) {}
  std::string describe() const override { return "repeat(" + std::to_string(count_) + ")"; }
  std::shared_ptr<const Source> source() const override { return input()->source(); }
  std::unique_ptr<IteratorImpl> make_iterator(uint64_t epoch) const override {
    return std::make_unique<RepeatIterator>(*this, epoch, count_);
  }
  int64_t cardinality() const override {
    const int64_t n = input()->cardinality();
    if (count_ == 0 || n == 0) return 0;
    if (count_ < 0) return kInfiniteCardinality;
    return n < 0 ? n : n * count_;
  }
  NodePtr with_input(NodePtr input) const override {
    return std::make_shared<RepeatNode>(std::move(input), count_);
  }

 private:
  int64_t count_;
};

// ---- take, skip, shard -----------------------------------------------------------------------

/// Shared shape of the counting pass-through iterators: next and next_index go through
/// step(), which pulls from the input with the matching call.
template <typename Derived>
class PassThroughIterator : public IteratorImpl {
 public:
  bool next(Element& out) override {
    return static_cast<Derived*>(this)->step([&](IteratorImpl& in) { return in.next(out); });
  }
  bool next_index(int64_t& index) override {
    return static_cast<Derived*>(this)->step(
        [&](IteratorImpl& in) { return in.next_index(index); });
  }
};

class TakeIterator final : public PassThroughIterator<TakeIterator> {
 public:
  TakeIterator(const Node& node, std::unique_ptr<IteratorImpl> input, int64_t count)
      : prefix_(node.state_prefix()), input_(std::move(input)), count_(count) {}
  template <typename Pull>
  bool step(Pull&& pull) {
    if (count_ >= 0 && taken_ >= count_) return false;
    if (!pull(*input_)) return false;
    ++taken_;
    return true;
  }
  int64_t skip(int64_t n) override {
    const int64_t passed = input_->skip(count_ < 0 ? n : std::min(n, count_ - taken_));
    taken_ += passed;
    return passed;
  }
  void save(IteratorState& state) const override {
    state.set(prefix_ + "taken", {taken_});
    input_->save(state);
  }
  void restore(const IteratorState& state) override {
    taken_ = state.get_scalar(prefix_ + "taken");
    input_->restore(state);
  }

 private:
  std::string prefix_;
  std::unique_ptr<IteratorImpl> input_;
  int64_t count_;
  int64_t taken_ = 0;
};

class SkipIterator final : public PassThroughIterator<SkipIterator> {
 public:
  SkipIterator(const Node& node, std::unique_ptr<IteratorImpl> input, int64_t count)
      : prefix_(node.state_prefix()),
        input_(std::move(input)),
        count_(count < 0 ? std::numeric_limits<int64_t>::max() : count) {}
  template <typename Pull>
  bool step(Pull&& pull) {
    return skip_prefix() && pull(*input_);
  }
  int64_t skip(int64_t n) override { return skip_prefix() ? input_->skip(n) : 0; }
  void save(IteratorState& state) const override {
    state.set(prefix_ + "skipped", {skipped_});
    input_->save(state);
  }
  void restore(const IteratorState& state) override {
    skipped_ = state.get_scalar(prefix_ + "skipped");
    input_->restore(state);
  }

 private:
  /// Passes the first count elements once; false while the input ended inside them.
  bool skip_prefix() {
    if (skipped_ < count_) skipped_ += input_->skip(count_ - skipped_);
    return skipped_ >= count_;
  }

  std::string prefix_;
  std::unique_ptr<IteratorImpl> input_;
  int64_t count_;
  int64_t skipped_ = 0;
};

class ShardIterator final : public PassThroughIterator<ShardIterator> {
 public:
  ShardIterator(const Node& node, std::unique_ptr<IteratorImpl> input, int64_t num_shards,
                int64_t index)
      : prefix_(node.state_prefix()),
        input_(std::move(input)),
        num_shards_(num_shards),
        index_(index) {}
  // Whole rounds: each element this shard keeps consumes the W input elements of its round
  // (passing index_ before it and the rest after it). So between elements every shard of the
  // same input has consumed the same count, and a position saved by one shard (one worker) is
  // valid for every other.
  template <typename Pull>
  bool step(Pull&& pull) {
    const int64_t passed = input_->skip(index_);
    position_ += passed;
    if (passed < index_ || !pull(*input_)) return false;
    ++position_;
    position_ += input_->skip(num_shards_ - index_ - 1);
    return true;
  }
  int64_t skip(int64_t n) override {
    for (int64_t i = 0; i < n; ++i) {
      const int64_t passed = input_->skip(num_shards_);
      position_ += passed;
      if (passed <= index_) return i;  // the round ended before this shard's element
      if (passed < num_shards_) return i + 1;
    }
    return n;
  }
  void save(IteratorState& state) const override {
    state.set(prefix_ + "position", {position_});
    input_->save(state);
  }
  void restore(const IteratorState& state) override {
    position_ = state.get_scalar(prefix_ + "position");
    input_->restore(state);
  }

 private:
  std::string prefix_;
  std::unique_ptr<IteratorImpl> input_;
  int64_t num_shards_;
  int64_t index_;
  int64_t position_ = 0;  // input elements consumed
};

class TakeNode final : public Node {
 public:
  TakeNode(NodePtr input, int64_t count) : Node(std::move(input), "take"), count_(count) {}
  std::string describe() const override { return "take(" + std::to_string(count_) + ")"; }
  std::shared_ptr<const Source> source() const override { return input()->source(); }
  std::unique_ptr<IteratorImpl> make_iterator(uint64_t epoch) const override {
    return std::make_unique<TakeIterator>(*this, input()->make_iterator(epoch), count_);
  }
  int64_t cardinality() const override {
    const int64_t n = input()->cardinality();
    if (count_ < 0) return n;
    return n < 0 ? count_ : std::min(n, count_);
  }
  NodePtr with_input(NodePtr input) const override {
    return std::make_shared<TakeNode>(std::move(input), count_);
  }

 private:
  int64_t count_;
};

class SkipNode final : public Node {
 public:
  SkipNode(NodePtr input, int64_t count) : Node(std::move(input), "skip"), count_(count) {}
  std::string describe() const override { return "skip(" + std::to_string(count_) + ")"; }
  std::shared_ptr<const Source> source() const override { return input()->source(); }
  std::unique_ptr<IteratorImpl> make_iterator(uint64_t epoch) const override {
    return std::make_unique<SkipIterator>(*this, input()->make_iterator(epoch), count_);
  }
  int64_t cardinality() const override {
    const int64_t n = input()->cardinality();
    if (n < 0) return n;
    return count_ < 0 ? 0 : std::max<int64_t>(0, n - count_);
  }
  NodePtr with_input(NodePtr input) const override {
    return std::make_shared<SkipNode>(std::move(input), count_);
  }

 private:
  int64_t count_;
};

class ShardNode final : public Node {
 public:
  ShardNode(NodePtr input, int64_t num_shards, int64_t index)
      : Node(std::move(input), "shard"), num_shards_(num_shards), index_(index) {}
  std::string describe() const override {
    return "shard(" + std::to_string(num_shards_) + ", " + std::to_string(index_) + ")";
  }
  // Positions are whole rounds (see ShardIterator): the same state serves every index.
  std::string signature_text() const override {
    return "shard(" + std::to_string(num_shards_) + ")";
  }
  std::shared_ptr<const Source> source() const override { return input()->source(); }
  std::unique_ptr<IteratorImpl> make_iterator(uint64_t epoch) const override {
    return std::make_unique<ShardIterator>(*this, input()->make_iterator(epoch), num_shards_,
                                           index_);
  }
  int64_t cardinality() const override {
    const int64_t n = input()->cardinality();
    if (n < 0) return n;
    return n <= index_ ? 0 : (n - index_ + num_shards_ - 1) / num_shards_;
  }
  NodePtr with_input(NodePtr input) const override {
    return std::make_shared<ShardNode>(std::move(input), num_shards_, index_);
  }

 private:
  int64_t num_shards_;
  int64_t index_;
};

}  // namespace

std::shared_ptr<const Node> make_source_node(std::shared_ptr<const Source> source,
                                             std::string kind) {
  return std::make_shared<SourceNode>(std::move(source), std::move(kind));
}
std::shared_ptr<const Node> make_map_node(std::shared_ptr<const Node> input,
                                          std::function<Element(Element)> fn) {
  return std::make_shared<MapNode>(std::move(input), std::make_shared<const MapFn>(std::move(fn)));
}
std::shared_ptr<const Node> make_shuffle_node(std::shared_ptr<const Node> input,
                                              int64_t buffer_size, uint64_t seed,
                                              bool reshuffle_each_iteration) {
  return std::make_shared<ShuffleNode>(std::move(input), buffer_size, seed,
                                       reshuffle_each_iteration);
}
std::shared_ptr<const Node> make_batch_node(std::shared_ptr<const Node> input, int64_t batch_size,
                                            bool drop_remainder) {
  return std::make_shared<BatchNode>(std::move(input), batch_size, drop_remainder);
}
std::shared_ptr<const Node> make_repeat_node(std::shared_ptr<const Node> input, int64_t count) {
  return std::make_shared<RepeatNode>(std::move(input), count);
}
std::shared_ptr<const Node> make_take_node(std::shared_ptr<const Node> input, int64_t count) {
  return std::make_shared<TakeNode>(std::move(input), count);
}
std::shared_ptr<const Node> make_skip_node(std::shared_ptr<const Node> input, int64_t count) {
  return std::make_shared<SkipNode>(std::move(input), count);
}
std::shared_ptr<const Node> make_shard_node(std::shared_ptr<const Node> input, int64_t num_shards,
                                            int64_t index) {
  return std::make_shared<ShardNode>(std::move(input), num_shards, index);
}

}  // namespace tandem::data::detail
