// data::Batch: one batch as handed to a replica's step function: the element's tensors with
// names for the usual (features, labels) pair.
#pragma once

#include <cstdint>
#include <vector>

#include "tandem/data/dataset.h"

namespace tandem::data {

/// One batch of a dataset as a replica gets it: a tuple of tensors whose axis 0 is the
/// example, usually {features, labels}. What strategy.run hands a step from a distributed
/// dataset.
class Batch {
 public:
  /// A batch with no tensors.
  Batch() = default;
  /// A batch of `tensors` (each with the examples along axis 0); `global_batch_size`: the
  /// examples of the whole step on every replica and worker, when the batch is one replica's
  /// share of it (0: not known).
  explicit Batch(Element tensors, int64_t global_batch_size = 0)
      : tensors_(std::move(tensors)), global_batch_size_(global_batch_size) {}

  /// Tensor 0 (e.g. images [B, 28, 28]); raises when the batch has no tensors.
  const Tensor& features() const;
  /// Tensor 1 (e.g. labels [B]); raises when the batch has fewer than two tensors.
  const Tensor& labels() const;
  /// Tensor i; raises when out of range.
  const Tensor& operator[](size_t i) const;
  /// Number of tensors.
  size_t size() const { return tensors_.size(); }
  /// Examples in the batch: dim 0 of tensor 0 (0 for an empty batch or one with no tensors).
  int64_t batch_size() const;
  /// True when the batch holds no examples (a replica's share of a short last batch).
  bool empty() const { return batch_size() == 0; }
  /// Every tensor, in order.
  const Element& tensors() const { return tensors_; }
  /// The examples of the step this batch is a replica's share of, over every replica and
  /// worker (what compute_average_loss should divide by), as a distributed dataset that split
  /// a global batch delivered it; 0 when not known (a batch of one's own, a dataset batched per
  /// replica).
  int64_t global_batch_size() const { return global_batch_size_; }

 private:
  Element tensors_;
  int64_t global_batch_size_ = 0;
};

}  // namespace tandem::data
