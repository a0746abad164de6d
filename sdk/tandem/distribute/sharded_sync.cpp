// Optimizer-state sharding's collectives on a ReplicaContext: the owned shards of the gradients
// reduce-scattered to their owners, and the updated shards of the variables all-gathered back.
// Across workers both pack the shards by owner into flat chunks of a bounded size (one
// collective moves many shards, and no replica holds more than its own sums plus one chunk);
// the replicas of one process reach each other's tensors, so there each shard goes alone.
#include <algorithm>

#include "tandem/autograd/tape.h"
#include "tandem/core/error.h"
#include "tandem/distribute/internal/gradient_reducer.h"
#include "tandem/distribute/replica_context.h"
#include "tandem/distribute/strategy.h"
#include "tandem/ops/ops.h"

namespace tandem {

namespace {

using Shard = optim::GradientSync::Shard;

/// Each shard starts this many elements into the flat layout (64 bytes of float32), so that
/// its view of a buffer is aligned as a tensor of its own is.
constexpr int64_t kAlign = 16;
/// The flat chunk one collective moves, in bytes (every replica's slices together).
constexpr int64_t kChunkBytes = int64_t{32} << 20;

/// Where shard `shard` lies in a flat layout: elements [at, at + length).
struct Member {
  size_t shard = 0;
  int64_t at = 0;
  int64_t length = 0;
};

/// The owned shards of one dtype, laid out by owner (in shard order within each): replica r's
/// region is [offsets[r], offsets[r + 1]).
struct FlatLayout {
  DType dtype = DType::kFloat32;
  std::vector<Member> members;
  std::vector<int64_t> offsets;
};

std::vector<FlatLayout> flat_layouts(const std::vector<Tensor>& tensors,
                                     const std::vector<Shard>& shards, int replicas) {
  std::vector<FlatLayout> out;
  for (const Shard& s : shards) {
    if (s.owner < 0) continue;
    const DType dtype = tensors[s.index].dtype();
    if (std::none_of(out.begin(), out.end(), [&](const FlatLayout& f) { return f.dtype == dtype; }))
      out.push_back({.dtype = dtype, .members = {}, .offsets = {}});
  }
  for (FlatLayout& f : out) {
    f.offsets.assign(static_cast<size_t>(replicas) + 1, 0);
    int64_t at = 0;
    for (int r = 0; r < replicas; ++r) {
      for (size_t k = 0; k < shards.size(); ++k) {
        if (shards[k].owner != r || tensors[shards[k].index].dtype() != f.dtype) continue;
        const int64_t length = shards[k].end - shards[k].begin;
        f.members.push_back({.shard = k, .at = at, .length = length});
        at += (length + kAlign - 1) / kAlign * kAlign;
      }
      f.offsets[static_cast<size_t>(r) + 1] = at;
    }
  }
  return out;
}

/// Elements [begin, end) of the flattened `t`, as a 1-D view.
Tensor flat_part(const Tensor& t, int64_t begin, int64_t end) {
  return t.view_as(Shape{end - begin}, static_cast<size_t>(begin) * dtype_size(t.dtype()));
}

/// The rounds a layout is moved in: each replica's region in as many equal slices, every
/// replica's slice r of a round together at most about kChunkBytes.
struct Rounds {
  int64_t count = 1;
  std::vector<int64_t> slice;  // per replica, elements

  Rounds(const FlatLayout& f, int replicas) {
    const int64_t per_replica = std::max<int64_t>(
        kAlign, kChunkBytes / replicas / static_cast<int64_t>(dtype_size(f.dtype)));
    for (int r = 0; r < replicas; ++r)
      count = std::max(count, (region(f, r) + per_replica - 1) / per_replica);
    for (int r = 0; r < replicas; ++r) slice.push_back((region(f, r) + count - 1) / count);
  }
  static int64_t region(const FlatLayout& f, int r) {
    return f.offsets[static_cast<size_t>(r) + 1] - f.offsets[static_cast<size_t>(r)];
  }
  /// Replica r's slice of round j: flat elements [first, last).
  std::pair<int64_t, int64_t> of(const FlatLayout& f, int r, int64_t j) const {
    const int64_t begin = f.offsets[static_cast<size_t>(r)];
    const int64_t n = region(f, r), s = slice[static_cast<size_t>(r)];
    return {begin + std::min(j * s, n), begin + std::min((j + 1) * s, n)};
  }
  /// The chunk of round j: where each replica's slice starts in it (replicas + 1 entries).
  std::vector<int64_t> chunk_offsets(const FlatLayout& f, int64_t j) const {
    std::vector<int64_t> out(slice.size() + 1, 0);
    for (size_t r = 0; r < slice.size(); ++r) {
      const auto [first, last] = of(f, static_cast<int>(r), j);
      out[r + 1] = out[r] + (last - first);
    }
    return out;
  }
  int64_t max_chunk() const {
    int64_t out = 0;
    for (const int64_t s : slice) out += s;
    return out;
  }
};

/// Calls fn(member, from, to, position) for each run of a member's elements [from, to) that lies
/// in flat elements [begin, end); `position` is the flat element of `from`.
template <typename Fn>
void for_each_piece(const FlatLayout& f, int64_t begin, int64_t end, Fn&& fn) {
  for (const Member& m : f.members) {
    const int64_t lo = std::max(begin, m.at), hi = std::min(end, m.at + m.length);
    if (lo < hi) fn(m, lo - m.at, hi - m.at, lo);
  }
}

void check_shards(const std::vector<Tensor>& tensors, const std::vector<Shard>& shards,
                  int replicas, const char* what) {
  for (const Shard& s : shards) {
    TANDEM_CHECK(s.index < tensors.size() && tensors[s.index].defined(), what, ": shard of entry ",
                 s.index, " names no defined tensor (", tensors.size(), " given)");
    TANDEM_CHECK(s.owner >= -1 && s.owner < replicas && s.begin >= 0 && s.begin <= s.end &&
                     s.end <= tensors[s.index].numel(),
                 what, ": shard [", s.begin, ", ", s.end, ") of entry ", s.index, " owned by ",
                 s.owner, " does not fit ", tensors[s.index].numel(), " elements and ", replicas,
                 " replicas");
  }
}

}  // namespace

bool ReplicaContext::reduces_to_owners() const {
  return num_replicas_ == 1 || (communicator_->reduce_scatters_for_real() &&
                                reducer_->wire_dtype(DType::kFloat32) == DType::kFloat32);
}

std::vector<Tensor> ReplicaContext::sum_to_owners(const std::vector<Tensor>& gradients,
                                                  const std::vector<Shard>& shards) {
  check_shards(gradients, shards, num_replicas_, "sum_to_owners");
  const autograd::NoRecordGuard no_record;
  std::vector<Tensor> out(shards.size());
  const auto keep = [&](const std::vector<Tensor>& sums) {
    for (size_t k = 0; k < shards.size(); ++k)
      if (shards[k].owner < 0 || shards[k].owner == replica_id_)
        out[k] = flat_part(sums[shards[k].index], shards[k].begin, shards[k].end);
    return out;
  };
  if (num_replicas_ == 1) return keep(gradients);
  // No gradient bucket packs while the gradients are summed here.
  reducer_->stand_by();
  // Compressed gradients travel as the all-reduce sends them (the owners keep theirs).
  if (reducer_->wire_dtype(DType::kFloat32) != DType::kFloat32)
    return keep(all_reduce_gradients(gradients));
  // Shards every replica holds (variables that are not mirrored): one all-reduce.
  std::vector<Tensor> shared;
  std::vector<size_t> shared_shards;
  for (size_t k = 0; k < shards.size(); ++k) {
    if (shards[k].owner >= 0) continue;
    shared.push_back(gradients[shards[k].index]);
    shared_shards.push_back(k);
  }
  if (!shared.empty()) {
    const std::vector<Tensor> sums = all_reduce(ReduceOp::kSum, shared);
    for (size_t j = 0; j < shared.size(); ++j) {
      const Shard& s = shards[shared_shards[j]];
      out[shared_shards[j]] = flat_part(sums[j], s.begin, s.end);
    }
  }
  if (strategy_->num_workers() <= 1) {
    // Replicas of one process read each other's gradients where they lie: each shard reduced
    // to its owner alone (a flat reduce-scatter whose one nonempty range is the owner's), no
    // packing.
    std::vector<int64_t> offsets(static_cast<size_t>(num_replicas_) + 1);
    for (size_t k = 0; k < shards.size(); ++k) {
      const Shard& s = shards[k];
      if (s.owner < 0) continue;
      const int64_t n = s.end - s.begin;
      for (int r = 0; r <= num_replicas_; ++r)
        offsets[static_cast<size_t>(r)] = r <= s.owner ? 0 : n;
      Tensor sum;
      communicator_->reduce_scatter(flat_part(gradients[s.index], s.begin, s.end), sum, offsets)
          ->wait();
      if (s.owner == replica_id_) out[k] = sum;
    }
    return out;
  }
  for (const FlatLayout& f : flat_layouts(gradients, shards, num_replicas_)) {
    const Rounds rounds(f, num_replicas_);
    const Device device = gradients[shards[f.members.front().shard].index].device();
    Tensor mine = Tensor::empty(Shape{Rounds::region(f, replica_id_)}, f.dtype, device);
    Tensor chunk = Tensor::empty(Shape{rounds.max_chunk()}, f.dtype, device);
    for (int64_t j = 0; j < rounds.count; ++j) {
      const std::vector<int64_t> offsets = rounds.chunk_offsets(f, j);
      for (int r = 0; r < num_replicas_; ++r) {
        const auto [first, last] = rounds.of(f, r, j);
        const int64_t into = offsets[static_cast<size_t>(r)] - first;
        for_each_piece(f, first, last, [&](const Member& m, int64_t from, int64_t to, int64_t at) {
          const Shard& s = shards[m.shard];
          Tensor target = flat_part(chunk, into + at, into + at + (to - from));
          target.copy_from(flat_part(gradients[s.index], s.begin + from, s.begin + to));
        });
      }
      const auto [first, last] = rounds.of(f, replica_id_, j);
      const int64_t base = f.offsets[static_cast<size_t>(replica_id_)];
      Tensor sums = flat_part(mine, first - base, last - base);
      const Tensor input = flat_part(chunk, 0, offsets.back());
      communicator_->reduce_scatter(input, sums, offsets)->wait();
    }
    const int64_t base = f.offsets[static_cast<size_t>(replica_id_)];
    for (const Member& m : f.members)
      if (shards[m.shard].owner == replica_id_)
        out[m.shard] = flat_part(mine, m.at - base, m.at - base + m.length);
  }
  return out;
}

void ReplicaContext::gather_from_owners(const std::vector<Tensor>& values,
                                        const std::vector<Shard>& shards) {
  check_shards(values, shards, num_replicas_, "gather_from_owners");
  if (num_replicas_ == 1) return;
  const autograd::NoRecordGuard no_record;
  reducer_->wait_in_flight();
  if (strategy_->num_workers() <= 1) {
    // Replicas of one process copy each shard from its owner's variable, no packing.
    std::vector<int64_t> offsets(static_cast<size_t>(num_replicas_) + 1);
    for (const Shard& s : shards) {
      if (s.owner < 0) continue;
      const int64_t n = s.end - s.begin;
      for (int r = 0; r <= num_replicas_; ++r)
        offsets[static_cast<size_t>(r)] = r <= s.owner ? 0 : n;
      Tensor value = flat_part(values[s.index], s.begin, s.end);
      communicator_->all_gather(value, offsets)->wait();
    }
    return;
  }
  for (const FlatLayout& f : flat_layouts(values, shards, num_replicas_)) {
    const Rounds rounds(f, num_replicas_);
    const Device device = values[shards[f.members.front().shard].index].device();
    Tensor chunk = Tensor::empty(Shape{rounds.max_chunk()}, f.dtype, device);
    for (int64_t j = 0; j < rounds.count; ++j) {
      const std::vector<int64_t> offsets = rounds.chunk_offsets(f, j);
      const auto pieces = [&](int r, bool pack) {
        const auto [first, last] = rounds.of(f, r, j);
        const int64_t into = offsets[static_cast<size_t>(r)] - first;
        for_each_piece(f, first, last, [&](const Member& m, int64_t from, int64_t to, int64_t at) {
          const Shard& s = shards[m.shard];
          Tensor packed = flat_part(chunk, into + at, into + at + (to - from));
          Tensor value = flat_part(values[s.index], s.begin + from, s.begin + to);
          if (pack)
            packed.copy_from(value);
          else
            value.copy_from(packed);
        });
      };
      pieces(replica_id_, /*pack=*/true);
      Tensor buffer = flat_part(chunk, 0, offsets.back());
      communicator_->all_gather(buffer, offsets)->wait();
      for (int r = 0; r < num_replicas_; ++r)
        if (r != replica_id_) pieces(r, /*pack=*/false);
    }
  }
}

}  // namespace tandem
