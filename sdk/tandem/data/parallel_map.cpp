// map(fn, num_parallel_calls) over elements: the consumer reads a window of input elements in
// order, the pool maps them, and they are handed out in their input order. Saving recomputes
// the input's position at the consumer (the window runs ahead), as prefetch does.
#include <deque>
#include <exception>
#include <optional>
#include <utility>

#include "tandem/data/internal/iterators.h"
#include "tandem/data/internal/node.h"
#include "tandem/data/internal/worker_pool.h"

namespace tandem::data::detail {
namespace {

using MapFn = std::function<Element(Element)>;

class ParallelMapIterator final : public IteratorImpl {
 public:
  ParallelMapIterator(std::shared_ptr<const Node> input, uint64_t epoch,
                      std::shared_ptr<const MapFn> fn, int parallel, bool autotune)
      : input_node_(std::move(input)),
        epoch_(epoch),
        fn_(std::move(fn)),
        window_(2 * static_cast<size_t>(parallel)),
        input_(input_node_->make_iterator(epoch)),
        pool_(parallel),
        position_(input_node_, epoch, "map(num_parallel_calls)") {
    if (autotune) tuner_.emplace(parallel);
  }

  bool next(Element& out) override {
    if (ready_.empty() && !refill()) return false;
    Mapped front = std::move(ready_.front());
    ready_.pop_front();
    position_.consumed();
    // The function's exception for this element, in its place (the next call goes on with the
    // element after it, as without the pool).
    if (front.error) std::rethrow_exception(front.error);
    out = std::move(front.element);
    return true;
  }
  // Index mode (a batch gathers through the mapped source): the indices pass through.
  bool next_index(int64_t& index) override {
    TANDEM_CHECK(ready_.empty(), "internal error: map(num_parallel_calls) read both elements ",
                 "and indices");
    if (!input_->next_index(index)) return false;
    position_.consumed();
    return true;
  }
  int64_t skip(int64_t n) override {
    int64_t passed = 0;
    while (passed < n && !ready_.empty()) {
      ready_.pop_front();
      ++passed;
    }
    passed += input_->skip(n - passed);  // the function is pure: skipped elements need no call
    position_.consumed(passed);
    return passed;
  }
  void save(IteratorState& state) const override {
    if (!ready_.empty() || error_) {  // read ahead (or past an input error not raised yet):
                                      // recomputed at the consumer's position
      position_.save(state);
      return;
    }
    IteratorState input_state;  // the input is at the consumer's position
    input_->save(input_state);
    position_.saved(state, std::move(input_state));
  }
  void restore(const IteratorState& state) override {
    ready_.clear();
    error_ = nullptr;
    input_ = input_node_->make_iterator(epoch_);
    input_->restore(state);
    position_.restored(state);
  }

 private:
  /// Reads up to a window of input elements and maps them on the pool; false at the end.
  bool refill() {
    // An input error surfaces after the elements read before it, as it would without the pool.
    if (error_) {
      position_.consumed();  // the input passed the element that failed
      std::rethrow_exception(std::exchange(error_, nullptr));
    }
    std::vector<Element> window;
    Element element;
    try {
      while (window.size() < window_ && input_->next(element)) window.push_back(std::move(element));
    } catch (...) {
      if (window.empty()) throw;
      error_ = std::current_exception();
    }
    if (window.empty()) return false;
    std::vector<Mapped> mapped(window.size());
    RoundTimer timer(tuner_ ? &*tuner_ : nullptr, pool_.workers(), last_start_);
    pool_.run(
        static_cast<int64_t>(window.size()),
        [&](int64_t k, int worker) {
          const RoundTimer::Task task(timer, worker);
          Mapped& m = mapped[static_cast<size_t>(k)];
          try {
            m.element = (*fn_)(std::move(window[static_cast<size_t>(k)]));
          } catch (...) {
            m.error = std::current_exception();
          }
        },
        tuner_ ? tuner_->workers() : 0);
    timer.finish(static_cast<int64_t>(window.size()));
    for (Mapped& m : mapped) ready_.push_back(std::move(m));
    return true;
  }

  std::shared_ptr<const Node> input_node_;
  uint64_t epoch_;
  std::shared_ptr<const MapFn> fn_;
  size_t window_;
  std::unique_ptr<IteratorImpl> input_;
  WorkerPool pool_;
  std::optional<ParallelismTuner> tuner_;  // kAutotune
  RoundTimer::Clock::time_point last_start_{};
  struct Mapped {
    Element element;
    std::exception_ptr error;
  };
  std::deque<Mapped> ready_;
  std::exception_ptr error_;
  ConsumerPosition position_;
};

}  // namespace

std::unique_ptr<IteratorImpl> make_parallel_map_iterator(std::shared_ptr<const Node> input,
                                                         uint64_t epoch,
                                                         std::shared_ptr<const MapFn> fn,
                                                         int parallel, bool autotune) {
  return std::make_unique<ParallelMapIterator>(std::move(input), epoch, std::move(fn), parallel,
                                               autotune);
}

}  // namespace tandem::data::detail
