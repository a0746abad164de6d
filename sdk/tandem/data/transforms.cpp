// The pipeline nodes that keep elements in order: the generic source node, map, batch and
// repeat (shuffle: shuffle.cpp; take, skip, shard: take_skip_shard.cpp; prefetch: prefetch.cpp).
// Each node makes iterators; each iterator saves its position as a few counters under
// "<depth>_<kind>/...".
#include <algorithm>
#include <optional>
#include <sstream>

#include "tandem/data/internal/iterators.h"
#include "tandem/data/internal/node.h"
#include "tandem/data/internal/worker_pool.h"

namespace tandem::data::detail {
namespace {

using NodePtr = std::shared_ptr<const Node>;

std::vector<TensorSpec> spec_of(const Element& element) {
  std::vector<TensorSpec> spec;
  for (const Tensor& t : element) spec.push_back({t.shape(), t.dtype()});
  return spec;
}

// ---- source ----------------------------------------------------------------------------------

class SourceIterator final : public ReadingIterator {
 public:
  SourceIterator(const Node& node, std::shared_ptr<const Source> source)
      : ReadingIterator(std::move(source)),
        position_entry_(node, "position"),
        size_(source_->size()) {}

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
  void save(IteratorState& state) const override {
    position_entry_.save(state, position_, /*input=*/nullptr);
  }
  void restore(const IteratorState& state) override {
    const int64_t position = position_entry_.read(state);
    TANDEM_CHECK(position >= 0 && position <= size_, "iterator state: position ", position,
                 " is outside a source of ", size_, " elements");
    position_ = position;
  }

 private:
  SavedCounter position_entry_;
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
  MappedReader(const Source& base, std::shared_ptr<const MapFn> fn, int parallel, bool autotune)
      : fn_(std::move(fn)) {
    // One reader of the base source per worker: readers are not shared between threads.
    for (int w = 0; w < parallel; ++w) bases_.push_back(base.reader());
    if (parallel > 1) pool_ = std::make_unique<WorkerPool>(parallel);
    if (parallel > 1 && autotune) tuner_.emplace(parallel);
  }
  void read(int64_t index, Element& out) override {
    Element element;
    bases_[0]->read(index, element);
    out = (*fn_)(std::move(element));
  }
  // With num_parallel_calls, a batch's elements are read and mapped on the pool's workers,
  // then stacked in the batch's order.
  void gather(const std::vector<int64_t>& indices, Element& out) override {
    if (!pool_) {
      SourceReader::gather(indices, out);
      return;
    }
    std::vector<Element> elements(indices.size());
    RoundTimer timer(tuner_ ? &*tuner_ : nullptr, pool_->workers(), last_start_);
    pool_->run(
        static_cast<int64_t>(indices.size()),
        [&](int64_t k, int worker) {
          const RoundTimer::Task task(timer, worker);
          Element element;
          bases_[static_cast<size_t>(worker)]->read(indices[static_cast<size_t>(k)], element);
          elements[static_cast<size_t>(k)] = (*fn_)(std::move(element));
        },
        tuner_ ? tuner_->workers() : 0);
    timer.finish(static_cast<int64_t>(indices.size()));
    Stacker stacker;
    stacker.start(elements[0], static_cast<int64_t>(elements.size()));
    for (size_t k = 1; k < elements.size(); ++k) stacker.append(elements[k]);
    out = stacker.finish();
  }

 private:
  std::vector<std::unique_ptr<SourceReader>> bases_;
  std::shared_ptr<const MapFn> fn_;
  std::unique_ptr<WorkerPool> pool_;
  std::optional<ParallelismTuner> tuner_;  // kAutotune
  RoundTimer::Clock::time_point last_start_{};
};

/// A random-access source seen through a map function.
class MappedSource final : public Source {
 public:
  MappedSource(std::shared_ptr<const Source> base, std::shared_ptr<const MapFn> fn, int parallel,
               bool autotune)
      : base_(std::move(base)), fn_(std::move(fn)), parallel_(parallel), autotune_(autotune) {}
  int64_t size() const override { return base_->size(); }
  bool cheap_random_access() const override { return base_->cheap_random_access(); }
  std::unique_ptr<SourceReader> reader() const override {
    return std::make_unique<MappedReader>(*base_, fn_, parallel_, autotune_);
  }
  std::vector<TensorSpec> element_spec() const override {
    TANDEM_CHECK(size() > 0, "element_spec of a map over an empty dataset is unknown");
    Element element;
    MappedReader(*base_, fn_, 1, false).read(0, element);
    return spec_of(element);
  }
  std::string describe() const override { return "map(" + base_->describe() + ")"; }

 private:
  std::shared_ptr<const Source> base_;
  std::shared_ptr<const MapFn> fn_;
  int parallel_;
  bool autotune_;
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
  MapNode(NodePtr input, std::shared_ptr<const MapFn> fn, int parallel, bool autotune)
      : Node(std::move(input), "map"),
        fn_(std::move(fn)),
        parallel_(parallel),
        autotune_(autotune) {
    if (auto base = this->input()->source())
      mapped_ = std::make_shared<MappedSource>(base, fn_, parallel_, autotune_);
  }
  std::string describe() const override {
    if (autotune_)
      return "map(num_parallel_calls=autotune, up to " + std::to_string(parallel_) + ")";
    return parallel_ > 1 ? "map(num_parallel_calls=" + std::to_string(parallel_) + ")" : "map";
  }
  // A position saved with one parallelism restores with another: it is the input's.
  std::string signature_text() const override { return "map"; }
  std::shared_ptr<const Source> source() const override { return mapped_; }
  std::unique_ptr<IteratorImpl> make_iterator(uint64_t epoch) const override {
    if (parallel_ > 1) return make_parallel_map_iterator(input(), epoch, fn_, parallel_, autotune_);
    return std::make_unique<MapIterator>(input()->make_iterator(epoch), fn_);
  }
  int64_t cardinality() const override { return input()->cardinality(); }
  std::vector<TensorSpec> element_spec() const override {
    if (mapped_) return mapped_->element_spec();
    Element element;
    TANDEM_CHECK(std::make_unique<MapIterator>(input()->make_iterator(0), fn_)->next(element),
                 "element_spec of a map over an empty dataset is unknown");
    return spec_of(element);
  }
  NodePtr with_input(NodePtr input) const override {
    return std::make_shared<MapNode>(std::move(input), fn_, parallel_, autotune_);
  }

 private:
  std::shared_ptr<const MapFn> fn_;
  int parallel_;
  bool autotune_;
  std::shared_ptr<const Source> mapped_;
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
  BatchNode(NodePtr input, int64_t batch_size, bool drop_remainder, int64_t signature_batch_size)
      : Node(std::move(input), "batch"),
        batch_size_(batch_size),
        drop_remainder_(drop_remainder),
        signature_batch_size_(signature_batch_size) {}
  std::string describe() const override {
    std::ostringstream out;
    out << "batch(" << batch_size_ << (drop_remainder_ ? ", drop_remainder=true" : "") << ")";
    return out.str();
  }
  std::string signature_text() const override {
    if (signature_batch_size_ <= 0) return describe();
    return BatchNode(input(), signature_batch_size_, drop_remainder_, 0).describe();
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
    return std::make_shared<BatchNode>(std::move(input), batch_size_, drop_remainder_,
                                       signature_batch_size_);
  }
  int64_t batch_size() const override { return batch_size_; }
  bool drop_remainder() const override { return drop_remainder_; }

 private:
  int64_t batch_size_;
  bool drop_remainder_;
  int64_t signature_batch_size_;
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

}  // namespace

std::shared_ptr<const Node> make_source_node(std::shared_ptr<const Source> source,
                                             std::string kind) {
  return std::make_shared<SourceNode>(std::move(source), std::move(kind));
}
std::shared_ptr<const Node> make_map_node(std::shared_ptr<const Node> input,
                                          std::function<Element(Element)> fn, int parallel,
                                          bool autotune) {
  return std::make_shared<MapNode>(std::move(input), std::make_shared<const MapFn>(std::move(fn)),
                                   parallel, autotune);
}
std::shared_ptr<const Node> make_batch_node(std::shared_ptr<const Node> input, int64_t batch_size,
                                            bool drop_remainder, int64_t signature_batch_size) {
  return std::make_shared<BatchNode>(std::move(input), batch_size, drop_remainder,
                                     signature_batch_size);
}
std::shared_ptr<const Node> make_repeat_node(std::shared_ptr<const Node> input, int64_t count) {
  return std::make_shared<RepeatNode>(std::move(input), count);
}

}  // namespace tandem::data::detail
