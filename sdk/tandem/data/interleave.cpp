// interleave(fn, cycle_length, block_length, num_parallel_calls): tf.data's interleave order,
// the open datasets read ahead on a WorkerPool when num_parallel_calls > 1. A saved position is
// the input's, the cycle's (turn, place in the block), and each open dataset's position with
// the ordinal of the input element that made it.
#include <algorithm>
#include <deque>
#include <exception>
#include <map>
#include <optional>
#include <utility>

#include "tandem/data/internal/iterators.h"
#include "tandem/data/internal/node.h"
#include "tandem/data/internal/worker_pool.h"

namespace tandem::data::detail {
namespace {

using NodePtr = std::shared_ptr<const Node>;
using InterleaveFn = std::function<Dataset(const Element&)>;

/// One open dataset of the cycle.
struct Slot {
  int64_t ordinal = -1;  // the input element that made it; -1: the slot is empty
  NodePtr node;
  std::unique_ptr<IteratorImpl> iterator;
  // Read ahead (parallel only): elements not yet handed out, then an error or the end.
  std::deque<Element> ready;
  std::exception_ptr error;
  bool ended = false;
  std::optional<ConsumerPosition> position;  // the iterator's position at the consumer
};

class InterleaveIterator final : public IteratorImpl {
 public:
  InterleaveIterator(const Node& node, uint64_t epoch, std::shared_ptr<const InterleaveFn> fn,
                     int64_t cycle_length, int64_t block_length, int parallel)
      : input_node_(node.input()),
        prefix_(node.state_prefix()),
        epoch_(epoch),
        fn_(std::move(fn)),
        block_length_(block_length),
        slots_(static_cast<size_t>(cycle_length)),
        input_(input_node_->make_iterator(epoch)) {
    if (parallel > 1) pool_.emplace(parallel);
  }

  // tf.data's loop: an empty slot opens the next input element and reads from it at once; an
  // open one that ends is closed and the turn passes on.
  bool next(Element& out) override {
    while (!end_of_input_ || open_ > 0) {
      Slot& slot = slots_[cycle_index_];
      if (slot.ordinal >= 0) {
        if (pull(slot, out)) {
          if (++block_index_ == block_length_) advance();
          return true;
        }
        close(slot);
        advance();
      } else if (!end_of_input_) {
        Element element;
        if (input_->next(element)) {
          open(slot, consumed_++, element);
        } else {
          end_of_input_ = true;
        }
      } else {
        advance();
      }
    }
    return false;
  }

  void save(IteratorState& state) const override {
    state.set(prefix_ + "cycle",
              {static_cast<int64_t>(cycle_index_), block_index_, consumed_, end_of_input_ ? 1 : 0});
    IteratorState::Array ordinals;
    for (const Slot& slot : slots_) ordinals.push_back(slot.ordinal);
    state.set(prefix_ + "slots", std::move(ordinals));
    for (size_t k = 0; k < slots_.size(); ++k) {
      const Slot& slot = slots_[k];
      if (slot.ordinal < 0) continue;
      IteratorState inner;
      if (!slot.ready.empty() || slot.error) {
        // Read ahead (or past an error not raised yet): recomputed at the consumer's position.
        slot.position->save(inner);
      } else {
        IteratorState at;
        slot.iterator->save(at);
        if (slot.position) {
          slot.position->saved(inner, std::move(at));
        } else {
          inner = std::move(at);
        }
      }
      const std::string slot_prefix = prefix_ + "slot" + std::to_string(k) + "/";
      for (const auto& [name, values] : inner.entries()) state.set(slot_prefix + name, values);
    }
    input_->save(state);
  }

  void restore(const IteratorState& state) override {
    const IteratorState::Array& cycle = state.get(prefix_ + "cycle");
    const IteratorState::Array& ordinals = state.get(prefix_ + "slots");
    TANDEM_CHECK(cycle.size() == 4 && ordinals.size() == slots_.size(), "iterator state: ", prefix_,
                 "cycle/slots do not describe an interleave of cycle_length ", slots_.size());
    TANDEM_CHECK(cycle[0] >= 0 && cycle[0] < static_cast<int64_t>(slots_.size()) && cycle[1] >= 0 &&
                     cycle[1] < block_length_ && cycle[2] >= 0,
                 "iterator state: ", prefix_, "cycle holds an impossible position");
    input_ = input_node_->make_iterator(epoch_);
    input_->restore(state);
    cycle_index_ = static_cast<size_t>(cycle[0]);
    block_index_ = cycle[1];
    consumed_ = cycle[2];
    end_of_input_ = cycle[3] != 0;

    // The input elements that made the open datasets, read again in ascending order.
    std::map<int64_t, size_t> wanted;  // ordinal -> slot
    for (size_t k = 0; k < slots_.size(); ++k) {
      slots_[k] = Slot{};
      if (ordinals[k] < 0) continue;
      TANDEM_CHECK(ordinals[k] < consumed_ && wanted.emplace(ordinals[k], k).second,
                   "iterator state: ", prefix_, "slots holds an impossible input element ",
                   ordinals[k]);
    }
    open_ = 0;
    std::unique_ptr<IteratorImpl> replay = input_node_->make_iterator(epoch_);
    int64_t at = 0;
    for (const auto& [ordinal, k] : wanted) {
      Element element;
      TANDEM_CHECK(replay->skip(ordinal - at) == ordinal - at && replay->next(element),
                   "interleave: the input ended before its element ", ordinal,
                   " while restoring; is the input deterministic?");
      at = ordinal + 1;
      Slot& slot = slots_[k];
      open(slot, ordinal, element);
      const std::string slot_prefix = prefix_ + "slot" + std::to_string(k) + "/";
      IteratorState::Entries entries;
      for (const auto& [name, values] : state.entries())
        if (name.starts_with(slot_prefix))
          entries.emplace_back(name.substr(slot_prefix.size()), values);
      const IteratorState inner(std::move(entries));
      slot.iterator->restore(inner);
      if (slot.position) slot.position->restored(inner);
    }
  }

 private:
  void advance() {
    block_index_ = 0;
    cycle_index_ = (cycle_index_ + 1) % slots_.size();
  }

  void open(Slot& slot, int64_t ordinal, const Element& element) {
    const Dataset dataset = (*fn_)(element);
    slot.ordinal = ordinal;
    slot.node = dataset.node();
    slot.iterator = slot.node->make_iterator(epoch_);
    if (pool_) slot.position.emplace(slot.node, epoch_, "interleave(num_parallel_calls)");
    ++open_;
  }

  void close(Slot& slot) {
    slot = Slot{};
    --open_;
  }

  /// The slot's next element; false at its end.
  bool pull(Slot& slot, Element& out) {
    if (!pool_) return slot.iterator->next(out);
    if (slot.ready.empty() && !slot.error && !slot.ended) fill();
    if (!slot.ready.empty()) {
      out = std::move(slot.ready.front());
      slot.ready.pop_front();
      slot.position->consumed();
      return true;
    }
    if (slot.error) {
      slot.position->consumed();  // the element that failed is passed, as without the pool
      std::rethrow_exception(std::exchange(slot.error, nullptr));
    }
    return false;
  }

  /// Reads a block ahead from every open slot that has nothing ready, in parallel.
  void fill() {
    std::vector<Slot*> empty;
    for (Slot& slot : slots_)
      if (slot.ordinal >= 0 && slot.ready.empty() && !slot.error && !slot.ended)
        empty.push_back(&slot);
    pool_->run(static_cast<int64_t>(empty.size()), [&](int64_t k, int) {
      Slot& slot = *empty[static_cast<size_t>(k)];
      try {
        Element element;
        while (static_cast<int64_t>(slot.ready.size()) < block_length_) {
          if (!slot.iterator->next(element)) {
            slot.ended = true;
            break;
          }
          slot.ready.push_back(std::move(element));
        }
      } catch (...) {
        slot.error = std::current_exception();
      }
    });
  }

  NodePtr input_node_;
  std::string prefix_;
  uint64_t epoch_;
  std::shared_ptr<const InterleaveFn> fn_;
  int64_t block_length_;
  std::vector<Slot> slots_;
  std::unique_ptr<IteratorImpl> input_;
  std::optional<WorkerPool> pool_;
  size_t cycle_index_ = 0;
  int64_t block_index_ = 0;
  int64_t consumed_ = 0;  // input elements read
  int64_t open_ = 0;      // slots open
  bool end_of_input_ = false;
};

class InterleaveNode final : public Node {
 public:
  InterleaveNode(NodePtr input, std::shared_ptr<const InterleaveFn> fn, int64_t cycle_length,
                 int64_t block_length, int parallel)
      : Node(std::move(input), "interleave"),
        fn_(std::move(fn)),
        cycle_length_(cycle_length),
        block_length_(block_length),
        parallel_(parallel) {}
  std::string describe() const override {
    std::string text = signature_text();
    if (parallel_ > 1)
      text.insert(text.size() - 1, ", num_parallel_calls=" + std::to_string(parallel_));
    return text;
  }
  // A position saved with one parallelism restores with another.
  std::string signature_text() const override {
    return "interleave(cycle_length=" + std::to_string(cycle_length_) +
           ", block_length=" + std::to_string(block_length_) + ")";
  }
  std::unique_ptr<IteratorImpl> make_iterator(uint64_t epoch) const override {
    return std::make_unique<InterleaveIterator>(*this, epoch, fn_, cycle_length_, block_length_,
                                                parallel_);
  }
  int64_t cardinality() const override {
    return input()->cardinality() == 0 ? 0 : kUnknownCardinality;
  }
  std::vector<TensorSpec> element_spec() const override {
    Element element;
    TANDEM_CHECK(input()->make_iterator(0)->next(element),
                 "element_spec of an interleave over an empty dataset is unknown");
    return (*fn_)(element).element_spec();
  }
  NodePtr with_input(NodePtr input) const override {
    return std::make_shared<InterleaveNode>(std::move(input), fn_, cycle_length_, block_length_,
                                            parallel_);
  }

 private:
  std::shared_ptr<const InterleaveFn> fn_;
  int64_t cycle_length_;
  int64_t block_length_;
  int parallel_;
};

}  // namespace

std::shared_ptr<const Node> make_interleave_node(std::shared_ptr<const Node> input,
                                                 std::function<Dataset(const Element&)> fn,
                                                 int64_t cycle_length, int64_t block_length,
                                                 int parallel) {
  return std::make_shared<InterleaveNode>(std::move(input),
                                          std::make_shared<const InterleaveFn>(std::move(fn)),
                                          cycle_length, block_length, parallel);
}

}  // namespace tandem::data::detail
