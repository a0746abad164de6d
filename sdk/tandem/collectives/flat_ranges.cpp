// The checks, descriptions and digests of the flat collectives' arguments.
#include "tandem/collectives/internal/flat_ranges.h"

#include <sstream>

#include "tandem/core/error.h"

namespace tandem::collectives {

std::string flat_ranges_problem(const Tensor& buffer, std::span<const int64_t> offsets, int ranks,
                                const char* what, bool reduce) {
  if (!buffer.defined()) return detail::str_cat(what, " is undefined");
  if (buffer.rank() != 1)
    return detail::str_cat(what, " is ", buffer.dtype(), buffer.shape(),
                           "; it must be 1-D (one flat buffer: reshape it to [", buffer.numel(),
                           "])");
  if (reduce && buffer.dtype() == DType::kBool)
    return detail::str_cat(what, " is bool; only numeric tensors can be reduced");
  const auto expected = static_cast<size_t>(ranks) + 1;
  if (offsets.size() != expected)
    return detail::str_cat("offsets has ", offsets.size(), " entries ", describe_offsets(offsets),
                           "; ", ranks, " ranks need ", expected, " (offsets[0] = 0, ..., offsets[",
                           ranks, "] = ", buffer.numel(), ")");
  if (offsets[0] != 0)
    return detail::str_cat("offsets[0] is ", offsets[0], " in ", describe_offsets(offsets),
                           "; the first range starts at 0");
  for (size_t r = 1; r < offsets.size(); ++r)
    if (offsets[r] < offsets[r - 1])
      return detail::str_cat("offsets[", r, "] = ", offsets[r], " is less than offsets[", r - 1,
                             "] = ", offsets[r - 1], " in ", describe_offsets(offsets),
                             "; the offsets must be nondecreasing (the ranges in rank order)");
  if (offsets.back() != buffer.numel())
    return detail::str_cat("offsets[", ranks, "] = ", offsets.back(), " in ",
                           describe_offsets(offsets), " but ", what, " has ", buffer.numel(),
                           " elements; the last offset must be the buffer's numel");
  return {};
}

std::string flat_output_problem(const Tensor& input, const Tensor& output,
                                std::span<const int64_t> offsets, int rank) {
  const auto r = static_cast<size_t>(rank);
  const int64_t length = offsets[r + 1] - offsets[r];
  if (output.defined() && output.rank() == 1 && output.numel() == length &&
      output.dtype() == input.dtype() && output.device() == input.device())
    return {};
  return detail::str_cat(
      "the output is ",
      output.defined() ? detail::str_cat(output.dtype(), output.shape(), " on ", output.device())
                       : std::string("undefined"),
      "; rank ", rank, "'s range [", offsets[r], ", ", offsets[r + 1], ") needs ", input.dtype(),
      "[", length, "] on ", input.device());
}

void check_worker_ranges(const Tensor& buffer, std::span<const int64_t> offsets, int workers,
                         const char* transport, const char* label, bool reduce) {
  const std::string problem = flat_ranges_problem(buffer, offsets, workers, "the buffer", reduce);
  TANDEM_CHECK(problem.empty(), transport, " ", label, ": ", problem);
  TANDEM_CHECK(buffer.device().is_cpu(), transport, " ", label,
               ": the buffer must be a CPU tensor, not on ", buffer.device());
}

std::string describe_offsets(std::span<const int64_t> offsets) {
  constexpr size_t kShown = 12;
  std::ostringstream out;
  out << "[";
  for (size_t i = 0; i < offsets.size(); ++i) {
    if (offsets.size() > kShown && i == kShown / 2) {
      out << ", ...";
      i = offsets.size() - kShown / 2;
    }
    out << (i ? ", " : "") << offsets[i];
  }
  out << "]";
  return out.str();
}

int64_t offsets_digest(std::span<const int64_t> offsets) {
  uint64_t hash = 1469598103934665603ull;  // FNV-1a, as call_signature
  for (const int64_t offset : offsets) {
    for (size_t i = 0; i < sizeof(offset); ++i) {
      hash ^= static_cast<uint64_t>(offset) >> (8 * i) & 0xff;
      hash *= 1099511628211ull;
    }
  }
  return static_cast<int64_t>(hash);
}

std::vector<int64_t> group_offsets(std::span<const int64_t> offsets, int group) {
  std::vector<int64_t> out;
  for (size_t k = 0; k < offsets.size(); k += static_cast<size_t>(group)) out.push_back(offsets[k]);
  return out;
}

}  // namespace tandem::collectives
