// Generator: a Philox4x32-10 stream (seed, stream) with a block offset. Replicas draw identical
// numbers from the same (seed, stream) and independent ones from different streams; the state
// (seed, stream, offset) is three integers, saved and restored by checkpoints.
#pragma once

#include <array>
#include <cstdint>

namespace tandem {

/// A Philox4x32-10 random stream: (seed, stream) name the sequence, offset() is how far it has
/// been read. Tensor::uniform, Tensor::normal, dropout and the dataset shuffles draw from one.
/// Copies continue independently from the same point.
class Generator {
 public:
  /// Stream `stream` of `seed`, from its start. Different streams of one seed are independent.
  explicit Generator(uint64_t seed = 0, uint64_t stream = 0) : seed_(seed), stream_(stream) {}

  /// The seed given at construction (or by set_state()).
  uint64_t seed() const { return seed_; }
  /// The stream given at construction (or by set_state()).
  uint64_t stream() const { return stream_; }
  /// Philox blocks (4 x 32 bits each) consumed so far.
  uint64_t offset() const { return offset_; }

  /// Reserves `blocks` consecutive blocks and returns the first one's index. Kernels then
  /// compute block (first + i) for their element i without touching the generator.
  uint64_t reserve(uint64_t blocks) {
    const uint64_t first = offset_;
    offset_ += blocks;
    return first;
  }

  /// Next 32 random bits (consumes a whole block; for scalar draws such as shuffles).
  uint32_t next_u32();
  /// Uniform integer in [0, bound) without modulo bias; bound > 0.
  uint64_t uniform_int(uint64_t bound);
  /// Uniform double in [0, 1).
  double next_double();

  /// {seed, stream, offset, 0}: the layout of rng/replica_state rows in checkpoints.
  std::array<uint64_t, 4> state() const { return {seed_, stream_, offset_, 0}; }
  /// Continues from a state() (the fourth entry is ignored).
  void set_state(const std::array<uint64_t, 4>& state) {
    seed_ = state[0];
    stream_ = state[1];
    offset_ = state[2];
  }

  /// True when both are at the same point of the same stream.
  friend bool operator==(const Generator& a, const Generator& b) {
    return a.state() == b.state();
  }

 private:
  uint64_t seed_;
  uint64_t stream_;
  uint64_t offset_ = 0;
};

}  // namespace tandem
