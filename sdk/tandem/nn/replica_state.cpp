// ReplicaGenerators: per-replica Philox streams for dropout.
#include "tandem/nn/replica_state.h"

namespace tandem::nn {

namespace {
std::unique_ptr<ReplicaLocal<Generator>> make_generators(uint64_t seed) {
  return std::make_unique<ReplicaLocal<Generator>>([seed](int replica) {
    // Stream 1 + the global replica id: replicas of different workers draw differently.
    const int global = current_replica_binding().first_global_id + replica;
    return Generator(seed, static_cast<uint64_t>(global) + 1);
  });
}
}  // namespace

ReplicaGenerators::ReplicaGenerators(uint64_t seed)
    : seed_(seed), generators_(make_generators(seed)) {}

void ReplicaGenerators::reseed(uint64_t seed) {
  seed_ = seed;
  generators_ = make_generators(seed);
}

Generator& ReplicaGenerators::local() { return generators_->local(); }

std::vector<std::array<uint64_t, 4>> ReplicaGenerators::states() const {
  std::vector<std::array<uint64_t, 4>> out;
  generators_->for_each([&](int, const Generator& g) { out.push_back(g.state()); });
  return out;
}

void ReplicaGenerators::set_states(const std::vector<std::array<uint64_t, 4>>& states) {
  if (!states.empty()) reseed(states[0][0]);
  for (size_t i = 0; i < states.size(); ++i) {
    // Row i is local replica i's position (seed, offset). Its stream is 1 + the global replica
    // id, which differs between workers: a checkpoint the chief wrote restores every worker's
    // replicas onto their own streams, at the chief's offsets (every replica draws alike).
    std::array<uint64_t, 4> state = states[i];
    state[1] = static_cast<uint64_t>(process_replica_offset()) + i + 1;
    generators_->at(static_cast<int>(i)).set_state(state);
  }
}

}  // namespace tandem::nn
