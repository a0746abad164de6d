// SharedMemoryWorld: the workers of a TF_CONFIG job that all run on one machine, as
// WorkerCollectives over a shared-memory segment (the role Open MPI's shared-memory transport
// plays under mpirun): a barrier on a futex, each worker's data in a slot of its own, sums in
// worker order so that every worker gets the same bits. A worker that dies is named within
// tens of milliseconds (its process is watched), one that is stuck after the collective timeout.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "tandem/collectives/internal/tcp_store.h"
#include "tandem/collectives/internal/worker_collectives.h"

namespace tandem::collectives {

class SharedMemoryWorld final : public WorkerCollectives {
 public:
  /// Workers sharing one machine with more than this go through TCP instead.
  static constexpr int kMaxWorkers = 64;

  /// Worker `rank` of the workers at `addresses`, which met at `store`: the chief creates a
  /// segment named after the job's nonce, every worker maps it and says whether it could, and
  /// then every worker decides alike. Returns null, with the reason in `why_not`, where the
  /// workers do not share one machine (kernel, process and IPC namespaces) or the segment
  /// cannot be shared (no /dev/shm space, another user).
  static std::shared_ptr<SharedMemoryWorld> connect(int rank,
                                                    const std::vector<std::string>& addresses,
                                                    std::shared_ptr<TcpStore> store,
                                                    std::string* why_not);
  ~SharedMemoryWorld() override;
  SharedMemoryWorld(const SharedMemoryWorld&) = delete;
  SharedMemoryWorld& operator=(const SharedMemoryWorld&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(addresses_.size()); }
  std::string name() const override { return "shm"; }
  /// A waiting worker polls first (then yields its core, then sleeps on a futex), and the data
  /// moves by the workers' own copies: a communication thread would only take cycles from the
  /// backward pass, so gradient buckets start off, as under mpirun.
  bool waits_without_polling() const override { return false; }
  bool reduce_scatters_for_real() const override { return true; }

  void all_reduce(std::vector<Tensor>& tensors, ReduceOp op, const char* label) override;
  /// A true reduce-scatter: every worker puts its buffer in its slots piece by piece, and each
  /// combines only its own range, in worker order as all_reduce does (the same bits, with one
  /// barrier per piece instead of two and 1/W of the reading).
  void reduce_scatter(Tensor& buffer, std::span<const int64_t> offsets, ReduceOp op,
                      const char* label) override;
  /// The same, reading `input` and writing this worker's range into `output`.
  void reduce_scatter(const Tensor& input, Tensor& output, std::span<const int64_t> offsets,
                      ReduceOp op, const char* label) override;
  /// Each worker puts its range in its slot piece by piece and copies the others' out.
  void all_gather(Tensor& buffer, std::span<const int64_t> offsets, const char* label) override;
  void broadcast(std::vector<Tensor>& tensors, int root, const char* label) override;
  std::vector<std::vector<char>> all_gather(const std::vector<char>& mine,
                                            const char* label) override;
  std::vector<std::vector<Tensor>> all_gather_tensors(const std::vector<Tensor>& mine,
                                                      const char* label) override;
  void barrier(const char* label) override;

  /// "worker K (host:port)".
  std::string describe(int worker) const;
  /// The bytes of one slot: data moves through the segment in pieces of this size.
  size_t chunk_bytes() const { return chunk_bytes_; }

  /// The segment's control block (shared_memory_world.cpp).
  struct Segment;

 private:
  SharedMemoryWorld(int rank, std::vector<std::string> addresses, std::shared_ptr<TcpStore> store,
                    void* mapping, size_t bytes);

  /// Starts a collective: its number and signature (label, parameters) go into this worker's
  /// header with `bytes`, every worker arrives, and a worker whose call differs is named.
  /// Returns every worker's `bytes`.
  std::vector<int64_t> begin(const char* label, const std::vector<int64_t>& parameters,
                             int64_t bytes);
  /// Returns once every worker has arrived; raises naming a worker that died, failed or did
  /// not arrive within the collective timeout (the world is unusable afterwards).
  void arrive(const char* label);
  [[noreturn]] void fail(const std::string& message, bool timeout);
  char* slot(int worker, int set) const;
  char* result(int set) const;

  int rank_;
  std::vector<std::string> addresses_;
  std::shared_ptr<TcpStore> store_;  // kept: the chief serves it while the job lives
  Segment* segment_ = nullptr;
  size_t mapped_bytes_ = 0;
  size_t chunk_bytes_ = 0;
  char* data_ = nullptr;
  uint64_t calls_ = 0;      // collectives started
  uint64_t barriers_ = 0;   // barriers passed: the slot and header set is barriers_ % 2
  const char* label_ = "";  // of the collective under way, for errors
  std::string broken_;      // why the world is unusable; empty while it works
  std::vector<char> pack_;  // several tensors of one dtype, packed
};

}  // namespace tandem::collectives
