// data::Dataset: a lazy, copyable description of an input pipeline (sources and
// transformations, tf.data style), and data::Iterator, which walks it and can save and
// restore its position exactly.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <iterator>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tandem/data/iterator_state.h"
#include "tandem/tensor/tensor.h"

namespace tandem::data {

/// One element of a dataset: a tuple of tensors (e.g. {image, label}).
using Element = std::vector<Tensor>;

/// Shape and dtype of one component of an element; -1 marks a dimension that varies
/// (the batch dimension of a batch that keeps its remainder).
struct TensorSpec {
  /// The component's shape (-1 where it varies).
  Shape shape;
  /// The component's dtype.
  DType dtype = DType::kFloat32;
  friend bool operator==(const TensorSpec&, const TensorSpec&) = default;
};

/// Cardinality of a dataset that repeats forever.
inline constexpr int64_t kInfiniteCardinality = -1;
/// Cardinality of a dataset whose length is known only by reading it (an interleave).
inline constexpr int64_t kUnknownCardinality = -2;
/// prefetch(kAutotune) picks a small default buffer (2 elements); map(fn, kAutotune) as many
/// threads as keep up, up to one per core.
inline constexpr int64_t kAutotune = -1;

/// Which part of a dataset to read: the training or the test examples.
enum class Split { kTrain, kTest };

/// Where the Debian package dataset-fashion-mnist installs the IDX files.
inline constexpr const char* kFashionMnistDirectory = "/usr/share/datasets/fashion-mnist";

namespace detail {
class Node;
class IteratorImpl;
}  // namespace detail

class Iterator;

/// Range-for support: walks an Iterator, holding the current element.
class ElementCursor {
 public:
  /// A cursor on `iterator`, reading its first element; `owned` keeps the iterator alive when
  /// the cursor made it (Dataset::begin), null otherwise.
  ElementCursor(std::shared_ptr<Iterator> owned, Iterator* iterator);
  /// The current element.
  const Element& operator*() const { return current_; }
  /// The current element's members.
  const Element* operator->() const { return &current_; }
  /// Moves to the next element.
  ElementCursor& operator++();
  /// True once the iterator is exhausted.
  bool operator==(std::default_sentinel_t) const { return done_; }

 private:
  std::shared_ptr<Iterator> owned_;  // set when the cursor owns its iterator (Dataset::begin)
  Iterator* iterator_;
  Element current_;
  bool done_ = false;
};

/// Walks a dataset once (one epoch of it). Movable, not copyable; destroying it mid-epoch
/// stops any prefetch threads cleanly.
class Iterator {
 public:
  /// Takes over the other iterator's position (using the moved-from one raises).
  Iterator(Iterator&&) noexcept;
  /// Stops this iterator (and its prefetch threads), then takes over the other's position.
  Iterator& operator=(Iterator&&) noexcept;
  ~Iterator();

  /// Writes the next element into `out`; false at the end (then `out` is untouched).
  bool next(Element& out);
  /// The epoch this iterator walks (folded into the shuffle RNG streams).
  uint64_t epoch() const { return epoch_; }

  /// The position: every node's counters, shuffle buffers (as indices), RNG states and the
  /// epoch. Restoring it into an iterator of the same pipeline reproduces exactly the
  /// elements this iterator would have produced next, prefetch included.
  IteratorState save() const;
  /// Moves this iterator to a saved position. Raises when the state was saved from another
  /// pipeline (its signature differs) or from a newer format.
  void restore(const IteratorState& state);

  /// `for (const data::Element& e : iterator)` walks the rest of the epoch.
  ElementCursor begin() { return ElementCursor(nullptr, this); }
  /// See begin().
  std::default_sentinel_t end() const { return {}; }

 private:
  friend class Dataset;
  Iterator(std::shared_ptr<const detail::Node> node, uint64_t epoch,
           std::shared_ptr<std::atomic<uint64_t>> epochs);

  std::shared_ptr<const detail::Node> node_;
  uint64_t epoch_;
  std::shared_ptr<std::atomic<uint64_t>> epochs_;  // the dataset's iteration counter
  std::unique_ptr<detail::IteratorImpl> impl_;
};

/// A lazy pipeline of elements. Copies share the immutable pipeline description (and the
/// iteration counter that makes shuffles reshuffle per epoch). Transformations return new
/// datasets; nothing is read until an iterator runs.
class Dataset {
 public:
  /// Applies `fn` to every element. `fn` must be deterministic and thread safe (it can run on
  /// a prefetch thread, and saved iterator positions are restored by recomputation); it
  /// receives its own copy of the element's tensors.
  Dataset map(std::function<Element(Element)> fn) const;
  /// map(fn) on `num_parallel_calls` threads (tf.data's map(fn, num_parallel_calls)). kAutotune
  /// starts one thread per core of this process's compute budget and uses as many of them as
  /// keep up with the consumer, from the measured time per element and the pipeline's pace (a
  /// slow training step leaves the other cores to the step). The output order is the input's.
  /// Before a batch of a random-access source, each batch's elements are read and mapped in
  /// parallel; otherwise a window of 2 x num_parallel_calls elements is read ahead and mapped.
  /// A position saved with one parallelism restores with any other.
  /// `deterministic` false allows the elements out of order, as in tf.data (accepted so that a
  /// port keeps its call); the map works in rounds that it hands out whole, so the order, and
  /// the exact saved position, are kept either way.
  Dataset map(std::function<Element(Element)> fn, int64_t num_parallel_calls,
              bool deterministic = true) const;
  /// tf.data interleave: `fn` makes a dataset of every input element (a file name, say), and
  /// the elements of `cycle_length` such datasets are taken in turn, `block_length` at a time
  /// from each; when one ends, the next input element opens in its place. The order is
  /// tf.data's (deterministic). With `num_parallel_calls` > 1 the open datasets are read ahead
  /// on that many threads (order unchanged). kAutotune for cycle_length or num_parallel_calls:
  /// one per core of the compute budget. `fn` must be deterministic: a saved position holds
  /// each open dataset's position and the input element that made it, and a restore calls `fn`
  /// again on that element. The cardinality is kUnknownCardinality.
  Dataset interleave(std::function<Dataset(const Element&)> fn, int64_t cycle_length,
                     int64_t block_length = 1, int64_t num_parallel_calls = 1) const;
  /// tf.data cache() in memory: the first time an element is read it is kept, and later
  /// epochs read the kept copy instead of the input (decoding, parsing and maps before the
  /// cache run once). Over a random-access input each element is kept by its index as it is
  /// read (a shuffle above still shuffles indices); otherwise a pass is kept whole when it
  /// reaches the end from the beginning (a pass cut short or restored in the middle keeps
  /// nothing). What is kept stays until the last copy of this dataset goes; everything kept
  /// must fit in memory. Positions save and restore as without the cache.
  Dataset cache() const;
  /// tf.data cache(filename): the same, kept in the file `filename` instead of memory, so a
  /// later run (or another dataset naming the file) reads it instead of its input. The file is
  /// written beside `filename` as elements come (created exclusively, never through a link)
  /// and renamed to it once every element is there: a file of that name is always whole. An
  /// existing file is checked when the dataset is first read: written by another pipeline (its
  /// description differs) or damaged, it raises naming the file. Tensors come back on the CPU.
  Dataset cache(const std::string& filename) const;
  /// tf.data shuffle: a buffer of `buffer_size` elements; each output is a uniformly chosen
  /// buffer element, replaced by the next input. Randomness is Philox(seed) with the epoch
  /// folded into the stream, so every epoch differs (unless reshuffle_each_iteration is
  /// false) yet a given seed always gives the same sequence of epochs.
  Dataset shuffle(int64_t buffer_size, uint64_t seed, bool reshuffle_each_iteration = true) const;
  /// Stacks `batch_size` consecutive elements along a new axis 0; the last batch may be
  /// smaller unless `drop_remainder`.
  Dataset batch(int64_t batch_size, bool drop_remainder = false) const;
  /// Repeats the dataset `count` times (-1: forever). Each pass is a new epoch for the
  /// shuffles inside.
  Dataset repeat(int64_t count = -1) const;
  /// The first `count` elements (-1: all).
  Dataset take(int64_t count) const;
  /// All but the first `count` elements (-1: none left).
  Dataset skip(int64_t count) const;
  /// Every `num_shards`-th element starting with element `index`.
  Dataset shard(int64_t num_shards, int64_t index) const;
  /// Produces up to `buffer_size` elements ahead on a background thread (order unchanged;
  /// an exception on that thread is re-raised by next()). kAutotune means 2.
  Dataset prefetch(int64_t buffer_size = kAutotune) const;

  /// An iterator over the next epoch: the first call walks epoch 0, the next one epoch 1...
  /// (counted per dataset value, shared by its copies, like tf.data's seed generators).
  Iterator iterator() const;
  /// An iterator over epoch `epoch`, independent of the counter.
  Iterator iterator(uint64_t epoch) const;
  /// `for (const data::Element& e : dataset)` walks a new epoch (as iterator()).
  ElementCursor begin() const;
  /// See begin().
  std::default_sentinel_t end() const { return {}; }

  /// Number of elements in one iteration, kInfiniteCardinality or kUnknownCardinality.
  int64_t cardinality() const;
  /// Shapes and dtypes of the components (a map may be evaluated on one element for this).
  std::vector<TensorSpec> element_spec() const;
  /// The pipeline, source first: "fashion_mnist(train, 60000) -> shuffle(60000, seed=42) -> ...".
  std::string describe() const;

  /// \cond INTERNAL
  /// Internal: wraps a pipeline node (used by the sources and by DistributedDataset).
  explicit Dataset(std::shared_ptr<const detail::Node> node);
  const std::shared_ptr<const detail::Node>& node() const { return node_; }
  /// \endcond

 private:
  std::shared_ptr<const detail::Node> node_;
  std::shared_ptr<std::atomic<uint64_t>> epochs_;
};

// ---- sources ---------------------------------------------------------------------------------

/// Slices each tensor along axis 0: element i is {tensors[0][i], tensors[1][i], ...}. All
/// tensors need the same dim 0; they are copied to the host at creation.
Dataset from_tensor_slices(std::vector<Tensor> tensors);
/// Elements {int64 scalar i} for i in [0, n).
Dataset range(int64_t n);
/// An IDX image file and its IDX label file (plain or .gz), both of unsigned bytes, as
/// elements {float32 image scaled to [0, 1] of the image shape (e.g. [28, 28]), int64 label
/// (rank 0)}. Both files are read into memory once and shared by every dataset that reads
/// them. Bad magic numbers, ranks, truncated files and count mismatches raise naming the file.
/// With `num_classes`, every label is checked to lie in [0, num_classes) when the files are
/// opened: the first that does not raises, naming the file, its index and its value.
Dataset idx(const std::string& images_path, const std::string& labels_path,
            std::optional<int64_t> num_classes = std::nullopt);
/// Fashion-MNIST (60000 train / 10000 test examples) from `directory`: elements
/// {float32 [28, 28] image in [0, 1], int64 label in 0..9}. A label outside 0..9 in the files
/// raises when they are opened.
Dataset fashion_mnist(Split split, const std::string& directory = kFashionMnistDirectory);
/// Examples from HDF5 files: each name is a dataset of shape [N, ...] present in every file
/// (same trailing shape and type); element i is {name0[i], name1[i], ...}; files are read
/// one after another, `chunk_rows` rows at a time (hyperslab reads, never a whole file).
/// Types: floats as float32/float64, integers as uint8/int32/int64. Without HDF5 in the
/// build this raises NotBuiltError.
Dataset hdf5(std::vector<std::string> files, std::vector<std::string> dataset_names,
             int64_t chunk_rows = 1024);

}  // namespace tandem::data
