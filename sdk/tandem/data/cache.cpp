// cache() and cache(filename): the input's elements are kept (in memory or in a file) as they
// are read, and once every element is kept, passes read them instead of the input. Over a
// random-access input (index mode) an element is kept by its index, so a shuffle above the cache
// still moves indices; otherwise a pass is kept by position when it starts at the beginning, and
// completes the cache when it reaches the end.
#include <mutex>
#include <optional>
#include <utility>

#include "tandem/data/internal/cache_store.h"
#include "tandem/data/internal/iterators.h"
#include "tandem/data/internal/node.h"

namespace tandem::data::detail {
namespace {

using NodePtr = std::shared_ptr<const Node>;

/// Copies of the tensors: a consumer may write into what it is given.
Element copy_of(const Element& element) {
  Element out;
  out.reserve(element.size());
  for (const Tensor& t : element) out.push_back(t.clone());
  return out;
}

class MemoryCache final : public CacheStore {
 public:
  explicit MemoryCache(int64_t expected) : expected_(expected) {
    if (expected_ == 0) complete_ = 0;
  }
  std::optional<int64_t> complete() override {
    std::lock_guard<std::mutex> lock(mutex_);
    return complete_;
  }
  void get(int64_t i, Element& out) override {
    std::lock_guard<std::mutex> lock(mutex_);
    out = copy_of(*kept_[static_cast<size_t>(i)]);
  }
  void put(int64_t i, const Element& element) override {
    std::lock_guard<std::mutex> lock(mutex_);
    if (complete_) return;
    if (static_cast<size_t>(i) >= kept_.size()) kept_.resize(static_cast<size_t>(i) + 1);
    if (kept_[static_cast<size_t>(i)]) return;
    kept_[static_cast<size_t>(i)] = copy_of(element);
    if (++count_ == expected_) complete_ = expected_;
  }
  void finish(int64_t count) override {
    std::lock_guard<std::mutex> lock(mutex_);
    if (complete_) return;
    kept_.resize(static_cast<size_t>(count));
    for (const auto& element : kept_)
      TANDEM_CHECK(element.has_value(), "internal error: a cache pass ended with a hole");
    complete_ = count;
  }

 private:
  int64_t expected_;
  std::mutex mutex_;
  std::vector<std::optional<Element>> kept_;
  int64_t count_ = 0;
  std::optional<int64_t> complete_;
};

class CachedReader final : public SourceReader {
 public:
  CachedReader(std::unique_ptr<SourceReader> base, std::shared_ptr<CacheStore> store)
      : base_(std::move(base)), store_(std::move(store)) {}
  void read(int64_t index, Element& out) override {
    if (store_->complete()) {
      store_->get(index, out);
      return;
    }
    base_->read(index, out);
    store_->put(index, out);
  }

 private:
  std::unique_ptr<SourceReader> base_;
  std::shared_ptr<CacheStore> store_;
};

class CachedSource final : public Source {
 public:
  CachedSource(std::shared_ptr<const Source> base, std::shared_ptr<CacheStore> store,
               std::string what)
      : base_(std::move(base)), store_(std::move(store)), what_(std::move(what)) {}
  int64_t size() const override { return base_->size(); }
  bool cheap_random_access() const override { return base_->cheap_random_access(); }
  std::unique_ptr<SourceReader> reader() const override {
    return std::make_unique<CachedReader>(base_->reader(), store_);
  }
  std::vector<TensorSpec> element_spec() const override { return base_->element_spec(); }
  std::string describe() const override { return what_ + "(" + base_->describe() + ")"; }

 private:
  std::shared_ptr<const Source> base_;
  std::shared_ptr<CacheStore> store_;
  std::string what_;
};

/// Index mode: the input's indices, and its elements read through the cached source.
class CachedIndexIterator final : public ReadingIterator {
 public:
  CachedIndexIterator(std::shared_ptr<const Source> cached, std::unique_ptr<IteratorImpl> input)
      : ReadingIterator(std::move(cached)), input_(std::move(input)) {}
  bool next_index(int64_t& index) override { return input_->next_index(index); }
  bool next(Element& out) override {
    int64_t index;
    if (!input_->next_index(index)) return false;
    reader().read(index, out);
    return true;
  }
  int64_t skip(int64_t n) override { return input_->skip(n); }
  void save(IteratorState& state) const override { input_->save(state); }
  void restore(const IteratorState& state) override { input_->restore(state); }

 private:
  std::unique_ptr<IteratorImpl> input_;
};

/// Element mode: a pass reads the input (keeping what it reads when it started at the
/// beginning) or, once the cache is complete, the kept elements. The position is a count.
class CacheIterator final : public IteratorImpl {
 public:
  CacheIterator(const Node& node, uint64_t epoch, std::shared_ptr<CacheStore> store)
      : input_node_(node.input()),
        epoch_(epoch),
        store_(std::move(store)),
        position_entry_(node, "position") {
    start(0);
  }
  bool next(Element& out) override {
    if (cached_) {
      if (position_ >= *cached_) return false;
      store_->get(position_++, out);
      return true;
    }
    if (!input_->next(out)) {
      if (keeping_) store_->finish(position_);
      keeping_ = false;
      return false;
    }
    if (keeping_) store_->put(position_, out);
    ++position_;
    return true;
  }
  void save(IteratorState& state) const override {
    position_entry_.save(state, position_, /*input=*/nullptr);
  }
  void restore(const IteratorState& state) override {
    const int64_t position = position_entry_.read(state);
    TANDEM_CHECK(position >= 0, "iterator state: cache position ", position, " is negative");
    start(position);
  }

 private:
  /// Starts the pass at `position`: from the kept elements if the cache is complete, else from
  /// the input (kept only from the beginning: a pass entered in the middle is not all of it).
  void start(int64_t position) {
    cached_ = store_->complete();
    position_ = position;
    if (cached_) {
      TANDEM_CHECK(position <= *cached_, "iterator state: cache position ", position,
                   " is past the ", *cached_, " elements kept");
      input_.reset();
      return;
    }
    input_ = input_node_->make_iterator(epoch_);
    TANDEM_CHECK(input_->skip(position) == position, "iterator state: cache position ", position,
                 " is past the end of its input");
    keeping_ = position == 0;
  }

  NodePtr input_node_;
  uint64_t epoch_;
  std::shared_ptr<CacheStore> store_;
  SavedCounter position_entry_;
  std::unique_ptr<IteratorImpl> input_;
  std::optional<int64_t> cached_;  // the kept elements' count, when complete
  bool keeping_ = false;
  int64_t position_ = 0;
};

class CacheNode final : public Node {
 public:
  CacheNode(NodePtr input, std::string filename)
      : Node(std::move(input), "cache"), filename_(std::move(filename)) {
    const auto base = this->input()->source();
    const int64_t expected = base ? base->size() : -1;
    // The file's signature: the input pipeline's description (which names its source's size).
    std::string signature;
    for (const Node* n = this->input().get(); n != nullptr; n = n->input().get())
      signature = n->describe() + (signature.empty() ? "" : " -> ") + signature;
    store_ = filename_.empty() ? std::make_shared<MemoryCache>(expected)
                               : make_file_cache(filename_, signature, expected);
    if (base) cached_ = std::make_shared<CachedSource>(base, store_, describe());
  }
  std::string describe() const override {
    return filename_.empty() ? "cache" : "cache('" + filename_ + "')";
  }
  std::shared_ptr<const Source> source() const override { return cached_; }
  std::unique_ptr<IteratorImpl> make_iterator(uint64_t epoch) const override {
    if (cached_)
      return std::make_unique<CachedIndexIterator>(cached_, input()->make_iterator(epoch));
    return std::make_unique<CacheIterator>(*this, epoch, store_);
  }
  int64_t cardinality() const override { return input()->cardinality(); }
  // A new cache over the new input: what this one kept is not the new input's (a worker's
  // file cache over its share should be named per worker).
  NodePtr with_input(NodePtr input) const override {
    return std::make_shared<CacheNode>(std::move(input), filename_);
  }

 private:
  std::string filename_;
  std::shared_ptr<CacheStore> store_;
  std::shared_ptr<const Source> cached_;
};

}  // namespace

std::shared_ptr<const Node> make_cache_node(std::shared_ptr<const Node> input,
                                            std::string filename) {
  return std::make_shared<CacheNode>(std::move(input), std::move(filename));
}

}  // namespace tandem::data::detail
