// SharedMemoryWorld: collectives between the processes of one machine through a POSIX
// shared-memory segment.
//
// Layout: a control block (the barrier's futex words; per worker its process, its failure if
// any, and two headers), then two sets of W data slots and a result slot, chunk_bytes each.
// Everything a worker writes between two barriers goes to set (barriers passed) % 2 and is read
// by the others after the next barrier; the set is written again only after one more barrier,
// which every reader reached after reading. So one barrier per piece of data suffices (two for
// a large all-reduce, whose workers each reduce a share of every piece into the result slot).
#include "tandem/collectives/internal/shared_memory_world.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>

#include "tandem/collectives/communicator.h"
#include "tandem/collectives/internal/flat_ranges.h"
#include "tandem/collectives/internal/process_watch.h"
#include "tandem/collectives/internal/reduce_in_order.h"
#include "tandem/collectives/internal/tensor_bytes.h"
#include "tandem/core/dtype.h"
#include "tandem/core/error.h"
#include "tandem/core/logging.h"
#include "tandem/core/spans.h"
#include "tandem/core/threading.h"

namespace tandem::collectives {

namespace {

using Clock = std::chrono::steady_clock;

constexpr uint64_t kMagic = 0x314d485354444e54ull;  // "TNDTSHM1"
/// All-reduces up to this many bytes are combined whole by every worker after one barrier;
/// larger ones are reduced a share per worker, with a second barrier.
constexpr size_t kSmallBytes = 64 * 1024;

/// The collective a worker is making: written before it arrives, read by the others after.
struct Header {
  int64_t call = 0;
  int64_t signature = 0;
  int64_t bytes = 0;  // all_gather: this worker's piece
};

struct alignas(64) Peer {
  std::atomic<uint64_t> arrivals{0};  // barriers this worker has arrived at
  std::atomic<uint32_t> failed{0};    // 1 once `failure` holds why this worker gave up
  int32_t pid = 0;
  uint64_t start_time = 0;  // the process's start, /proc/PID/stat field 22: tells reuse apart
  Header header[2];
  char failure[512] = {};
};

long futex(std::atomic<uint32_t>* word, int op, uint32_t value, const timespec* timeout) {
  return ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), op, value, timeout, nullptr, 0);
}

std::string to_string(const std::vector<char>& bytes) { return {bytes.begin(), bytes.end()}; }
std::vector<char> to_bytes(const std::string& text) { return {text.begin(), text.end()}; }

}  // namespace

struct SharedMemoryWorld::Segment {
  uint64_t magic = 0;
  uint64_t key[2] = {0, 0};
  int32_t size = 0;
  uint64_t chunk_bytes = 0;
  alignas(64) std::atomic<uint32_t> arrived{0};
  alignas(64) std::atomic<uint32_t> generation{0};
  std::atomic<uint32_t> sleepers{0};
  Peer peers[kMaxWorkers];
};

namespace {

size_t data_offset() { return (sizeof(SharedMemoryWorld::Segment) + 4095) / 4096 * 4096; }

/// Slots of 1 MiB for up to 7 workers, smaller beyond: the segment stays under 20 MiB
/// (containers often give /dev/shm 64 MiB).
size_t chunk_bytes_for(int workers) {
  if (workers <= 7) return size_t{1} << 20;
  return std::max<size_t>(size_t{64} << 10,
                          (size_t{8} << 20) / static_cast<size_t>(workers + 1) / 4096 * 4096);
}

size_t segment_bytes(int workers, size_t chunk) {
  return data_offset() + 2 * (static_cast<size_t>(workers) + 1) * chunk;
}

}  // namespace

// ---- joining --------------------------------------------------------------------------------

std::shared_ptr<SharedMemoryWorld> SharedMemoryWorld::connect(
    int rank, const std::vector<std::string>& addresses, std::shared_ptr<TcpStore> shared_store,
    std::string* why_not) {
  TcpStore& store = *shared_store;
  const int workers = static_cast<int>(addresses.size());
  // Same machine: the same kernel, and namespaces in which processes and segments are seen
  // alike (containers on one host may differ in both). Workers in network namespaces of their
  // own were given addresses of separate hosts: they are treated as such.
  const std::string machine = kernel_identity() + "|pid " + namespace_id("pid") + "|ipc " +
                              namespace_id("ipc") + "|net " + namespace_id("net");
  store.set("machine/" + std::to_string(rank), to_bytes(machine));
  int machines = 1;
  bool same = true;
  std::vector<std::string> seen = {machine};
  for (int w = 0; w < workers; ++w) {
    const std::string other = to_string(store.get("machine/" + std::to_string(w)));
    if (std::find(seen.begin(), seen.end(), other) == seen.end()) {
      seen.push_back(other);
      ++machines;
    }
    same = same && other == machine;
  }
  if (!same) {
    *why_not = detail::str_cat("the ", workers, " workers run on ", machines,
                               " machines (or in separate containers)");
    return nullptr;
  }
  if (workers > kMaxWorkers) {
    *why_not = detail::str_cat(workers, " workers share this machine; shared memory takes at most ",
                               kMaxWorkers);
    return nullptr;
  }
  const size_t chunk = chunk_bytes_for(workers);
  const size_t bytes = segment_bytes(workers, chunk);
  std::string name;
  void* mapping = MAP_FAILED;
  std::string problem;  // this worker's, empty when it mapped the segment
  // Whatever way this function is left (a peer that never answers makes the store raise), the
  // chief unlinks the name it made (every worker that could has mapped the segment by the time
  // this returns normally; the mapping stays until the last worker unmaps it, even if one is
  // killed), and a mapping that no world took is unmapped.
  struct Cleanup {
    std::string unlink;
    void* mapping = MAP_FAILED;
    size_t bytes = 0;
    ~Cleanup() {
      if (!unlink.empty()) ::shm_unlink(unlink.c_str());
      if (mapping != MAP_FAILED) ::munmap(mapping, bytes);
    }
  } cleanup;
  cleanup.bytes = bytes;
  if (rank == 0) {
    // The chief creates the segment, named after the job's nonce so that jobs never meet.
    std::random_device device;
    const uint64_t key[2] = {(static_cast<uint64_t>(device()) << 32) ^ device(),
                             (static_cast<uint64_t>(device()) << 32) ^ device()};
    std::ostringstream id;
    id << "/tandem-" << std::hex << store.job_nonce() << "-" << key[0];
    name = id.str();
    const int fd = ::shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
    if (fd >= 0) cleanup.unlink = name;
    if (fd < 0) {
      problem = detail::str_cat("shm_open(", name, "): ", std::strerror(errno));
    } else {
      // Reserve the pages now: on a full /dev/shm, a mapping only fails when first touched
      // (SIGBUS), which must not happen in the middle of a collective.
      const int reserved = ::ftruncate(fd, static_cast<off_t>(bytes)) == 0
                               ? ::posix_fallocate(fd, 0, static_cast<off_t>(bytes))
                               : errno;
      if (reserved != 0) {
        problem = detail::str_cat("cannot reserve ", bytes >> 20,
                                  " MiB in /dev/shm: ", std::strerror(reserved));
      } else {
        mapping = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (mapping == MAP_FAILED) problem = detail::str_cat("mmap: ", std::strerror(errno));
      }
      ::close(fd);
    }
    if (mapping != MAP_FAILED) {
      Segment* segment = new (mapping) Segment();
      segment->key[0] = key[0];
      segment->key[1] = key[1];
      segment->size = workers;
      segment->chunk_bytes = chunk;
      // The others map it only after the chief's offer reaches them through the store.
      segment->magic = kMagic;
    }
    std::ostringstream offer;
    offer << (problem.empty() ? name : "-") << " " << key[0] << " " << key[1];
    store.set("shm", to_bytes(offer.str()));
  } else {
    std::istringstream offer(to_string(store.get("shm")));
    uint64_t key[2] = {0, 0};
    offer >> name >> key[0] >> key[1];
    if (name == "-") {
      problem = "the chief could not create the segment";
    } else {
      const int fd = ::shm_open(name.c_str(), O_RDWR, 0);
      if (fd < 0) {
        problem = detail::str_cat("shm_open(", name, "): ", std::strerror(errno));
      } else {
        struct stat info {};
        if (::fstat(fd, &info) != 0 || static_cast<size_t>(info.st_size) != bytes) {
          problem = "the segment has another size";
        } else {
          mapping = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
          if (mapping == MAP_FAILED) problem = detail::str_cat("mmap: ", std::strerror(errno));
        }
        ::close(fd);
      }
      if (mapping != MAP_FAILED) {
        const Segment* segment = static_cast<const Segment*>(mapping);
        if (segment->magic != kMagic || segment->key[0] != key[0] || segment->key[1] != key[1] ||
            segment->size != workers) {
          problem = "the segment is not this job's";
        }
      }
    }
  }
  cleanup.mapping = mapping;
  if (problem.empty()) {
    Peer& me = static_cast<Segment*>(mapping)->peers[rank];
    me.pid = static_cast<int32_t>(::getpid());
    process_state(me.pid, &me.start_time);
  }
  store.set("shm-ok/" + std::to_string(rank), to_bytes(problem.empty() ? "ok" : problem));
  std::string refusals;
  for (int w = 0; w < workers; ++w) {
    const std::string answer = to_string(store.get("shm-ok/" + std::to_string(w)));
    if (answer != "ok")
      refusals += detail::str_cat(refusals.empty() ? "" : "; ", "worker ", w, ": ", answer);
  }
  if (!refusals.empty()) {
    *why_not = "shared memory did not work for every worker (" + refusals + ")";
    return nullptr;
  }
  auto world = std::shared_ptr<SharedMemoryWorld>(
      new SharedMemoryWorld(rank, addresses, std::move(shared_store), mapping, bytes));
  cleanup.mapping = MAP_FAILED;  // the world's now
  return world;
}

SharedMemoryWorld::SharedMemoryWorld(int rank, std::vector<std::string> addresses,
                                     std::shared_ptr<TcpStore> store, void* mapping, size_t bytes)
    : rank_(rank),
      addresses_(std::move(addresses)),
      store_(std::move(store)),
      segment_(static_cast<Segment*>(mapping)),
      mapped_bytes_(bytes),
      chunk_bytes_(static_cast<size_t>(segment_->chunk_bytes)),
      data_(static_cast<char*>(mapping) + data_offset()) {}

SharedMemoryWorld::~SharedMemoryWorld() {
  if (segment_ != nullptr) ::munmap(segment_, mapped_bytes_);
}

std::string SharedMemoryWorld::describe(int worker) const {
  return detail::str_cat("worker ", worker, " (", addresses_[static_cast<size_t>(worker)], ")");
}

char* SharedMemoryWorld::slot(int worker, int set) const {
  return data_ +
         (static_cast<size_t>(set) * (addresses_.size() + 1) + static_cast<size_t>(worker)) *
             chunk_bytes_;
}

char* SharedMemoryWorld::result(int set) const { return slot(size(), set); }

// ---- the barrier -----------------------------------------------------------------------------

void SharedMemoryWorld::fail(const std::string& message, bool timeout) {
  broken_ = message;
  Peer& me = segment_->peers[rank_];
  if (me.failed.load() == 0) {
    std::strncpy(me.failure, message.c_str(), sizeof(me.failure) - 1);
    me.failed.store(1, std::memory_order_release);
  }
  // Waiters sleeping on the barrier look at the failures when they wake.
  futex(&segment_->generation, FUTEX_WAKE, INT_MAX, nullptr);
  if (timeout) throw TimeoutError(message);
  throw Error(message);
}

void SharedMemoryWorld::arrive(const char* label) {
  Segment& s = *segment_;
  const int workers = size();
  const uint64_t number = ++barriers_;
  const uint32_t generation = s.generation.load(std::memory_order_acquire);
  s.peers[rank_].arrivals.store(number, std::memory_order_release);
  if (s.arrived.fetch_add(1, std::memory_order_acq_rel) + 1 == static_cast<uint32_t>(workers)) {
    // The last to arrive opens the barrier for everyone.
    s.arrived.store(0, std::memory_order_relaxed);
    s.generation.store(generation + 1, std::memory_order_seq_cst);
    if (s.sleepers.load(std::memory_order_seq_cst) > 0)
      futex(&s.generation, FUTEX_WAKE, INT_MAX, nullptr);
    return;
  }
  const auto open = [&] { return s.generation.load(std::memory_order_acquire) != generation; };
  // Poll hot for a moment (peers a little apart), then yield the core between looks (the
  // worker's other threads, or other workers when they outnumber the cores, go first), then
  // sleep on the futex, looking after peers every few milliseconds.
  const auto start = Clock::now();
  for (int i = 0; i < 4000; ++i) {
    if (open()) return;
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
  }
  while (Clock::now() - start < std::chrono::microseconds(500)) {
    if (open()) return;
    ::sched_yield();
  }
  const auto deadline = start + collective_timeout();
  for (;;) {
    s.sleepers.fetch_add(1, std::memory_order_seq_cst);
    if (!open()) {
      const timespec slice{0, 20'000'000};  // 20 ms
      futex(&s.generation, FUTEX_WAIT, generation, &slice);
    }
    s.sleepers.fetch_sub(1, std::memory_order_seq_cst);
    if (open()) return;
    // Why is a peer not here? It gave up, it died, or it is late.
    std::string missing;
    int count = 0;
    for (int w = 0; w < workers; ++w) {
      if (w == rank_) continue;
      Peer& peer = s.peers[w];
      if (peer.failed.load(std::memory_order_acquire) != 0) {
        fail(detail::str_cat(
                 label, " #", calls_, " across ", workers, " workers: ", describe(w), " gave up: ",
                 std::string(peer.failure, strnlen(peer.failure, sizeof(peer.failure)))),
             false);
      }
      if (peer.arrivals.load(std::memory_order_acquire) >= number) continue;
      if (process_gone(peer.pid, peer.start_time)) {
        fail(detail::str_cat(label, " #", calls_, " across ", workers, " workers: ", describe(w),
                             " is gone: its process ", peer.pid,
                             " ended before it arrived (it exited, crashed or was killed)"),
             false);
      }
      missing += detail::str_cat(count++ ? ", " : "", describe(w));
    }
    if (Clock::now() > deadline) {
      fail(detail::str_cat(label, " #", calls_, " across ", workers, " workers: ",
                           count == 1 ? "" : "workers ", missing, " did not arrive within ",
                           static_cast<double>(collective_timeout().count()) / 1000.0,
                           " s (TANDEM_COLLECTIVE_TIMEOUT); ",
                           count == 1 ? "its process is" : "their processes are",
                           " still running: stuck, or making other collective calls"),
           true);
    }
  }
}

std::vector<int64_t> SharedMemoryWorld::begin(const char* label,
                                              const std::vector<int64_t>& parameters,
                                              int64_t bytes) {
  TANDEM_CHECK(broken_.empty(), label, " #", calls_ + 1, " across ", size(),
               " workers: an earlier collective failed (", broken_, "); the job cannot go on");
  label_ = label;
  const uint64_t call = ++calls_;
  const int set = static_cast<int>(barriers_ % 2);
  Header& mine = segment_->peers[rank_].header[set];
  mine.call = static_cast<int64_t>(call);
  mine.signature = static_cast<int64_t>(call_signature(label, parameters));
  mine.bytes = bytes;
  {
    profile::Span waiting(profile::Phase::kCommWait, profile::communicator_track());
    arrive(label);
  }
  std::vector<int> different;
  std::vector<int64_t> sizes(static_cast<size_t>(size()));
  for (int w = 0; w < size(); ++w) {
    const Header& theirs = segment_->peers[w].header[set];
    sizes[static_cast<size_t>(w)] = theirs.bytes;
    if (theirs.call != mine.call || theirs.signature != mine.signature) different.push_back(w);
  }
  // Every worker sees every header after the barrier and raises alike: the workers stay in
  // step and the job may go on.
  if (!different.empty()) raise_different_call(label, call, size(), different, rank_);
  return sizes;
}

// ---- collectives -------------------------------------------------------------------------------

void SharedMemoryWorld::all_reduce(std::vector<Tensor>& tensors, ReduceOp op, const char* label) {
  if (size() == 1) return;
  const std::vector<int64_t> signature = all_reduce_parameters(tensors, op, "shm", label);
  begin(label, signature, 0);
  const int workers = size();
  for_each_dtype_group(tensors, pack_, [&](void* data, int64_t count, DType dtype) {
    char* buffer = static_cast<char*>(data);
    const size_t total = static_cast<size_t>(count) * dtype_size(dtype);
    profile::Span moving(profile::Phase::kCommData, profile::communicator_track());
    moving.set_bytes(static_cast<int64_t>(total));
    dispatch_any_numeric(dtype, "all_reduce", [&]<typename T>() {
      // in[0..W) element-wise into out[0..n), in worker order: the same bits on every worker.
      // kMean sums here; the division follows once, after every piece.
      const ReduceOp combine_op = op == ReduceOp::kMax ? ReduceOp::kMax : ReduceOp::kSum;
      const auto combine = [&](T* out, int set, size_t from, size_t to) {
        const T* first_in = reinterpret_cast<const T*>(slot(0, set));
        std::copy(first_in + from, first_in + to, out + from);
        detail::reduce_in_order(
            out + from, static_cast<int64_t>(to - from), workers, combine_op, [&](int64_t w) {
              return reinterpret_cast<const T*>(slot(static_cast<int>(w), set)) + from;
            });
      };
      const size_t per_chunk = chunk_bytes_ / sizeof(T);
      const size_t n = total / sizeof(T);
      for (size_t at = 0; at < n; at += per_chunk) {
        const size_t length = std::min(per_chunk, n - at);
        const int set = static_cast<int>(barriers_ % 2);
        std::memcpy(slot(rank_, set), buffer + at * sizeof(T), length * sizeof(T));
        arrive(label);
        T* out = reinterpret_cast<T*>(buffer) + at;
        if (length * sizeof(T) <= kSmallBytes) {
          // Small: every worker combines the whole piece itself; no second barrier.
          std::vector<T> combined(length);
          combine(combined.data(), set, 0, length);
          std::copy(combined.begin(), combined.end(), out);
          continue;
        }
        // Large: each worker combines its share into the result slot; then all copy it out.
        T* reduced = reinterpret_cast<T*>(result(set));
        const size_t from = length * static_cast<size_t>(rank_) / static_cast<size_t>(workers);
        const size_t to = length * static_cast<size_t>(rank_ + 1) / static_cast<size_t>(workers);
        combine(reduced, set, from, to);
        arrive(label);
        std::memcpy(out, reduced, length * sizeof(T));
      }
    });
  });
  if (op == ReduceOp::kMean)
    for (Tensor& t : tensors) divide_elements(t, size());
}

void SharedMemoryWorld::reduce_scatter(Tensor& buffer, std::span<const int64_t> offsets,
                                       ReduceOp op, const char* label) {
  check_worker_ranges(buffer, offsets, size(), "shm", label, /*reduce=*/true);
  const auto w = static_cast<size_t>(rank_);
  // In place: this worker's range is written only after each piece went into the slots.
  Tensor range = buffer.view_as({offsets[w + 1] - offsets[w]},
                                static_cast<size_t>(offsets[w]) * dtype_size(buffer.dtype()));
  reduce_scatter(static_cast<const Tensor&>(buffer), range, offsets, op, label);
}

void SharedMemoryWorld::reduce_scatter(const Tensor& input, Tensor& output,
                                       std::span<const int64_t> offsets, ReduceOp op,
                                       const char* label) {
  check_worker_ranges(input, offsets, size(), "shm", label, /*reduce=*/true);
  const auto first = static_cast<size_t>(offsets[static_cast<size_t>(rank_)]);
  const auto last = static_cast<size_t>(offsets[static_cast<size_t>(rank_) + 1]);
  TANDEM_CHECK(output.defined() && output.dtype() == input.dtype() &&
                   output.numel() == static_cast<int64_t>(last - first) && output.device().is_cpu(),
               "shm ", label, ": the output must be a CPU tensor of ", last - first, " ",
               input.dtype(), " elements");
  if (size() == 1) {
    if (output.raw_data() !=
        static_cast<const char*>(input.raw_data()) + first * dtype_size(input.dtype()))
      output.copy_from(
          input.view_as({static_cast<int64_t>(last - first)}, first * dtype_size(input.dtype())));
    return;
  }
  std::vector<Tensor> whole = {input};
  std::vector<int64_t> signature = all_reduce_parameters(whole, op, "shm", label);
  signature.push_back(offsets_digest(offsets));
  begin(label, signature, 0);
  profile::Span moving(profile::Phase::kCommData, profile::communicator_track());
  moving.set_bytes(static_cast<int64_t>(input.nbytes()));
  dispatch_any_numeric(input.dtype(), "reduce_scatter", [&]<typename T>() {
    // all_reduce's steps for this worker's elements: in worker order, kMean summing here and
    // dividing once at the end.
    const ReduceOp combine_op = op == ReduceOp::kMax ? ReduceOp::kMax : ReduceOp::kSum;
    const T* data = input.data<T>();
    T* out = output.data<T>();
    const size_t per_chunk = chunk_bytes_ / sizeof(T);
    const auto n = static_cast<size_t>(input.numel());
    for (size_t at = 0; at < n; at += per_chunk) {
      const size_t length = std::min(per_chunk, n - at);
      const int set = static_cast<int>(barriers_ % 2);
      std::memcpy(slot(rank_, set), data + at, length * sizeof(T));
      arrive(label);
      // The slots stay unwritten until one barrier after every worker read them (see the top).
      const size_t from = std::max(at, first);
      const size_t to = std::min(at + length, last);
      if (from >= to) continue;
      const auto in = [&](int64_t w) {
        return reinterpret_cast<const T*>(slot(static_cast<int>(w), set)) + (from - at);
      };
      T* into = out + (from - first);
      std::copy(in(0), in(0) + (to - from), into);
      detail::reduce_in_order(into, static_cast<int64_t>(to - from), size(), combine_op, in);
    }
  });
  if (op == ReduceOp::kMean) divide_elements(output, size());
}

void SharedMemoryWorld::all_gather(Tensor& buffer, std::span<const int64_t> offsets,
                                   const char* label) {
  check_worker_ranges(buffer, offsets, size(), "shm", label, /*reduce=*/false);
  if (size() == 1) return;
  begin(label, {static_cast<int64_t>(buffer.dtype()), buffer.numel(), offsets_digest(offsets)}, 0);
  const size_t element = dtype_size(buffer.dtype());
  char* data = static_cast<char*>(buffer.raw_data());
  const auto start = [&](int w) { return static_cast<size_t>(offsets[static_cast<size_t>(w)]); };
  const auto bytes = [&](int w) { return (start(w + 1) - start(w)) * element; };
  size_t longest = 0;
  for (int w = 0; w < size(); ++w) longest = std::max(longest, bytes(w));
  profile::Span moving(profile::Phase::kCommData, profile::communicator_track());
  moving.set_bytes(static_cast<int64_t>(bytes(rank_)));
  for (size_t at = 0; at < longest; at += chunk_bytes_) {
    const int set = static_cast<int>(barriers_ % 2);
    if (at < bytes(rank_))
      std::memcpy(slot(rank_, set), data + start(rank_) * element + at,
                  std::min(chunk_bytes_, bytes(rank_) - at));
    arrive(label);
    for (int w = 0; w < size(); ++w)
      if (w != rank_ && at < bytes(w))
        std::memcpy(data + start(w) * element + at, slot(w, set),
                    std::min(chunk_bytes_, bytes(w) - at));
  }
}

void SharedMemoryWorld::broadcast(std::vector<Tensor>& tensors, int root, const char* label) {
  if (size() == 1) return;
  TANDEM_CHECK(root >= 0 && root < size(), "shm ", label, ": root ", root, " is outside [0, ",
               size(), ")");
  std::vector<int64_t> signature = {root};
  for (const Tensor& t : tensors) {
    TANDEM_CHECK(t.defined() && t.device().is_cpu(), "shm ", label,
                 ": tensors must be defined CPU tensors");
    signature.push_back(static_cast<int64_t>(t.nbytes()));
  }
  begin(label, signature, 0);
  profile::Span moving(profile::Phase::kCommData, profile::communicator_track());
  for (Tensor& t : tensors) {
    char* bytes = static_cast<char*>(t.raw_data());
    moving.set_bytes(static_cast<int64_t>(t.nbytes()));
    for (size_t at = 0; at < t.nbytes(); at += chunk_bytes_) {
      const size_t length = std::min(chunk_bytes_, t.nbytes() - at);
      const int set = static_cast<int>(barriers_ % 2);
      if (rank_ == root) std::memcpy(slot(root, set), bytes + at, length);
      arrive(label);
      if (rank_ != root) std::memcpy(bytes + at, slot(root, set), length);
    }
  }
}

std::vector<std::vector<char>> SharedMemoryWorld::all_gather(const std::vector<char>& mine,
                                                             const char* label) {
  if (size() == 1) return {mine};
  const std::vector<int64_t> sizes = begin(label, {}, static_cast<int64_t>(mine.size()));
  std::vector<std::vector<char>> out(static_cast<size_t>(size()));
  size_t longest = 0;
  for (int w = 0; w < size(); ++w) {
    TANDEM_CHECK(sizes[static_cast<size_t>(w)] >= 0, "shm ", label, ": worker ", w,
                 " sent a negative length");
    out[static_cast<size_t>(w)].resize(static_cast<size_t>(sizes[static_cast<size_t>(w)]));
    longest = std::max(longest, out[static_cast<size_t>(w)].size());
  }
  profile::Span moving(profile::Phase::kCommData, profile::communicator_track());
  moving.set_bytes(static_cast<int64_t>(mine.size()));
  for (size_t at = 0; at < longest; at += chunk_bytes_) {
    const int set = static_cast<int>(barriers_ % 2);
    if (at < mine.size())
      std::memcpy(slot(rank_, set), mine.data() + at, std::min(chunk_bytes_, mine.size() - at));
    arrive(label);
    for (int w = 0; w < size(); ++w) {
      std::vector<char>& piece = out[static_cast<size_t>(w)];
      if (at < piece.size())
        std::memcpy(piece.data() + at, slot(w, set), std::min(chunk_bytes_, piece.size() - at));
    }
  }
  return out;
}

std::vector<std::vector<Tensor>> SharedMemoryWorld::all_gather_tensors(
    const std::vector<Tensor>& mine, const char* label) {
  std::vector<std::vector<Tensor>> out;
  for (const std::vector<char>& piece : all_gather(tensors_to_bytes(mine), label))
    out.push_back(tensors_from_bytes(piece, "shm all_gather"));
  return out;
}

void SharedMemoryWorld::barrier(const char* label) {
  if (size() == 1) return;
  begin(label, {}, 0);
}

}  // namespace tandem::collectives
