// GlooWorld: Gloo's collectives over TCP between the workers of a TF_CONFIG job, bootstrapped
// from the chief's TcpStore.
#include "tandem/collectives/internal/gloo_world.h"

#include <gloo/allgather.h>
#include <gloo/allgatherv.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstring>
#include <thread>

#include "tandem/collectives/communicator.h"
#include "tandem/collectives/internal/flat_ranges.h"
#include "tandem/collectives/internal/reduce_max.h"
#include "tandem/collectives/internal/tensor_bytes.h"
#include "tandem/core/dtype.h"
#include "tandem/core/spans.h"

namespace tandem::collectives {

namespace {

/// Each worker's signature record: {call, hash} and up to kEagerBytes of a small all-reduce's
/// data (kEagerBytes: Open MPI's eager limit on shared memory, the MPI path's choice too).
constexpr size_t kEagerBytes = 4096 - 2 * sizeof(int64_t);
constexpr size_t kRecordBytes = 2 * sizeof(int64_t) + kEagerBytes;

/// Gloo's rendezvous keys are the workers' ranks; the store names them in errors.
class StoreForGloo final : public gloo::rendezvous::Store {
 public:
  explicit StoreForGloo(TcpStore& store) : store_(store) {}
  void set(const std::string& key, const std::vector<char>& data) override {
    store_.set(key, data);
  }
  std::vector<char> get(const std::string& key) override { return store_.get(key); }
  void wait(const std::vector<std::string>& keys) override { store_.wait(keys, store_.timeout()); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds&) override {
    store_.wait(keys, store_.timeout());
  }

 private:
  TcpStore& store_;
};

template <typename T>
void max_keeping_nan(void* c, const void* a, const void* b, size_t n) {
  T* out = static_cast<T*>(c);
  const T* x = static_cast<const T*>(a);
  const T* y = static_cast<const T*>(b);
  for (size_t i = 0; i < n; ++i) out[i] = detail::max_propagating_nan(x[i], y[i]);
}

/// Sum of 16-bit floating values (gradients sent compressed): added in float32, rounded once
/// per pair (a ring adds one worker's piece per hop).
template <typename T>
void sum_in_float(void* c, const void* a, const void* b, size_t n) {
  T* out = static_cast<T*>(c);
  const T* x = static_cast<const T*>(a);
  const T* y = static_cast<const T*>(b);
  for (size_t i = 0; i < n; ++i) out[i] = T(static_cast<float>(x[i]) + static_cast<float>(y[i]));
}

}  // namespace

GlooWorld::GlooWorld(int rank, std::vector<std::string> addresses, std::shared_ptr<TcpStore> store)
    : rank_(rank), addresses_(std::move(addresses)), store_(std::move(store)) {
  TANDEM_CHECK(rank_ >= 0 && rank_ < size(), "gloo: worker ", rank_, " of ", size());
  const std::chrono::milliseconds timeout = collective_timeout();
  // Each worker's pairs listen on the interface of its own TF_CONFIG host.
  gloo::transport::tcp::attr attr;
  attr.hostname = split_host_port(addresses_[static_cast<size_t>(rank_)]).first;
  std::shared_ptr<gloo::transport::Device> device;
  try {
    device = gloo::transport::tcp::CreateDevice(attr);
  } catch (const std::exception& e) {
    TANDEM_THROW("gloo: worker ", rank_, " cannot use its TF_CONFIG host \"", attr.hostname,
                 "\" for its connections: ", e.what());
  }
  auto context = std::make_shared<gloo::rendezvous::Context>(rank_, size());
  context->setTimeout(timeout);
  StoreForGloo gloo_store(*store_);
  try {
    context->connectFullMesh(gloo_store, device);
  } catch (const tandem::Error&) {
    throw;  // the store named who did not arrive
  } catch (const std::exception& e) {
    TANDEM_THROW("gloo: worker ", rank_, " could not connect to the other workers: ", e.what());
  }
  context_ = std::move(context);
}

GlooWorld::~GlooWorld() = default;

std::string GlooWorld::describe(int worker) const {
  return detail::str_cat("worker ", worker, " (", addresses_[static_cast<size_t>(worker)], ")");
}

template <typename Fn>
void GlooWorld::run(const char* what, const char* label, Fn&& fn) {
  TANDEM_CHECK(broken_.empty(), label, " #", calls_, " across ", size(),
               " workers: an earlier collective failed (", broken_, "); the job cannot go on");
  try {
    fn(tag_++);
  } catch (const std::exception& e) {
    broken_ = e.what();
    TANDEM_THROW(label, " #", calls_, " across ", size(), " workers failed on worker ", rank_, ": ",
                 who_is_missing(), " (gloo ", what, ": ", e.what(), ")");
  }
}

std::string GlooWorld::who_is_missing() {
  // Gloo names a socket, not a worker. The chief's store knows who left: a killed worker's
  // connection closes at once, though the chief may see it a moment after this worker did.
  // A worker that is stuck stays connected: it is the one that does not say where it stopped.
  using Clock = std::chrono::steady_clock;
  try {
    store_->set(detail::str_cat("stopped/", rank_), std::vector<char>(8, 0));
    const auto deadline = Clock::now() + std::chrono::seconds(2);
    for (;;) {
      const std::vector<std::pair<int, double>> gone = store_->departed();
      if (!gone.empty()) {
        if (rank_ == 0) keep_store_for_survivors(gone);
        std::string out;
        for (const auto& [worker, seconds] : gone)
          out += detail::str_cat(out.empty() ? "" : "; ", describe(worker),
                                 " is gone: its connection to the chief closed ",
                                 std::round(seconds * 10) / 10,
                                 " s ago (it exited, crashed or was "
                                 "killed)");
        return out;
      }
      std::string stuck;
      int count = 0;
      for (int w = 0; w < size(); ++w) {
        if (w == rank_ || store_->try_get(detail::str_cat("stopped/", w))) continue;
        stuck += detail::str_cat(count++ ? ", " : "", describe(w));
      }
      if (Clock::now() >= deadline) {
        if (count == 0) return "every worker stopped here: the data exchange itself failed";
        return detail::str_cat(stuck, " did not reach this collective and ",
                               count == 1 ? "is" : "are",
                               " still connected: stuck, or making other collective calls");
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  } catch (const std::exception&) {
    return detail::str_cat("the chief, ", describe(0),
                           ", is gone: its store does not answer (it exited, crashed or was "
                           "killed)");
  }
}

void GlooWorld::keep_store_for_survivors(const std::vector<std::pair<int, double>>& gone) {
  // The chief raises next, and its program may end at once, taking the store with it: a
  // survivor still on its way to ask (a busy machine) would then name the chief. Every other
  // survivor says it stopped before it asks; wait for that (at most 2 s), then a moment for
  // the answer.
  using Clock = std::chrono::steady_clock;
  const auto deadline = Clock::now() + std::chrono::seconds(2);
  const auto departed = [&](int w) {
    return std::any_of(gone.begin(), gone.end(), [&](const auto& g) { return g.first == w; });
  };
  for (;;) {
    bool asked = true;
    for (int w = 1; w < size() && asked; ++w)
      asked = departed(w) || store_->try_get(detail::str_cat("stopped/", w)).has_value();
    if (asked || Clock::now() >= deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
}

std::vector<char> GlooWorld::agree(const char* label, const std::vector<int64_t>& parameters,
                                   const void* payload, size_t bytes) {
  const uint64_t call = ++calls_;  // this collective's number, in every message about it
  // Every worker's record has the same size whatever it carries, so that the all-gather pairs
  // up even when the workers' calls differ.
  TANDEM_CHECK(bytes <= kEagerBytes, "gloo: a record carries at most ", kEagerBytes, " bytes");
  std::vector<char> mine(kRecordBytes, 0);
  const int64_t header[2] = {static_cast<int64_t>(call),
                             static_cast<int64_t>(call_signature(label, parameters))};
  std::memcpy(mine.data(), header, sizeof(header));
  if (bytes > 0) std::memcpy(mine.data() + sizeof(header), payload, bytes);
  std::vector<char> all(kRecordBytes * static_cast<size_t>(size()));
  run("allgather", label, [&](uint32_t tag) {
    gloo::AllgatherOptions options(context_);
    options.setInput(mine.data(), mine.size());
    options.setOutput(all.data(), all.size());
    options.setTag(tag);
    gloo::allgather(options);
  });
  std::vector<int> different;
  for (int w = 0; w < size(); ++w)
    if (std::memcmp(all.data() + kRecordBytes * static_cast<size_t>(w), header, sizeof(header)) !=
        0)
      different.push_back(w);
  // No data call was made: the workers are still in step and the job may go on.
  if (!different.empty()) raise_different_call(label, call, size(), different, rank_);
  return all;
}

void GlooWorld::all_reduce(std::vector<Tensor>& tensors, ReduceOp op, const char* label) {
  if (size() == 1) return;
  all_reduce(tensors, op, label, all_reduce_parameters(tensors, op, "gloo", label));
}

void GlooWorld::reduce_scatter(Tensor& buffer, std::span<const int64_t> offsets, ReduceOp op,
                               const char* label) {
  check_worker_ranges(buffer, offsets, size(), "gloo", label, /*reduce=*/true);
  if (size() == 1) return;
  std::vector<Tensor> whole = {buffer};
  std::vector<int64_t> signature = all_reduce_parameters(whole, op, "gloo", label);
  signature.push_back(offsets_digest(offsets));
  all_reduce(whole, op, label, signature);
}

void GlooWorld::all_gather(Tensor& buffer, std::span<const int64_t> offsets, const char* label) {
  check_worker_ranges(buffer, offsets, size(), "gloo", label, /*reduce=*/false);
  if (size() == 1) return;
  agree(label, {static_cast<int64_t>(buffer.dtype()), buffer.numel(), offsets_digest(offsets)});
  if (buffer.nbytes() == 0) return;
  std::vector<size_t> bytes(static_cast<size_t>(size()));
  for (size_t w = 0; w < bytes.size(); ++w)
    bytes[w] = static_cast<size_t>(offsets[w + 1] - offsets[w]) * dtype_size(buffer.dtype());
  profile::Span moving(profile::Phase::kCommData, profile::communicator_track());
  moving.set_bytes(static_cast<int64_t>(buffer.nbytes()));
  run("allgatherv", label, [&](uint32_t tag) {
    // No input: the output already holds this worker's range (Gloo's in-place form).
    gloo::AllgathervOptions options(context_);
    options.setOutput(static_cast<char*>(buffer.raw_data()), bytes);
    options.setTag(tag);
    gloo::allgatherv(options);
  });
}

void GlooWorld::all_reduce(std::vector<Tensor>& tensors, ReduceOp op, const char* label,
                           const std::vector<int64_t>& signature) {
  // Small, of one dtype (a loss, a metric, the end-of-data flag): the data rides on the
  // signature's all-gather, and every worker combines the pieces in worker order (the same
  // bits everywhere): one round trip instead of two.
  size_t bytes = 0;
  bool one_dtype = true;
  for (const Tensor& t : tensors) {
    bytes += t.nbytes();
    one_dtype = one_dtype && t.dtype() == tensors.front().dtype();
  }
  std::vector<char> pack;
  if (!tensors.empty() && one_dtype && bytes <= kEagerBytes) {
    bool agreed = false;
    for_each_dtype_group(tensors, pack, [&](void* buffer, int64_t count, DType dtype) {
      const std::vector<char> all = agree(label, signature, buffer, bytes);
      agreed = true;
      profile::Span moving(profile::Phase::kCommData, profile::communicator_track());
      moving.set_bytes(static_cast<int64_t>(bytes));
      // Each worker's data follows the {call, hash} header of its record (records are 4 KiB
      // apart in `all`, so every piece is aligned for its dtype).
      combine_worker_pieces(buffer, count, dtype, op, size(), [&](int worker) -> const void* {
        return all.data() + kRecordBytes * static_cast<size_t>(worker) + 2 * sizeof(int64_t);
      });
    });
    if (!agreed) agree(label, signature);  // only empty tensors: nothing to combine
    if (op == ReduceOp::kMean)
      for (Tensor& t : tensors) divide_elements(t, size());
    return;
  }
  agree(label, signature);
  for_each_dtype_group(tensors, pack, [&](void* buffer, int64_t count, DType dtype) {
    profile::Span moving(profile::Phase::kCommData, profile::communicator_track());
    moving.set_bytes(count * static_cast<int64_t>(dtype_size(dtype)));
    dispatch_any_numeric(dtype, "all_reduce", [&]<typename T>() {
      run("allreduce", label, [&](uint32_t tag) {
        gloo::AllreduceOptions options(context_);
        options.setOutput(static_cast<T*>(buffer), static_cast<size_t>(count));
        options.setAlgorithm(gloo::AllreduceOptions::Algorithm::RING);
        if (op == ReduceOp::kMax) {
          options.setReduceFunction(&max_keeping_nan<T>);
        } else if constexpr (is_half_v<T>) {
          options.setReduceFunction(&sum_in_float<T>);
        } else {
          options.setReduceFunction(
              static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<T>));
        }
        options.setTag(tag);
        gloo::allreduce(options);
      });
    });
  });
  if (op == ReduceOp::kMean)
    for (Tensor& t : tensors) divide_elements(t, size());
}

void GlooWorld::broadcast(std::vector<Tensor>& tensors, int root, const char* label) {
  if (size() == 1) return;
  TANDEM_CHECK(root >= 0 && root < size(), "gloo ", label, ": root ", root, " is outside [0, ",
               size(), ")");
  std::vector<int64_t> signature = {root};
  for (const Tensor& t : tensors) signature.push_back(static_cast<int64_t>(t.nbytes()));
  agree(label, signature);
  for (Tensor& t : tensors) {
    TANDEM_CHECK(t.defined() && t.device().is_cpu(), "gloo ", label,
                 ": tensors must be defined CPU tensors");
    if (t.nbytes() == 0) continue;
    run("broadcast", label, [&](uint32_t tag) {
      gloo::BroadcastOptions options(context_);
      options.setOutput(static_cast<char*>(t.raw_data()), t.nbytes());
      options.setRoot(root);
      options.setTag(tag);
      gloo::broadcast(options);
    });
  }
}

std::vector<std::vector<char>> GlooWorld::all_gather(const std::vector<char>& mine,
                                                     const char* label) {
  if (size() == 1) return {mine};
  agree(label, {});
  std::vector<int64_t> sizes(static_cast<size_t>(size()));
  int64_t my_size = static_cast<int64_t>(mine.size());
  run("allgather", label, [&](uint32_t tag) {
    gloo::AllgatherOptions options(context_);
    options.setInput(&my_size, 1);
    options.setOutput(sizes.data(), sizes.size());
    options.setTag(tag);
    gloo::allgather(options);
  });
  std::vector<size_t> counts;
  size_t total = 0;
  for (int64_t n : sizes) {
    counts.push_back(static_cast<size_t>(n));
    total += static_cast<size_t>(n);
  }
  std::vector<char> all(total);
  std::vector<char> input = mine;
  run("allgatherv", label, [&](uint32_t tag) {
    gloo::AllgathervOptions options(context_);
    options.setInput(input.data(), input.size());
    options.setOutput(all.data(), counts);
    options.setTag(tag);
    gloo::allgatherv(options);
  });
  std::vector<std::vector<char>> out;
  size_t at = 0;
  for (size_t n : counts) {
    out.emplace_back(all.begin() + static_cast<ptrdiff_t>(at),
                     all.begin() + static_cast<ptrdiff_t>(at + n));
    at += n;
  }
  return out;
}

std::vector<std::vector<Tensor>> GlooWorld::all_gather_tensors(const std::vector<Tensor>& mine,
                                                               const char* label) {
  std::vector<std::vector<Tensor>> out;
  for (const std::vector<char>& piece : all_gather(tensors_to_bytes(mine), label))
    out.push_back(tensors_from_bytes(piece, "gloo all_gather"));
  return out;
}

void GlooWorld::barrier(const char* label) {
  if (size() == 1) return;
  agree(label, {});
  run("barrier", label, [&](uint32_t tag) {
    gloo::BarrierOptions options(context_);
    options.setTag(tag);
    gloo::barrier(options);
  });
}

}  // namespace tandem::collectives
