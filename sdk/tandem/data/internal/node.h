// Internals of the data pipeline (not part of the public API): pipeline nodes, the
// iterators they make, random-access sources and the row-stacking helper used by batch.
//
// Index mode: a source is random access, and shuffle/take/skip/shard/repeat/map over it pass
// source INDICES along instead of tensors. Batch then gathers the rows straight into the
// batch tensors, and an iterator's saved state is positions and indices, never tensors.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tandem/data/dataset.h"
#include "tandem/data/iterator_state.h"

namespace tandem::data::detail {

/// Reads elements of a Source; one per iterator (readers may cache, e.g. an HDF5 chunk).
class SourceReader {
 public:
  virtual ~SourceReader() = default;
  /// Element `index` as new tensors.
  virtual void read(int64_t index, Element& out) = 0;
  /// Elements `indices` stacked into `out` (tensors [indices.size(), ...]). The default reads
  /// each element and stacks it.
  virtual void gather(const std::vector<int64_t>& indices, Element& out);
};

/// A random-access collection of elements.
class Source {
 public:
  virtual ~Source() = default;
  virtual int64_t size() const = 0;
  /// True for in-memory data: a shuffle then keeps indices and reads on output. False for
  /// files read in chunks (HDF5): a shuffle then keeps the elements it read in order.
  virtual bool cheap_random_access() const = 0;
  virtual std::unique_ptr<SourceReader> reader() const = 0;
  virtual std::vector<TensorSpec> element_spec() const = 0;
  /// "fashion_mnist(train, 60000 examples)"; part of the pipeline signature.
  virtual std::string describe() const = 0;
  /// Files this source reads (for AutoShardPolicy::kFile); empty when not file based.
  virtual std::vector<std::string> files() const { return {}; }
  /// The same source over a subset of its files.
  virtual std::shared_ptr<const Source> with_files(std::vector<std::string> files) const;
};

/// Walks a node once. Index-mode iterators (whose node has a source()) implement next_index.
class IteratorImpl {
 public:
  virtual ~IteratorImpl() = default;
  virtual bool next(Element& out) = 0;
  /// Index mode: the next element's index into the node's source().
  virtual bool next_index(int64_t& index);
  /// Advances past up to `n` elements, without materialising them where possible; returns
  /// how many it passed (fewer at the end).
  virtual int64_t skip(int64_t n);
  /// Adds this iterator's entries (and its input's) to `state`.
  virtual void save(IteratorState& state) const = 0;
  /// Reads back what save() wrote; the iterator was freshly made for the same epoch.
  virtual void restore(const IteratorState& state) = 0;
};

/// One step of a pipeline: a source (no input) or a transformation of its input. Immutable.
class Node {
 public:
  /// `adds_depth` false: the node takes its input's depth (the shard auto-sharding inserts, so
  /// that the nodes above keep the entry names of the unsharded pipeline).
  Node(std::shared_ptr<const Node> input, std::string kind, bool adds_depth = true);
  virtual ~Node() = default;

  const std::shared_ptr<const Node>& input() const { return input_; }
  /// 0 for the source, input's depth + 1 otherwise.
  int depth() const { return depth_; }
  const std::string& kind() const { return kind_; }
  /// Prefix of this node's entries in an IteratorState: "<depth>_<kind>/".
  std::string state_prefix() const;

  /// "shuffle(buffer_size=60000, seed=42)".
  virtual std::string describe() const = 0;
  /// What the pipeline signature hashes (saved states restore only into a pipeline with the
  /// same signature): describe(), except where a state is valid across variants (shard); an
  /// empty text leaves the node out (the shard auto-sharding inserts).
  virtual std::string signature_text() const { return describe(); }
  /// The random-access source whose indices this node's iterators yield (index mode), or
  /// nullptr when they yield only elements.
  virtual std::shared_ptr<const Source> source() const { return nullptr; }
  virtual std::unique_ptr<IteratorImpl> make_iterator(uint64_t epoch) const = 0;
  virtual int64_t cardinality() const = 0;
  virtual std::vector<TensorSpec> element_spec() const;
  /// The same transformation over another input (used by auto-sharding).
  virtual std::shared_ptr<const Node> with_input(std::shared_ptr<const Node> input) const = 0;
  /// For batch nodes: the batch size (0 for every other node).
  virtual int64_t batch_size() const { return 0; }
  /// For batch nodes: whether a short last batch is dropped.
  virtual bool drop_remainder() const { return false; }

 private:
  std::shared_ptr<const Node> input_;
  std::string kind_;
  int depth_;
};

// ---- node factories ----------------------------------------------------------------------
std::shared_ptr<const Node> make_source_node(std::shared_ptr<const Source> source,
                                             std::string kind);
/// map(fn) on `parallel` threads (1: the caller's only); with `autotune`, on as many of them as
/// keep up (ParallelismTuner).
std::shared_ptr<const Node> make_map_node(std::shared_ptr<const Node> input,
                                          std::function<Element(Element)> fn, int parallel = 1,
                                          bool autotune = false);
/// The iterator of a map on `parallel` > 1 threads over elements (not indices): it reads
/// ahead of the consumer and maps the elements read on a WorkerPool, keeping their order
/// (parallel_map.cpp).
std::unique_ptr<IteratorImpl> make_parallel_map_iterator(
    std::shared_ptr<const Node> input, uint64_t epoch,
    std::shared_ptr<const std::function<Element(Element)>> fn, int parallel, bool autotune);
/// interleave(fn, cycle_length, block_length) with `parallel` reading threads
/// (interleave.cpp).
std::shared_ptr<const Node> make_interleave_node(std::shared_ptr<const Node> input,
                                                 std::function<Dataset(const Element&)> fn,
                                                 int64_t cycle_length, int64_t block_length,
                                                 int parallel);
/// cache() in memory (`filename` empty) or in a file (cache.cpp, cache_file.cpp).
std::shared_ptr<const Node> make_cache_node(std::shared_ptr<const Node> input,
                                            std::string filename = {});
std::shared_ptr<const Node> make_shuffle_node(std::shared_ptr<const Node> input,
                                              int64_t buffer_size, uint64_t seed,
                                              bool reshuffle_each_iteration);
/// `signature_batch_size` > 0: the signature names that batch size instead (a worker's share of
/// a global batch is signed as the global batch, so its position restores at any number of
/// workers).
std::shared_ptr<const Node> make_batch_node(std::shared_ptr<const Node> input, int64_t batch_size,
                                            bool drop_remainder, int64_t signature_batch_size = 0);
std::shared_ptr<const Node> make_repeat_node(std::shared_ptr<const Node> input, int64_t count);
std::shared_ptr<const Node> make_take_node(std::shared_ptr<const Node> input, int64_t count);
std::shared_ptr<const Node> make_skip_node(std::shared_ptr<const Node> input, int64_t count);
std::shared_ptr<const Node> make_shard_node(std::shared_ptr<const Node> input, int64_t num_shards,
                                            int64_t index);
/// The shard auto-sharding (kData) inserts: shard(num_workers, worker_index) that is left out
/// of the signature and of the depths, and saves nothing of its own. Its position is the
/// input's, in whole rounds, which is the same for every worker and every number of workers
/// at a step boundary; so a worker's saved position restores at another number of workers.
std::shared_ptr<const Node> make_worker_shard_node(std::shared_ptr<const Node> input,
                                                   int64_t num_workers, int64_t worker_index);
std::shared_ptr<const Node> make_prefetch_node(std::shared_ptr<const Node> input,
                                               int64_t buffer_size);

/// The HDF5 source (hdf5_source.cpp; only in builds with HDF5).
std::shared_ptr<const Source> make_hdf5_source(std::vector<std::string> files,
                                               std::vector<std::string> dataset_names,
                                               int64_t chunk_rows);

/// Copies rows into preallocated batch tensors, checking every element against the first.
class Stacker {
 public:
  /// Allocates tensors [capacity, ...] shaped like `first` and copies it in as row 0.
  void start(const Element& first, int64_t capacity);
  /// Copies `element` in as the next row; raises naming both shapes on a mismatch.
  void append(const Element& element);
  int64_t rows() const { return rows_; }
  /// The rows copied so far (views of the first rows() when fewer than the capacity).
  Element finish();

 private:
  Element out_;
  std::vector<size_t> row_bytes_;
  int64_t rows_ = 0;
  int64_t capacity_ = 0;
};

/// Shape [rows, row_shape...].
Shape prepend_dim(int64_t rows, const Shape& row_shape);
/// Shape without its first dimension.
Shape drop_first_dim(const Shape& shape);

}  // namespace tandem::data::detail
