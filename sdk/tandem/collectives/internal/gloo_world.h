// GlooWorld: the workers of a job started from TF_CONFIG (each worker started by hand, by a
// Kubernetes operator or a scheduler, without mpirun), as WorkerCollectives over Gloo's TCP
// transport. The workers meet at the chief's TcpStore, which also bootstraps Gloo's full mesh.
// Built only with Gloo.
#pragma once

#include <chrono>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "tandem/collectives/internal/tcp_store.h"
#include "tandem/collectives/internal/worker_collectives.h"

namespace gloo {
class Context;
}

namespace tandem::collectives {

class GlooWorld final : public WorkerCollectives {
 public:
  /// Worker `rank` of the workers at `addresses` ("host:port", the chief's first), which met at
  /// the chief's `store`: every pair of workers connects over TCP on this worker's host. Workers
  /// may start in any order within the collective timeout; one that never starts is named.
  GlooWorld(int rank, std::vector<std::string> addresses, std::shared_ptr<TcpStore> store);
  ~GlooWorld() override;

  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(addresses_.size()); }
  std::string name() const override { return "gloo"; }
  bool waits_without_polling() const override { return true; }

  /// Gloo's ring all-reduce, one call per dtype (tensors of a dtype packed into one buffer):
  /// every worker gets the same bits.
  void all_reduce(std::vector<Tensor>& tensors, ReduceOp op, const char* label) override;
  /// Gloo's ring all-reduce splits the buffer into pieces by its length and the worker count,
  /// and adds each piece's contributions starting from a different worker: a reduce-scatter
  /// cannot promise that order. This is therefore all_reduce of the whole buffer (the same
  /// call, the same bits), of which this worker keeps its range.
  void reduce_scatter(Tensor& buffer, std::span<const int64_t> offsets, ReduceOp op,
                      const char* label) override;
  /// Gloo's ring all-gather, in place, of the workers' ranges.
  void all_gather(Tensor& buffer, std::span<const int64_t> offsets, const char* label) override;
  void broadcast(std::vector<Tensor>& tensors, int root, const char* label) override;
  std::vector<std::vector<char>> all_gather(const std::vector<char>& mine,
                                            const char* label) override;
  std::vector<std::vector<Tensor>> all_gather_tensors(const std::vector<Tensor>& mine,
                                                      const char* label) override;
  void barrier(const char* label) override;

  /// The store the workers met at.
  TcpStore& store() { return *store_; }
  /// "worker K (host:port)".
  std::string describe(int worker) const;

 private:
  /// Runs one Gloo collective: raises a tandem::Error naming the call, this worker and the
  /// cause (a peer that died or did not arrive within the timeout); afterwards every call
  /// raises at once.
  /// Why a collective failed, by name: the workers whose connection to the chief's store
  /// closed (they are gone), or those that did not reach this point (they are stuck).
  std::string who_is_missing();
  /// On the chief, once `gone` (worker, seconds ago) left: keeps its store up until every other
  /// survivor has said it stopped (at most 2 s), so that each learns who left from it.
  void keep_store_for_survivors(const std::vector<std::pair<int, double>>& gone);
  template <typename Fn>
  void run(const char* what, const char* label, Fn&& fn);
  /// Before each collective: every worker shares the call's signature (its number, `label` and
  /// `parameters`: sizes, dtypes, op, root, hashed) in one small all-gather, and raises naming
  /// the workers whose call differs, before any data call could pair up wrongly. Up to 4 KiB
  /// of `payload` ride along; returns every worker's record (signature, then payload).
  std::vector<char> agree(const char* label, const std::vector<int64_t>& parameters,
                          const void* payload = nullptr, size_t bytes = 0);

  /// all_reduce after agreeing on `signature` (all_reduce_parameters, and a flat
  /// reduce_scatter's offsets).
  void all_reduce(std::vector<Tensor>& tensors, ReduceOp op, const char* label,
                  const std::vector<int64_t>& signature);

  int rank_;
  std::vector<std::string> addresses_;
  std::shared_ptr<TcpStore> store_;
  std::shared_ptr<gloo::Context> context_;
  uint32_t tag_ = 0;
  uint64_t calls_ = 0;
  std::string broken_;  // why the world is unusable; empty while it works
};

}  // namespace tandem::collectives
