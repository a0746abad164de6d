// cache(): the first complete pass over the input is kept in memory and later passes read it
// instead of the input. Over a random-access input (index mode) each element is kept by its
// index when first read, so a shuffle above the cache still moves indices; otherwise the
// elements of a pass are kept in order and published when the pass ends.
#include <mutex>
#include <optional>
#include <utility>

#include "tandem/data/internal/iterators.h"
#include "tandem/data/internal/node.h"

namespace tandem::data::detail {
namespace {

using NodePtr = std::shared_ptr<const Node>;

/// Copies of the cached tensors: a consumer may write into what it is given.
Element copy_of(const Element& element) {
  Element out;
  out.reserve(element.size());
  for (const Tensor& t : element) out.push_back(t.clone());
  return out;
}

/// What the copies of one cache() share.
struct CacheStore {
  std::mutex mutex;
  std::vector<std::optional<Element>> by_index;  // index mode
  std::optional<std::vector<Element>> pass;      // element mode: a complete pass, once there is
};

class CachedReader final : public SourceReader {
 public:
  CachedReader(std::unique_ptr<SourceReader> base, std::shared_ptr<CacheStore> store)
      : base_(std::move(base)), store_(std::move(store)) {}
  void read(int64_t index, Element& out) override {
    const auto i = static_cast<size_t>(index);
    {
      std::lock_guard<std::mutex> lock(store_->mutex);
      if (i < store_->by_index.size() && store_->by_index[i]) {
        out = copy_of(*store_->by_index[i]);
        return;
      }
    }
    base_->read(index, out);  // outside the lock: readers on other threads go on
    std::lock_guard<std::mutex> lock(store_->mutex);
    if (i < store_->by_index.size() && !store_->by_index[i]) store_->by_index[i] = copy_of(out);
  }

 private:
  std::unique_ptr<SourceReader> base_;
  std::shared_ptr<CacheStore> store_;
};

class CachedSource final : public Source {
 public:
  CachedSource(std::shared_ptr<const Source> base, std::shared_ptr<CacheStore> store)
      : base_(std::move(base)), store_(std::move(store)) {
    store_->by_index.resize(static_cast<size_t>(base_->size()));
  }
  int64_t size() const override { return base_->size(); }
  bool cheap_random_access() const override { return base_->cheap_random_access(); }
  std::unique_ptr<SourceReader> reader() const override {
    return std::make_unique<CachedReader>(base_->reader(), store_);
  }
  std::vector<TensorSpec> element_spec() const override { return base_->element_spec(); }
  std::string describe() const override { return "cache(" + base_->describe() + ")"; }

 private:
  std::shared_ptr<const Source> base_;
  std::shared_ptr<CacheStore> store_;
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
/// beginning) or, once a pass completed, the kept elements. The position is a count.
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
      if (position_ >= static_cast<int64_t>(cached_->size())) return false;
      out = copy_of((*cached_)[static_cast<size_t>(position_++)]);
      return true;
    }
    if (!input_->next(out)) {
      if (keeping_) {
        std::lock_guard<std::mutex> lock(store_->mutex);
        if (!store_->pass) store_->pass = std::move(kept_);
        keeping_ = false;
      }
      return false;
    }
    ++position_;
    if (keeping_) kept_.push_back(copy_of(out));
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
  /// Starts the pass at `position`: from the kept elements if a pass completed, else from the
  /// input (kept only from the beginning: a pass entered in the middle is not all of it).
  void start(int64_t position) {
    {
      std::lock_guard<std::mutex> lock(store_->mutex);
      if (store_->pass) cached_ = &*store_->pass;  // never replaced once set
    }
    position_ = position;
    kept_.clear();
    if (cached_) {
      TANDEM_CHECK(position <= static_cast<int64_t>(cached_->size()), "iterator state: cache ",
                   "position ", position, " is past the ", cached_->size(), " elements kept");
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
  const std::vector<Element>* cached_ = nullptr;
  std::vector<Element> kept_;
  bool keeping_ = false;
  int64_t position_ = 0;
};

class CacheNode final : public Node {
 public:
  explicit CacheNode(NodePtr input)
      : Node(std::move(input), "cache"), store_(std::make_shared<CacheStore>()) {
    if (auto base = this->input()->source()) cached_ = std::make_shared<CachedSource>(base, store_);
  }
  std::string describe() const override { return "cache"; }
  std::shared_ptr<const Source> source() const override { return cached_; }
  std::unique_ptr<IteratorImpl> make_iterator(uint64_t epoch) const override {
    if (cached_)
      return std::make_unique<CachedIndexIterator>(cached_, input()->make_iterator(epoch));
    return std::make_unique<CacheIterator>(*this, epoch, store_);
  }
  int64_t cardinality() const override { return input()->cardinality(); }
  // A new cache over the new input: what the old one kept is not the new input's.
  NodePtr with_input(NodePtr input) const override {
    return std::make_shared<CacheNode>(std::move(input));
  }

 private:
  std::shared_ptr<CacheStore> store_;
  std::shared_ptr<const Source> cached_;
};

}  // namespace

std::shared_ptr<const Node> make_cache_node(std::shared_ptr<const Node> input) {
  return std::make_shared<CacheNode>(std::move(input));
}

}  // namespace tandem::data::detail
