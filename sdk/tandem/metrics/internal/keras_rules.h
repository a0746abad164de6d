// Keras's rules for metric inputs, on host float64 copies of the tensors: rank matching
// (squeeze_or_expand_to_same_rank), sample-weight reduction (reduce_to_samplewise_values, of Mean
// and Sum) and the confusion-matrix counts of update_confusion_matrix_variables (both of its
// paths). Internal to the metrics layer.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "tandem/core/shape.h"
#include "tandem/tensor/tensor.h"

namespace tandem::metrics::detail {

/// A tensor's values on the host as float64, row-major.
struct HostArray {
  Shape shape;
  std::vector<double> values;
};

/// `x` copied to the host as float64 (a CUDA tensor is copied).
HostArray to_host(const Tensor& x);

/// Keras's squeeze_or_expand_to_same_rank(x1, x2, expand_rank_1): when the ranks differ by
/// one and the longer has a last axis of 1, that axis is dropped (or, with expand_rank_1 and a
/// rank-1 shorter one, the shorter gains a last axis of 1).
void squeeze_or_expand_to_same_rank(HostArray& x1, HostArray& x2, bool expand_rank_1 = true);

/// `x` broadcast (numpy rules) to `shape`; raises naming the metric, `what` and both shapes
/// when it does not broadcast.
HostArray broadcast_to(const HostArray& x, const Shape& shape, const std::string& metric,
                       const char* what);

/// The reduce_fn of Keras's reduce_to_samplewise_values: Mean's mean, Sum's sum.
enum class SampleReduction { kMean, kSum };

/// What Keras's Mean (kMean) or Sum (kSum) update_state(values, sample_weight) adds, as
/// (total, count), following reduce_to_samplewise_values:
/// - without weights, the values are reduced over every axis but the first, and count is the
///   number of samples (values.shape[0]; 1 for a scalar);
/// - with weights, values and weights are first brought to the same rank (a last axis of 1 is
///   squeezed or added, squeeze_or_expand_to_same_rank), the values are reduced over the axes
///   beyond the weights' rank, the weights are broadcast to the values and multiply them, the
///   weights are reduced over their non-batch axes and the values over theirs; count is the sum
///   of the reduced weights.
/// total is the sum of the reduced values. Raises, naming the metric, `values_what` and both
/// shapes, when the weights do not broadcast to the reduced values.
std::pair<double, double> samplewise_update(HostArray values, const Tensor& sample_weight,
                                            SampleReduction reduction, const std::string& metric,
                                            const char* values_what = "values");

/// Keras's is_evenly_distributed_thresholds: 3 or more thresholds, each within
/// allclose(atol = 1e-7) of i / (n - 1) (computed in float32 as numpy does).
bool evenly_distributed(const std::vector<double>& thresholds);

/// The confusion-matrix counts Keras's update_confusion_matrix_variables adds for one batch
/// (not multi-label: every element of y_pred is one prediction): per threshold, the weight of
/// the elements with y_true != 0 and y_pred > threshold (true positives), and so on.
struct ConfusionCounts {
  std::vector<double> true_positives, false_positives, true_negatives, false_negatives;
};

/// `evenly` selects Keras's bucketed path (thresholds i / (n - 1); predictions clipped to [0, 1]
/// and placed in bucket ceil(p * (n - 1)) - 1, with_epsilon moving bucket -1 to 0), otherwise
/// each prediction is compared with each threshold.
ConfusionCounts confusion_counts(const std::string& metric, const Tensor& y_true,
                                 const Tensor& y_pred, const Tensor& sample_weight,
                                 const std::vector<double>& thresholds, bool evenly,
                                 bool with_epsilon, bool sigmoid_first = false);

}  // namespace tandem::metrics::detail
