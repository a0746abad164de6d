// Per-replica state: ReplicaLocal<T> (one slot per replica, created on demand) and
// ReplicaGenerators (the per-replica random streams that dropout draws from).
// Each replica thread touches only its own slot; readers combine slots in cross-replica context.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "tandem/autograd/variable.h"
#include "tandem/core/error.h"
#include "tandem/tensor/random.h"

namespace tandem::nn {

/// One T per replica, indexed by current_replica_binding().replica_id and created on demand
/// (default-constructed, or by the factory given to the constructor). Slots never move once
/// created, so a replica may keep using its reference while other replicas add theirs.
template <typename T>
class ReplicaLocal {
 public:
  /// Makes replica `replica`'s slot when it is first used.
  using Factory = std::function<T(int replica)>;
  /// Slots are default-constructed.
  ReplicaLocal() = default;
  /// Slots are made by `factory`.
  explicit ReplicaLocal(Factory factory) : factory_(std::move(factory)) {}
  ReplicaLocal(const ReplicaLocal&) = delete;
  ReplicaLocal& operator=(const ReplicaLocal&) = delete;

  /// The calling replica's slot.
  T& local() { return at(current_replica_binding().replica_id); }
  /// Replica `replica`'s slot (created if missing).
  T& at(int replica) {
    TANDEM_CHECK(replica >= 0, "ReplicaLocal: negative replica id ", replica);
    std::lock_guard<std::mutex> lock(mutex_);
    while (static_cast<int>(slots_.size()) <= replica) {
      const int id = static_cast<int>(slots_.size());
      slots_.push_back(std::make_unique<T>(factory_ ? factory_(id) : T{}));
    }
    return *slots_[replica];
  }
  /// Number of slots created so far.
  int size() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return static_cast<int>(slots_.size());
  }
  /// Calls fn(replica, slot) for every slot, in replica order (cross-replica context).
  template <typename Fn>
  void for_each(Fn&& fn) const {
    std::lock_guard<std::mutex> lock(mutex_);
    for (size_t i = 0; i < slots_.size(); ++i) fn(static_cast<int>(i), *slots_[i]);
  }
  /// Drops every slot (they are recreated on demand).
  void clear() {
    std::lock_guard<std::mutex> lock(mutex_);
    slots_.clear();
  }

 private:
  Factory factory_;
  mutable std::mutex mutex_;
  std::vector<std::unique_ptr<T>> slots_;
};

/// The random streams of a model's stochastic layers (Dropout): replica r draws from
/// Generator(seed, /*stream=*/r + 1). Stream 0 of the same seed is the one weight initialisers
/// use (see Module::build), so masks never repeat initial values. All Dropout layers of a
/// Sequential share one ReplicaGenerators and draw from it in call order.
class ReplicaGenerators {
 public:
  /// Streams under `seed`; replica r's generator is Generator(seed, r + 1).
  explicit ReplicaGenerators(uint64_t seed = 0);

  /// The seed of every replica's stream (the last reseed()'s).
  uint64_t seed() const { return seed_; }
  /// Restarts every replica's stream from `seed`.
  void reseed(uint64_t seed);
  /// The calling replica's generator.
  Generator& local();
  /// Generator states {seed, stream, offset, 0} per replica created so far (for checkpoints).
  std::vector<std::array<uint64_t, 4>> states() const;
  /// Restores states saved by states(); replicas beyond the list start fresh.
  void set_states(const std::vector<std::array<uint64_t, 4>>& states);

 private:
  uint64_t seed_;
  std::unique_ptr<ReplicaLocal<Generator>> generators_;
};

}  // namespace tandem::nn
