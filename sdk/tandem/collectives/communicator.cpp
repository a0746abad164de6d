// Communicator's public entry points (call counting, then the backend), the "not supported"
// defaults, ReduceOp names and the collective timeout setting.
#include "tandem/collectives/communicator.h"

#include <chrono>
#include <cstdlib>
#include <string>

#include "tandem/core/spans.h"

namespace tandem {

std::string_view reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return "sum";
    case ReduceOp::kMean:
      return "mean";
    case ReduceOp::kMax:
      return "max";
  }
  return "?";
}

std::ostream& operator<<(std::ostream& out, ReduceOp op) { return out << reduce_op_name(op); }

}  // namespace tandem

namespace tandem::collectives {

namespace {

constexpr int64_t kDefaultTimeoutMs = 300 * 1000;

int64_t timeout_from_env_ms() {
  const char* text = std::getenv("TANDEM_COLLECTIVE_TIMEOUT");
  if (text == nullptr || *text == '\0') return kDefaultTimeoutMs;
  char* end = nullptr;
  const double seconds = std::strtod(text, &end);
  TANDEM_CHECK(end != text && *end == '\0' && seconds > 0, "TANDEM_COLLECTIVE_TIMEOUT=\"", text,
               "\" is not a positive number of seconds (e.g. 300 or 2.5)");
  return static_cast<int64_t>(seconds * 1000.0 + 0.5);
}

// -1 until set_collective_timeout is called; then the override in milliseconds.
std::atomic<int64_t> g_timeout_override_ms{-1};

}  // namespace

std::chrono::milliseconds collective_timeout() {
  const int64_t overridden = g_timeout_override_ms.load(std::memory_order_relaxed);
  if (overridden >= 0) return std::chrono::milliseconds(overridden);
  static const int64_t from_env = timeout_from_env_ms();
  return std::chrono::milliseconds(from_env);
}

std::chrono::milliseconds set_collective_timeout(std::chrono::milliseconds timeout) {
  TANDEM_CHECK(timeout.count() > 0, "set_collective_timeout: the timeout must be positive, got ",
               timeout.count(), " ms");
  const std::chrono::milliseconds previous = collective_timeout();
  g_timeout_override_ms.store(timeout.count(), std::memory_order_relaxed);
  return previous;
}

std::shared_ptr<Work> completed_work() {
  static const std::shared_ptr<Work> work = std::make_shared<Work>();
  return work;
}

namespace {
/// Adds the calling thread's time inside collectives during its lifetime (the backends' spans,
/// profile::collective_ns) to a counter, also when the call raises: the communicator reads the
/// one measure of collective time instead of timing the call again.
class TimeInside {
 public:
  explicit TimeInside(std::atomic<uint64_t>& total)
      : total_(total), start_(profile::collective_ns()) {}
  ~TimeInside() {
    total_.fetch_add(static_cast<uint64_t>(profile::collective_ns() - start_),
                     std::memory_order_relaxed);
  }
  TimeInside(const TimeInside&) = delete;
  TimeInside& operator=(const TimeInside&) = delete;

 private:
  std::atomic<uint64_t>& total_;
  int64_t start_;
};
}  // namespace

std::shared_ptr<Work> Communicator::all_reduce(std::vector<Tensor>& tensors, ReduceOp op) {
  all_reduce_calls_.fetch_add(1, std::memory_order_relaxed);
  uint64_t bytes = 0;
  for (const Tensor& t : tensors) bytes += t.defined() ? t.nbytes() : 0;
  bytes_all_reduced_.fetch_add(bytes, std::memory_order_relaxed);
  const TimeInside timer(all_reduce_nanoseconds_);
  return all_reduce_impl(tensors, tensors, op);
}

std::shared_ptr<Work> Communicator::all_reduce(const std::vector<Tensor>& inputs,
                                               std::vector<Tensor>& outputs, ReduceOp op) {
  all_reduce_calls_.fetch_add(1, std::memory_order_relaxed);
  uint64_t bytes = 0;
  for (const Tensor& t : inputs) bytes += t.defined() ? t.nbytes() : 0;
  bytes_all_reduced_.fetch_add(bytes, std::memory_order_relaxed);
  const TimeInside timer(all_reduce_nanoseconds_);
  return all_reduce_impl(inputs, outputs, op);
}

std::shared_ptr<Work> Communicator::all_gather(std::vector<Tensor>& outputs, const Tensor& input) {
  all_gather_calls_.fetch_add(1, std::memory_order_relaxed);
  return all_gather_impl(outputs, input);
}

std::shared_ptr<Work> Communicator::broadcast(std::vector<Tensor>& tensors, int root) {
  broadcast_calls_.fetch_add(1, std::memory_order_relaxed);
  return broadcast_impl(tensors, root);
}

std::shared_ptr<Work> Communicator::reduce_scatter(Tensor& output, const Tensor& input,
                                                   ReduceOp op) {
  reduce_scatter_calls_.fetch_add(1, std::memory_order_relaxed);
  return reduce_scatter_impl(output, input, op);
}

std::shared_ptr<Work> Communicator::reduce_scatter(const Tensor& input, Tensor& output,
                                                   std::span<const int64_t> offsets, ReduceOp op) {
  reduce_scatter_calls_.fetch_add(1, std::memory_order_relaxed);
  return reduce_scatter_ranges_impl(input, output, offsets, op);
}

std::shared_ptr<Work> Communicator::all_gather(Tensor& buffer, std::span<const int64_t> offsets) {
  all_gather_calls_.fetch_add(1, std::memory_order_relaxed);
  return all_gather_ranges_impl(buffer, offsets);
}

std::shared_ptr<Work> Communicator::barrier() {
  barrier_calls_.fetch_add(1, std::memory_order_relaxed);
  return barrier_impl();
}

CollectiveStats Communicator::stats() const {
  CollectiveStats s;
  s.all_reduce = all_reduce_calls_.load(std::memory_order_relaxed);
  s.all_gather = all_gather_calls_.load(std::memory_order_relaxed);
  s.broadcast = broadcast_calls_.load(std::memory_order_relaxed);
  s.reduce_scatter = reduce_scatter_calls_.load(std::memory_order_relaxed);
  s.barrier = barrier_calls_.load(std::memory_order_relaxed);
  s.bytes_all_reduced = bytes_all_reduced_.load(std::memory_order_relaxed);
  s.all_reduce_seconds =
      static_cast<double>(all_reduce_nanoseconds_.load(std::memory_order_relaxed)) * 1e-9;
  return s;
}

void Communicator::throw_unsupported(std::string_view operation) const {
  TANDEM_THROW("backend ", name(), " does not support ", operation);
}

std::shared_ptr<Work> Communicator::all_reduce_impl(const std::vector<Tensor>&,
                                                    const std::vector<Tensor>&, ReduceOp) {
  throw_unsupported("all_reduce");
}
std::shared_ptr<Work> Communicator::all_gather_impl(std::vector<Tensor>&, const Tensor&) {
  throw_unsupported("all_gather");
}
std::shared_ptr<Work> Communicator::broadcast_impl(std::vector<Tensor>&, int) {
  throw_unsupported("broadcast");
}
std::shared_ptr<Work> Communicator::reduce_scatter_impl(Tensor&, const Tensor&, ReduceOp) {
  throw_unsupported("reduce_scatter");
}
std::shared_ptr<Work> Communicator::reduce_scatter_ranges_impl(const Tensor&, Tensor&,
                                                               std::span<const int64_t>, ReduceOp) {
  throw_unsupported("reduce_scatter over flat ranges");
}
std::shared_ptr<Work> Communicator::all_gather_ranges_impl(Tensor&, std::span<const int64_t>) {
  throw_unsupported("all_gather over flat ranges");
}
std::shared_ptr<Work> Communicator::barrier_impl() { throw_unsupported("barrier"); }

}  // namespace tandem::collectives
