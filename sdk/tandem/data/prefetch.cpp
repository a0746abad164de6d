// prefetch(n): a background thread runs the input pipeline and fills a bounded queue; the
// consumer pops in order. Saving recomputes the input's position at the consumer (the thread
// runs ahead by the queued elements) on a private copy of the input.
#include <condition_variable>
#include <deque>
#include <exception>
#include <mutex>
#include <optional>
#include <thread>

#include "tandem/data/internal/iterators.h"
#include "tandem/data/internal/node.h"

namespace tandem::data::detail {
namespace {

class PrefetchIterator final : public IteratorImpl {
 public:
  PrefetchIterator(const Node& node, uint64_t epoch, int64_t buffer_size)
      : input_node_(node.input()),
        epoch_(epoch),
        capacity_(static_cast<size_t>(buffer_size)),
        input_(input_node_->make_iterator(epoch)),
        position_(input_node_, epoch, "prefetch") {}

  // Stops the producer even mid-epoch: it finishes the element it is making and exits.
  ~PrefetchIterator() override { stop(); }

  bool next(Element& out) override {
    if (!started_) {
      started_ = true;
      producer_ = std::thread([this] { produce(); });
    }
    std::unique_lock<std::mutex> lock(mutex_);
    not_empty_.wait(lock, [&] { return !queue_.empty() || producer_done_; });
    if (!queue_.empty()) {
      out = std::move(queue_.front());
      queue_.pop_front();
      position_.consumed();
      not_full_.notify_one();
      return true;
    }
    // The producer's exception surfaces after the elements it made before failing.
    if (error_) std::rethrow_exception(error_);
    return false;
  }

  // input_ runs ahead of the consumer (and is in use by the producer thread): the position is
  // recomputed at the consumer's.
  void save(IteratorState& state) const override { position_.save(state); }

  void restore(const IteratorState& state) override {
    stop();
    queue_.clear();
    producer_done_ = false;
    stop_requested_ = false;
    error_ = nullptr;
    started_ = false;
    input_ = input_node_->make_iterator(epoch_);
    input_->restore(state);
    position_.restored(state);
  }

 private:
  void produce() {
    for (;;) {
      {
        std::unique_lock<std::mutex> lock(mutex_);
        not_full_.wait(lock, [&] { return stop_requested_ || queue_.size() < capacity_; });
        if (stop_requested_) return;
      }
      Element element;
      bool ok = false;
      try {
        ok = input_->next(element);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mutex_);
        error_ = std::current_exception();
        producer_done_ = true;
        not_empty_.notify_all();
        return;
      }
      std::lock_guard<std::mutex> lock(mutex_);
      if (!ok) {
        producer_done_ = true;
        not_empty_.notify_all();
        return;
      }
      queue_.push_back(std::move(element));
      not_empty_.notify_one();
    }
  }

  void stop() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_requested_ = true;
    }
    not_full_.notify_all();
    if (producer_.joinable()) producer_.join();
  }

  std::shared_ptr<const Node> input_node_;
  uint64_t epoch_;
  size_t capacity_;
  std::unique_ptr<IteratorImpl> input_;  // run by the producer thread once started

  std::thread producer_;
  bool started_ = false;
  std::mutex mutex_;
  std::condition_variable not_empty_;
  std::condition_variable not_full_;
  std::deque<Element> queue_;
  bool producer_done_ = false;
  bool stop_requested_ = false;
  std::exception_ptr error_;

  ConsumerPosition position_;  // only the consumer thread touches it
};

class PrefetchNode final : public Node {
 public:
  PrefetchNode(std::shared_ptr<const Node> input, int64_t buffer_size)
      : Node(std::move(input), "prefetch"), buffer_size_(buffer_size) {}
  std::string describe() const override { return "prefetch(" + std::to_string(buffer_size_) + ")"; }
  std::unique_ptr<IteratorImpl> make_iterator(uint64_t epoch) const override {
    return std::make_unique<PrefetchIterator>(*this, epoch, buffer_size_);
  }
  int64_t cardinality() const override { return input()->cardinality(); }
  std::shared_ptr<const Node> with_input(std::shared_ptr<const Node> input) const override {
    return std::make_shared<PrefetchNode>(std::move(input), buffer_size_);
  }

 private:
  int64_t buffer_size_;
};

}  // namespace

std::shared_ptr<const Node> make_prefetch_node(std::shared_ptr<const Node> input,
                                               int64_t buffer_size) {
  return std::make_shared<PrefetchNode>(std::move(input), buffer_size);
}

}  // namespace tandem::data::detail
