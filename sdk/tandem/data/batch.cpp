// data::Batch accessors.
#include "tandem/data/batch.h"

namespace tandem::data {

const Tensor& Batch::features() const {
  TANDEM_CHECK(!tensors_.empty(), "Batch::features: the batch holds no tensors");
  return tensors_[0];
}

const Tensor& Batch::labels() const {
  TANDEM_CHECK(tensors_.size() >= 2, "Batch::labels: the batch holds ", tensors_.size(),
               " tensor(s); labels are tensor 1");
  return tensors_[1];
}

const Tensor& Batch::operator[](size_t i) const {
  TANDEM_CHECK(i < tensors_.size(), "Batch: tensor ", i, " requested, the batch holds ",
               tensors_.size());
  return tensors_[i];
}

int64_t Batch::batch_size() const {
  if (tensors_.empty() || !tensors_[0].defined() || tensors_[0].rank() == 0) return 0;
  return tensors_[0].dim(0);
}

}  // namespace tandem::data
