// What cache() keeps (internal): elements by number (the source index over a random-access
// input, the position in a pass over elements), in memory or in a file. Stores are shared by the
// iterators of one cache node and are thread safe.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "tandem/data/dataset.h"

namespace tandem::data::detail {

class CacheStore {
 public:
  virtual ~CacheStore() = default;
  /// The number of elements once the store is complete (every element kept), else nullopt.
  virtual std::optional<int64_t> complete() = 0;
  /// Element `i` (a copy the caller may write into) when the store is complete.
  virtual void get(int64_t i, Element& out) = 0;
  /// Keeps element `i` unless it is kept already; once `expected` elements are kept (when
  /// known: a random-access input's size), the store is complete.
  virtual void put(int64_t i, const Element& element) = 0;
  /// A pass that started at element 0 ended after `count` elements: the store is complete.
  virtual void finish(int64_t count) = 0;
};

/// In memory. `expected`: the number of elements when known (a random-access input), else -1.
std::shared_ptr<CacheStore> make_memory_cache(int64_t expected);
/// In the file `filename`: read when it exists at the first use (it must have been written by a
/// pipeline of the same `signature`), else written beside it as elements come and renamed to
/// `filename` when complete, so a file of that name is always whole.
std::shared_ptr<CacheStore> make_file_cache(std::string filename, std::string signature,
                                            int64_t expected);

}  // namespace tandem::data::detail
