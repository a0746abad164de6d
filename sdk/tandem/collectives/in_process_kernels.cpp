// The data phases of the in_process collectives: the fixed-order reduction of one rank's slice
// over every rank's buffer (CPU loops; a kernel for replicas sharing a GPU) and the copies.
#include <algorithm>
#include <cstring>

#if defined(__x86_64__)
#include <emmintrin.h>
#endif

#include "tandem/collectives/internal/in_process_state.h"
#include "tandem/collectives/internal/reduce_in_order.h"

#if TANDEM_WITH_CUDA
#include "tandem/collectives/internal/cuda_in_process.h"
#endif

namespace tandem::collectives::in_process {

namespace {

/// Out-of-place outputs at least this large (bytes per rank) are written with non-temporal
/// stores: they do not fit in the caches next to their peers anyway, and streaming stores skip
/// the read-for-ownership of every destination line (a third of the traffic). In place, the
/// destination line was just read as a source and is in cache, so ordinary stores win there
/// (measured on the 2-core EPYC: 64 MiB in place 3.4 vs 1.9 GB/s, out of place 1.4 vs 1.9).
constexpr size_t kStreamingBytes = size_t{8} << 20;

/// Copies `bytes` from `src` (in L1) to `dst`; with `stream`, through non-temporal stores
/// (the caller issues the store fence before other threads read `dst`).
inline void store_block(void* dst, const void* src, size_t bytes, bool stream) {
#if defined(__x86_64__)
  if (stream) {
    char* d = static_cast<char*>(dst);
    const char* from = static_cast<const char*>(src);
    size_t head = (16 - (reinterpret_cast<uintptr_t>(d) & 15)) & 15;
    head = std::min(head, bytes);
    std::memcpy(d, from, head);
    size_t i = head;
    for (; i + 16 <= bytes; i += 16)
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + i),
                       _mm_loadu_si128(reinterpret_cast<const __m128i*>(from + i)));
    std::memcpy(d + i, from + i, bytes - i);
    return;
  }
#endif
  (void)stream;
  std::memcpy(dst, src, bytes);
}

/// Orders this thread's non-temporal stores before its later stores (the closing
/// rendezvous's mutex), so peers that pass the rendezvous see the results.
inline void store_fence(bool streamed) {
#if defined(__x86_64__)
  if (streamed) _mm_sfence();
#endif
  (void)streamed;
}

/// dst[j][i] = reduce over k of src[k][i] for i < count, summing in the order k = 0, 1, ...
/// Works in blocks whose accumulator stays in L1 while the sources stream through it.
template <typename T>
void reduce_slice(const void* const* src, int num_src, void* const* dst, int num_dst, int64_t count,
                  ReduceOp op, bool stream) {
  constexpr int64_t kBlock = 8192 / static_cast<int64_t>(sizeof(T));
  alignas(64) T acc[kBlock];
  for (int64_t done = 0; done < count; done += kBlock) {
    const int64_t len = std::min(kBlock, count - done);
    const size_t bytes = static_cast<size_t>(len) * sizeof(T);
    std::memcpy(acc, static_cast<const T*>(src[0]) + done, bytes);
    detail::reduce_in_order(acc, len, num_src, op,
                            [&](int64_t k) { return static_cast<const T*>(src[k]) + done; });
    // Sources for this block were all read above, so writing in place is safe.
    for (int k = 0; k < num_dst; ++k)
      store_block(static_cast<T*>(dst[k]) + done, acc, bytes, stream && dst[k] != src[k]);
  }
}

void reduce_slice(DType dtype, const void* const* src, int num_src, void* const* dst, int num_dst,
                  int64_t count, ReduceOp op, bool stream) {
  dispatch_any_numeric(dtype, "all_reduce", [&]<typename T>() {
    reduce_slice<T>(src, num_src, dst, num_dst, count, op, stream);
  });
}

}  // namespace

void reduce_slice_on(Device device, DType dtype, const void* const* src, int num_src,
                     void* const* dst, int num_dst, int64_t count, ReduceOp op, bool stream) {
  if (device.is_cpu()) {
    reduce_slice(dtype, src, num_src, dst, num_dst, count, op, stream);
    return;
  }
#if TANDEM_WITH_CUDA
  cuda_in_process::reduce_slice(device, dtype, src, num_src, dst, num_dst, count, op);
#else
  TANDEM_THROW("in_process collectives: ", device, " tensors need a CUDA build");
#endif
}

void copy_on(Device device, void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  if (device.is_cpu()) {
    std::memcpy(dst, src, bytes);
    return;
  }
#if TANDEM_WITH_CUDA
  cuda_in_process::copy(device, dst, src, bytes);
#else
  TANDEM_THROW("in_process collectives: ", device, " tensors need a CUDA build");
#endif
}

namespace {

/// Elements per rank slice: an equal share, rounded up to whole cache lines, and not below a
/// floor under which splitting costs more in cache traffic than it saves.
int64_t slice_elements(int64_t total, int ranks) {
  constexpr int64_t kGranule = 64;
  constexpr int64_t kMinSlice = 16 * 1024;
  int64_t part = (total + ranks - 1) / ranks;
  part = (part + kGranule - 1) / kGranule * kGranule;
  return std::max(part, kMinSlice);
}

}  // namespace

void all_reduce_phase(State& s, int rank, ReduceOp op) {
  const std::vector<Tensor>& layout = *s.calls[0].inputs;
  int64_t total = 0;
  size_t bytes = 0;
  for (const Tensor& t : layout) {
    total += t.numel();
    bytes += t.nbytes();
  }
  const bool stream = bytes >= kStreamingBytes;
  const int64_t part = slice_elements(total, s.size);
  const int64_t begin = std::min(total, rank * part);
  const int64_t end = std::min(total, begin + part);
  if (begin >= end) return;
  const void** src = s.src[rank].data();
  void** dst = s.dst[rank].data();
  int64_t offset = 0;  // flattened index of tensor i's first element
  for (size_t i = 0; i < layout.size() && offset < end; ++i) {
    const int64_t numel = layout[i].numel();
    const int64_t lo = std::max(begin, offset);
    const int64_t hi = std::min(end, offset + numel);
    if (lo < hi) {
      const size_t skip = static_cast<size_t>(lo - offset) * dtype_size(layout[i].dtype());
      for (int k = 0; k < s.size; ++k) {
        src[k] = static_cast<const char*>((*s.calls[k].inputs)[i].raw_data()) + skip;
        dst[k] = static_cast<char*>((*s.calls[k].outputs)[i].raw_data()) + skip;
      }
      reduce_slice_on(s.calls[rank].device, layout[i].dtype(), src, s.size, dst, s.size, hi - lo,
                      op, stream);
    }
    offset += numel;
  }
  if (s.calls[rank].device.is_cpu()) store_fence(stream);
}

void reduce_scatter_ranges_phase(State& s, int rank, ReduceOp op) {
  const Call& mine = s.calls[rank];
  const std::span<const int64_t> offsets = mine.offsets;  // every rank's (checked equal)
  const DType dtype = mine.input->dtype();
  const int64_t total = mine.input->numel();
  const size_t element = dtype_size(dtype);
  // The work is split as all_reduce splits it, whatever the ranges: uneven or empty ranges
  // still keep every rank busy, and the result does not depend on who reduces an element.
  const bool stream = mine.input->nbytes() >= kStreamingBytes;
  const int64_t part = slice_elements(total, s.size);
  const int64_t begin = std::min(total, rank * part);
  const int64_t end = std::min(total, begin + part);
  const void** src = s.src[rank].data();
  void** dst = s.dst[rank].data();
  for (int owner = 0; owner < s.size && begin < end; ++owner) {
    const int64_t lo = std::max(begin, offsets[static_cast<size_t>(owner)]);
    const int64_t hi = std::min(end, offsets[static_cast<size_t>(owner) + 1]);
    if (lo >= hi) continue;
    for (int k = 0; k < s.size; ++k)
      src[k] = static_cast<const char*>(s.calls[k].input->raw_data()) +
               static_cast<size_t>(lo) * element;
    dst[0] = static_cast<char*>(s.calls[owner].output->raw_data()) +
             static_cast<size_t>(lo - offsets[static_cast<size_t>(owner)]) * element;
    reduce_slice_on(mine.device, dtype, src, s.size, dst, /*num_dst=*/1, hi - lo, op, stream);
  }
  if (mine.device.is_cpu()) store_fence(stream);
}

void all_gather_ranges_phase(State& s, int rank) {
  const Call& mine = s.calls[rank];
  const size_t element = dtype_size(mine.input->dtype());
  char* into = static_cast<char*>(mine.input->raw_data());
  // Each rank pulls the peers' ranges into its own buffer: the ranks copy in parallel, and no
  // rank writes the range its peers read (rank k's own range of rank k's buffer).
  for (int k = 0; k < s.size; ++k) {
    if (k == rank) continue;
    const auto at = static_cast<size_t>(mine.offsets[static_cast<size_t>(k)]) * element;
    const auto bytes = static_cast<size_t>(mine.offsets[static_cast<size_t>(k) + 1] -
                                           mine.offsets[static_cast<size_t>(k)]) *
                       element;
    copy_on(mine.device, into + at, static_cast<const char*>(s.calls[k].input->raw_data()) + at,
            bytes);
  }
}

}  // namespace tandem::collectives::in_process
