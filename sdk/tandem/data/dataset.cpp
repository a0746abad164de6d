// Dataset and Iterator (the public handles), the node and iterator base classes, and the
// row stacker that batch and the sources' gathers share.
#include "tandem/data/dataset.h"

#include <algorithm>
#include <cstring>
#include <sstream>

#include "tandem/core/threading.h"
#include "tandem/data/internal/node.h"

namespace tandem::data {
namespace detail {

// ---- shapes ----------------------------------------------------------------------------------

Shape prepend_dim(int64_t rows, const Shape& row_shape) {
  std::vector<int64_t> dims;
  dims.reserve(row_shape.dims().size() + 1);
  dims.push_back(rows);
  dims.insert(dims.end(), row_shape.begin(), row_shape.end());
  return Shape(std::move(dims));
}

Shape drop_first_dim(const Shape& shape) {
  TANDEM_CHECK(shape.rank() >= 1, "expected a tensor of rank >= 1, got shape ", shape);
  return Shape(std::vector<int64_t>(shape.begin() + 1, shape.end()));
}

// ---- Stacker ---------------------------------------------------------------------------------

void Stacker::start(const Element& first, int64_t capacity) {
  TANDEM_CHECK(capacity >= 1, "Stacker: capacity must be positive, got ", capacity);
  TANDEM_CHECK(!first.empty(), "batch: an element holds no tensors");
  out_.clear();
  row_bytes_.clear();
  rows_ = 0;
  capacity_ = capacity;
  for (const Tensor& t : first) {
    TANDEM_CHECK(t.defined(), "batch: an element holds an undefined tensor");
    out_.push_back(Tensor::empty(prepend_dim(capacity, t.shape()), t.dtype()));
    row_bytes_.push_back(t.nbytes());
  }
  append(first);
}

void Stacker::append(const Element& element) {
  TANDEM_CHECK(rows_ < capacity_, "Stacker: batch already holds ", capacity_, " rows");
  TANDEM_CHECK(element.size() == out_.size(), "batch: element ", rows_, " has ", element.size(),
               " tensors, the first element of the batch had ", out_.size());
  for (size_t c = 0; c < out_.size(); ++c) {
    const Tensor& t = element[c];
    TANDEM_CHECK(t.defined(), "batch: element ", rows_, " holds an undefined tensor");
    const Shape row_shape = drop_first_dim(out_[c].shape());
    TANDEM_CHECK(t.shape() == row_shape && t.dtype() == out_[c].dtype(), "batch: tensor ", c,
                 " of element ", rows_, " is ", t.shape(), " ", t.dtype(),
                 " but the first element of the batch had ", row_shape, " ", out_[c].dtype(),
                 "; every element of a batch needs the same shapes");
    const Tensor host = t.device().is_cpu() ? t : t.to(Device::cpu());
    if (row_bytes_[c] == 0) continue;
    std::memcpy(static_cast<char*>(out_[c].raw_data()) + static_cast<size_t>(rows_) * row_bytes_[c],
                host.raw_data(), row_bytes_[c]);
  }
  ++rows_;
}

Element Stacker::finish() {
  if (rows_ < capacity_) {
    for (Tensor& t : out_) t = t.view_as(prepend_dim(rows_, drop_first_dim(t.shape())));
  }
  rows_ = 0;
  capacity_ = 0;
  return std::move(out_);
}

// ---- sources, iterators, nodes ---------------------------------------------------------------

void SourceReader::gather(const std::vector<int64_t>& indices, Element& out) {
  TANDEM_CHECK(!indices.empty(), "SourceReader::gather: no indices");
  Element element;
  Stacker stacker;
  read(indices[0], element);
  stacker.start(element, static_cast<int64_t>(indices.size()));
  for (size_t i = 1; i < indices.size(); ++i) {
    read(indices[i], element);
    stacker.append(element);
  }
  out = stacker.finish();
}

std::shared_ptr<const Source> Source::with_files(std::vector<std::string>) const {
  TANDEM_THROW("source ", describe(), " does not read files");
}

bool IteratorImpl::next_index(int64_t&) {
  TANDEM_THROW("internal error: next_index on an iterator that has no random-access source");
}

int64_t IteratorImpl::skip(int64_t n) {
  Element discard;
  int64_t passed = 0;
  while (passed < n && next(discard)) ++passed;
  return passed;
}

Node::Node(std::shared_ptr<const Node> input, std::string kind, bool adds_depth)
    : input_(std::move(input)),
      kind_(std::move(kind)),
      depth_(input_ ? input_->depth() + (adds_depth ? 1 : 0) : 0) {}

std::string Node::state_prefix() const { return std::to_string(depth_) + "_" + kind_ + "/"; }

std::vector<TensorSpec> Node::element_spec() const {
  TANDEM_CHECK(input_ != nullptr, "internal error: source node ", kind_, " has no element_spec");
  return input_->element_spec();
}

namespace {

/// FNV-1a over the description of every node: a state saved from one pipeline is refused
/// by another.
int64_t pipeline_signature(const Node& node) {
  uint64_t hash = 1469598103934665603ull;
  for (const Node* n = &node; n != nullptr; n = n->input().get()) {
    const std::string text = n->signature_text();
    if (text.empty()) continue;
    for (const char ch : text + "|") {
      hash ^= static_cast<unsigned char>(ch);
      hash *= 1099511628211ull;
    }
  }
  int64_t out;
  std::memcpy(&out, &hash, sizeof(out));
  return out;
}

constexpr int64_t kStateVersion = 1;

}  // namespace
}  // namespace detail

// ---- Iterator --------------------------------------------------------------------------------

Iterator::Iterator(std::shared_ptr<const detail::Node> node, uint64_t epoch,
                   std::shared_ptr<std::atomic<uint64_t>> epochs)
    : node_(std::move(node)),
      epoch_(epoch),
      epochs_(std::move(epochs)),
      impl_(node_->make_iterator(epoch_)) {}

Iterator::Iterator(Iterator&&) noexcept = default;
Iterator& Iterator::operator=(Iterator&&) noexcept = default;
Iterator::~Iterator() = default;

bool Iterator::next(Element& out) {
  TANDEM_CHECK(impl_ != nullptr, "data::Iterator: use of a moved-from iterator");
  return impl_->next(out);
}

IteratorState Iterator::save() const {
  TANDEM_CHECK(impl_ != nullptr, "data::Iterator: use of a moved-from iterator");
  IteratorState state;
  state.set("iterator/version", {detail::kStateVersion});
  state.set("iterator/signature", {detail::pipeline_signature(*node_)});
  state.set("iterator/epoch", {static_cast<int64_t>(epoch_)});
  impl_->save(state);
  return state;
}

void Iterator::restore(const IteratorState& state) {
  TANDEM_CHECK(node_ != nullptr, "data::Iterator: use of a moved-from iterator");
  const int64_t version = state.get_scalar("iterator/version");
  TANDEM_CHECK(version == detail::kStateVersion, "data::Iterator::restore: the state has format ",
               "version ", version, "; this build reads version ", detail::kStateVersion);
  const int64_t signature = state.get_scalar("iterator/signature");
  const int64_t expected = detail::pipeline_signature(*node_);
  TANDEM_CHECK(signature == expected, "data::Iterator::restore: the state was saved from a ",
               "different pipeline (signature ", signature, ", this pipeline's is ", expected, ": ",
               Dataset(node_).describe(), ")");
  const int64_t epoch = state.get_scalar("iterator/epoch");
  TANDEM_CHECK(epoch >= 0, "data::Iterator::restore: negative epoch ", epoch);
  // Restore into a fresh iterator first, so a failure leaves this one as it was.
  std::unique_ptr<detail::IteratorImpl> fresh = node_->make_iterator(static_cast<uint64_t>(epoch));
  fresh->restore(state);
  impl_ = std::move(fresh);
  epoch_ = static_cast<uint64_t>(epoch);
  if (epochs_) epochs_->store(epoch_ + 1);
}

ElementCursor::ElementCursor(std::shared_ptr<Iterator> owned, Iterator* iterator)
    : owned_(std::move(owned)), iterator_(iterator ? iterator : owned_.get()) {
  done_ = !iterator_->next(current_);
}

ElementCursor& ElementCursor::operator++() {
  done_ = !iterator_->next(current_);
  return *this;
}

// ---- Dataset ---------------------------------------------------------------------------------

Dataset::Dataset(std::shared_ptr<const detail::Node> node)
    : node_(std::move(node)), epochs_(std::make_shared<std::atomic<uint64_t>>(0)) {
  TANDEM_CHECK(node_ != nullptr, "data::Dataset: null pipeline node");
}

Dataset Dataset::map(std::function<Element(Element)> fn) const {
  TANDEM_CHECK(fn != nullptr, "Dataset::map: the function is empty");
  return Dataset(detail::make_map_node(node_, std::move(fn)));
}

Dataset Dataset::map(std::function<Element(Element)> fn, int64_t num_parallel_calls,
                     bool /*deterministic: the order is kept either way*/) const {
  TANDEM_CHECK(fn != nullptr, "Dataset::map: the function is empty");
  TANDEM_CHECK(num_parallel_calls >= 1 || num_parallel_calls == kAutotune,
               "Dataset::map: num_parallel_calls must be at least 1 or kAutotune, got ",
               num_parallel_calls);
  const int64_t threads =
      num_parallel_calls == kAutotune ? std::max(1, compute_threads()) : num_parallel_calls;
  TANDEM_CHECK(threads <= 1024, "Dataset::map: num_parallel_calls ", threads, " is too many");
  return Dataset(
      detail::make_map_node(node_, std::move(fn), static_cast<int>(threads),
                            /*autotune=*/num_parallel_calls == kAutotune && threads > 1));
}

Dataset Dataset::interleave(std::function<Dataset(const Element&)> fn, int64_t cycle_length,
                            int64_t block_length, int64_t num_parallel_calls) const {
  TANDEM_CHECK(fn != nullptr, "Dataset::interleave: the function is empty");
  const auto resolve = [](const char* name, int64_t value) {
    TANDEM_CHECK(value >= 1 || value == kAutotune, "Dataset::interleave: ", name,
                 " must be at least 1 or kAutotune, got ", value);
    const int64_t resolved = value == kAutotune ? std::max(1, compute_threads()) : value;
    TANDEM_CHECK(resolved <= 1024, "Dataset::interleave: ", name, " ", resolved, " is too many");
    return resolved;
  };
  const int64_t cycle = resolve("cycle_length", cycle_length);
  const int64_t threads = resolve("num_parallel_calls", num_parallel_calls);
  TANDEM_CHECK(block_length >= 1, "Dataset::interleave: block_length must be at least 1, got ",
               block_length);
  return Dataset(detail::make_interleave_node(node_, std::move(fn), cycle, block_length,
                                              static_cast<int>(std::min(threads, cycle))));
}

Dataset Dataset::cache() const { return Dataset(detail::make_cache_node(node_)); }

Dataset Dataset::cache(const std::string& filename) const {
  TANDEM_CHECK(!filename.empty(), "Dataset::cache: the file name is empty (cache() keeps the ",
               "elements in memory)");
  return Dataset(detail::make_cache_node(node_, filename));
}

Dataset Dataset::shuffle(int64_t buffer_size, uint64_t seed, bool reshuffle_each_iteration) const {
  TANDEM_CHECK(buffer_size >= 1, "Dataset::shuffle: buffer_size must be at least 1, got ",
               buffer_size);
  return Dataset(detail::make_shuffle_node(node_, buffer_size, seed, reshuffle_each_iteration));
}

Dataset Dataset::batch(int64_t batch_size, bool drop_remainder) const {
  TANDEM_CHECK(batch_size >= 1, "Dataset::batch: batch_size must be at least 1, got ", batch_size);
  return Dataset(detail::make_batch_node(node_, batch_size, drop_remainder));
}

Dataset Dataset::repeat(int64_t count) const {
  TANDEM_CHECK(count >= -1, "Dataset::repeat: count must be -1 (forever) or >= 0, got ", count);
  return Dataset(detail::make_repeat_node(node_, count));
}

Dataset Dataset::take(int64_t count) const {
  TANDEM_CHECK(count >= -1, "Dataset::take: count must be -1 (all) or >= 0, got ", count);
  return Dataset(detail::make_take_node(node_, count));
}

Dataset Dataset::skip(int64_t count) const {
  TANDEM_CHECK(count >= -1, "Dataset::skip: count must be -1 (all) or >= 0, got ", count);
  return Dataset(detail::make_skip_node(node_, count));
}

Dataset Dataset::shard(int64_t num_shards, int64_t index) const {
  TANDEM_CHECK(num_shards >= 1, "Dataset::shard: num_shards must be at least 1, got ", num_shards);
  TANDEM_CHECK(index >= 0 && index < num_shards, "Dataset::shard: index ", index,
               " is out of range for ", num_shards, " shards (0 <= index < num_shards)");
  return Dataset(detail::make_shard_node(node_, num_shards, index));
}

Dataset Dataset::prefetch(int64_t buffer_size) const {
  TANDEM_CHECK(buffer_size == kAutotune || buffer_size >= 1, "Dataset::prefetch: buffer_size ",
               "must be at least 1 (or kAutotune), got ", buffer_size);
  return Dataset(detail::make_prefetch_node(node_, buffer_size == kAutotune ? 2 : buffer_size));
}

Iterator Dataset::iterator() const { return Iterator(node_, epochs_->fetch_add(1), epochs_); }

Iterator Dataset::iterator(uint64_t epoch) const { return Iterator(node_, epoch, nullptr); }

ElementCursor Dataset::begin() const {
  return ElementCursor(std::make_shared<Iterator>(iterator()), nullptr);
}

int64_t Dataset::cardinality() const { return node_->cardinality(); }

std::vector<TensorSpec> Dataset::element_spec() const { return node_->element_spec(); }

std::string Dataset::describe() const {
  std::vector<std::string> parts;
  for (const detail::Node* n = node_.get(); n != nullptr; n = n->input().get())
    parts.push_back(n->describe());
  std::ostringstream out;
  for (auto it = parts.rbegin(); it != parts.rend(); ++it)
    out << (it == parts.rbegin() ? "" : " -> ") << *it;
  return out.str();
}

}  // namespace tandem::data
