// The counting pass-through nodes: take, skip and shard. Each iterator's position is one count
// (CountingIterator, internal/iterators.h) beside its input's: "taken", "skipped", "position".
#include <algorithm>
#include <limits>
#include <string>

#include "tandem/data/internal/iterators.h"
#include "tandem/data/internal/node.h"

namespace tandem::data::detail {
namespace {

using NodePtr = std::shared_ptr<const Node>;

/// counted_: the elements taken so far.
class TakeIterator final : public CountingIterator<TakeIterator> {
 public:
  TakeIterator(const Node& node, std::unique_ptr<IteratorImpl> input, int64_t count)
      : CountingIterator(node, "taken", std::move(input)), count_(count) {}
  template <typename Pull>
  bool step(Pull&& pull) {
    if (count_ >= 0 && counted_ >= count_) return false;
    if (!pull(*input_)) return false;
    ++counted_;
    return true;
  }
  int64_t skip(int64_t n) override {
    const int64_t passed = input_->skip(count_ < 0 ? n : std::min(n, count_ - counted_));
    counted_ += passed;
    return passed;
  }

 private:
  int64_t count_;
};

/// counted_: the elements of the prefix skipped so far.
class SkipIterator final : public CountingIterator<SkipIterator> {
 public:
  SkipIterator(const Node& node, std::unique_ptr<IteratorImpl> input, int64_t count)
      : CountingIterator(node, "skipped", std::move(input)),
        count_(count < 0 ? std::numeric_limits<int64_t>::max() : count) {}
  template <typename Pull>
  bool step(Pull&& pull) {
    return skip_prefix() && pull(*input_);
  }
  int64_t skip(int64_t n) override { return skip_prefix() ? input_->skip(n) : 0; }

 private:
  /// Passes the first count elements once; false while the input ended inside them.
  bool skip_prefix() {
    if (counted_ < count_) counted_ += input_->skip(count_ - counted_);
    return counted_ >= count_;
  }

  int64_t count_;
};

/// counted_: the input elements consumed so far (saved as "position").
class ShardIterator final : public CountingIterator<ShardIterator> {
 public:
  ShardIterator(const Node& node, std::unique_ptr<IteratorImpl> input, int64_t num_shards,
                int64_t index, bool worker)
      : CountingIterator(node, "position", std::move(input)),
        num_shards_(num_shards),
        index_(index),
        worker_(worker) {}
  // Whole rounds: each element this shard keeps consumes the W input elements of its round
  // (passing index_ before it and the rest after it). So between elements every shard of the
  // same input has consumed the same count, and a position saved by one shard (one worker) is
  // valid for every other.
  template <typename Pull>
  bool step(Pull&& pull) {
    const int64_t passed = input_->skip(index_);
    counted_ += passed;
    if (passed < index_ || !pull(*input_)) return false;
    ++counted_;
    counted_ += input_->skip(num_shards_ - index_ - 1);
    return true;
  }
  int64_t skip(int64_t n) override {
    for (int64_t i = 0; i < n; ++i) {
      const int64_t passed = input_->skip(num_shards_);
      counted_ += passed;
      if (passed <= index_) return i;  // the round ended before this shard's element
      if (passed < num_shards_) return i + 1;
    }
    return n;
  }
  // The worker shard's position is its input's alone (see make_worker_shard_node).
  void save(IteratorState& state) const override {
    if (worker_) {
      input_->save(state);
    } else {
      CountingIterator::save(state);
    }
  }
  void restore(const IteratorState& state) override {
    if (worker_) {
      input_->restore(state);
    } else {
      CountingIterator::restore(state);
    }
  }

 private:
  int64_t num_shards_;
  int64_t index_;
  bool worker_;
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
    if (n == kInfiniteCardinality) return count_;
    return n < 0 ? n : std::min(n, count_);
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
  ShardNode(NodePtr input, int64_t num_shards, int64_t index, bool worker)
      : Node(std::move(input), "shard", /*adds_depth=*/!worker),
        num_shards_(num_shards),
        index_(index),
        worker_(worker) {}
  std::string describe() const override {
    return "shard(" + std::to_string(num_shards_) + ", " + std::to_string(index_) + ")";
  }
  // Positions are whole rounds (see ShardIterator): the same state serves every index.
  std::string signature_text() const override {
    return worker_ ? std::string() : "shard(" + std::to_string(num_shards_) + ")";
  }
  std::shared_ptr<const Source> source() const override { return input()->source(); }
  std::unique_ptr<IteratorImpl> make_iterator(uint64_t epoch) const override {
    return std::make_unique<ShardIterator>(*this, input()->make_iterator(epoch), num_shards_,
                                           index_, worker_);
  }
  int64_t cardinality() const override {
    const int64_t n = input()->cardinality();
    if (n < 0) return n;
    return n <= index_ ? 0 : (n - index_ + num_shards_ - 1) / num_shards_;
  }
  NodePtr with_input(NodePtr input) const override {
    return std::make_shared<ShardNode>(std::move(input), num_shards_, index_, worker_);
  }

 private:
  int64_t num_shards_;
  int64_t index_;
  bool worker_;
};

}  // namespace

std::shared_ptr<const Node> make_take_node(std::shared_ptr<const Node> input, int64_t count) {
  return std::make_shared<TakeNode>(std::move(input), count);
}
std::shared_ptr<const Node> make_skip_node(std::shared_ptr<const Node> input, int64_t count) {
  return std::make_shared<SkipNode>(std::move(input), count);
}
std::shared_ptr<const Node> make_shard_node(std::shared_ptr<const Node> input, int64_t num_shards,
                                            int64_t index) {
  return std::make_shared<ShardNode>(std::move(input), num_shards, index, /*worker=*/false);
}
std::shared_ptr<const Node> make_worker_shard_node(std::shared_ptr<const Node> input,
                                                   int64_t num_workers, int64_t worker_index) {
  return std::make_shared<ShardNode>(std::move(input), num_workers, worker_index, /*worker=*/true);
}

}  // namespace tandem::data::detail
