// The per-replica state of a checkpoint (metric partials, gradient accumulators, dropout
// streams): this process's part, and every worker's combined by an all-gather for the chief
// of a multi-worker job to write (internal/gather.h).
#include "tandem/checkpoint/internal/gather.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <set>
#include <string>

#include "tandem/checkpoint/internal/layout.h"
#include "tandem/nn/module.h"
#include "tandem/nn/replica_state.h"
#include "tandem/ops/ops.h"
#include "tandem/optim/optimizer.h"

namespace tandem {

using detail::generators_of;
using detail::tracked;
using detail::tracked_one;
using detail::tracked_optimizer;

namespace {

/// This process's part of the per-replica state: metric partials summed over its replicas,
/// accumulators summed over its replicas (mid-accumulation only), one dropout-stream row per
/// replica.
detail::GatheredState local_state(const std::vector<Checkpoint::Entry>& entries, int num_replicas) {
  detail::GatheredState out;
  out.num_replicas = num_replicas;
  if (const nn::Module* model = tracked_one<nn::Module>(entries)) {
    if (const nn::ReplicaGenerators* generators = generators_of(*model)) {
      // One row per replica {seed, stream, offset, 0}; a replica that never drew has its
      // fresh stream (seed, 1 + global replica id, 0), exactly what it would be created with.
      const std::vector<std::array<uint64_t, 4>> states = generators->states();
      for (int r = 0; r < num_replicas; ++r)
        out.rng_rows.push_back(
            r < static_cast<int>(states.size())
                ? states[static_cast<size_t>(r)]
                : std::array<uint64_t, 4>{generators->seed(),
                                          static_cast<uint64_t>(process_replica_offset()) + r + 1,
                                          0, 0});
    }
  }
  for (const auto& [name, metric] : tracked<metrics::Metric>(entries))
    out.metrics[name] = metric->local_state();
  // Variables synchronized on read (batch norm's moving statistics): their sum over this
  // process's replicas; the aggregate is made once every worker's sum is in.
  if (const nn::Module* model = tracked_one<nn::Module>(entries)) {
    for (const Variable& v : model->weights()) {
      if (v.synchronization() != VariableSynchronization::kOnRead ||
          (v.aggregation() != VariableAggregation::kSum &&
           v.aggregation() != VariableAggregation::kMean))
        continue;
      Tensor sum = v.copy(0).to(Device::cpu()).clone();
      for (int r = 1; r < v.num_copies(); ++r) ops::add_(sum, v.copy(r).to(Device::cpu()));
      out.on_read[v.name()] = sum;
    }
  }
  const optim::Optimizer* optimizer = tracked_optimizer(entries);
  if (optimizer && optimizer->micro_step() > 0) {
    for (const auto& [name, accumulator] : optimizer->accumulator_variables()) {
      Tensor sum = accumulator.copy(0).to(Device::cpu());
      for (int r = 1; r < accumulator.num_copies(); ++r)
        sum = ops::add(sum, accumulator.copy(r).to(Device::cpu()));
      out.accumulators.emplace_back(name, sum);
    }
  }
  return out;
}

// A GatheredState as bytes, for the all-gather across workers: counts, then metrics (each one's
// number of values, then its values), dropout rows, and accumulators (float32 values) in tracked
// order, which every worker shares (they run the same program).
void put(std::vector<char>& out, const void* data, size_t bytes) {
  const size_t at = out.size();
  out.resize(at + bytes);
  if (bytes > 0) std::memcpy(out.data() + at, data, bytes);
}

std::vector<char> to_bytes(const detail::GatheredState& state,
                           const std::vector<Checkpoint::Entry>& entries) {
  std::vector<char> out;
  const int64_t header[5] = {state.num_replicas, static_cast<int64_t>(state.metrics.size()),
                             static_cast<int64_t>(state.rng_rows.size()),
                             static_cast<int64_t>(state.accumulators.size()),
                             static_cast<int64_t>(state.on_read.size())};
  put(out, header, sizeof(header));
  for (const auto& [name, metric] : tracked<metrics::Metric>(entries)) {
    const std::vector<double> values = state.metrics.at(name).flatten();
    const int64_t count = static_cast<int64_t>(values.size());
    put(out, &count, sizeof(count));
    put(out, values.data(), values.size() * sizeof(double));
  }
  for (const std::array<uint64_t, 4>& row : state.rng_rows) put(out, row.data(), sizeof(row));
  for (const auto& [name, sum] : state.accumulators) {
    TANDEM_CHECK(sum.dtype() == DType::kFloat32, "checkpoint: the accumulator of \"", name,
                 "\" is ", sum.dtype(), "; float32 expected");
    const int64_t numel = sum.numel();
    put(out, &numel, sizeof(numel));
    put(out, sum.raw_data(), sum.nbytes());
  }
  for (const auto& [name, sum] : state.on_read) {  // in name order, on every worker
    const int64_t numel = sum.numel();
    put(out, &numel, sizeof(numel));
    put(out, sum.raw_data(), sum.nbytes());
  }
  return out;
}

/// Adds worker `worker`'s bytes into `total` (metrics and accumulators summed, rows appended).
void add_bytes(detail::GatheredState& total, const std::vector<char>& bytes, int worker,
               const std::vector<Checkpoint::Entry>& entries) {
  size_t at = 0;
  auto take = [&](void* dst, size_t n) {
    TANDEM_CHECK(at + n <= bytes.size(), "checkpoint: worker ", worker, " sent a truncated state (",
                 bytes.size(), " bytes)");
    if (n > 0) std::memcpy(dst, bytes.data() + at, n);
    at += n;
  };
  int64_t header[5] = {};
  take(header, sizeof(header));
  TANDEM_CHECK(header[1] == static_cast<int64_t>(total.metrics.size()) &&
                   header[3] == static_cast<int64_t>(total.accumulators.size()) &&
                   header[4] == static_cast<int64_t>(total.on_read.size()),
               "checkpoint: worker ", worker, " tracks ", header[1], " metrics and ", header[3],
               " accumulators, the chief ", total.metrics.size(), " and ",
               total.accumulators.size(), "; every worker must save the same objects");
  for (const auto& [name, metric] : tracked<metrics::Metric>(entries)) {
    metrics::MetricState& sum = total.metrics.at(name);
    int64_t count = 0;
    take(&count, sizeof(count));
    std::vector<double> values = sum.flatten();
    TANDEM_CHECK(count == static_cast<int64_t>(values.size()), "checkpoint: worker ", worker,
                 "'s metric \"", name, "\" has ", count, " state values, the chief's ",
                 values.size());
    take(values.data(), values.size() * sizeof(double));
    // A metric of the job adds every worker's partials; one made before the strategy is this
    // process's own, and the chief's value is the one stored.
    if (metric->num_workers() > 1 || worker == 0) {
      metrics::MetricState theirs = sum;
      theirs.unflatten(values);
      sum.add(theirs);
    }
  }
  for (int64_t r = 0; r < header[2]; ++r) {
    std::array<uint64_t, 4> row{};
    take(row.data(), sizeof(row));
    total.rng_rows.push_back(row);
  }
  for (auto& [name, sum] : total.accumulators) {
    int64_t numel = 0;
    take(&numel, sizeof(numel));
    TANDEM_CHECK(numel == sum.numel(), "checkpoint: worker ", worker, "'s accumulator of \"", name,
                 "\" has ", numel, " values, the chief's ", sum.numel());
    Tensor theirs = Tensor::empty(sum.shape(), DType::kFloat32);
    take(theirs.raw_data(), theirs.nbytes());
    sum = ops::add(sum, theirs);
  }
  for (auto& [name, sum] : total.on_read) {
    int64_t numel = 0;
    take(&numel, sizeof(numel));
    TANDEM_CHECK(numel == sum.numel(), "checkpoint: worker ", worker, "'s variable \"", name,
                 "\" has ", numel, " values, the chief's ", sum.numel());
    Tensor theirs = Tensor::empty(sum.shape(), sum.dtype());
    take(theirs.raw_data(), theirs.nbytes());
    sum = ops::add(sum, theirs);
  }
  TANDEM_CHECK(at == bytes.size(), "checkpoint: worker ", worker, " sent ", bytes.size() - at,
               " bytes more than the chief's objects account for; every worker must save the "
               "same objects");
  total.num_replicas += header[0];
}

}  // namespace

namespace detail {

namespace {

/// Bytes of one bucket of slots sent to the chief (a larger slot goes alone).
constexpr int64_t kSlotBucketBytes = int64_t{32} << 20;

/// The optimizer slots the chief cannot write as they are (optimizer-state sharding): those
/// split among replicas, whose parts this process holds are copied into place, and those whose
/// parts other workers hold, sent to the chief bucket by bucket: runs of consecutive parts of
/// one worker, of at most kSlotBucketBytes, each broadcast from that worker, the parts' names
/// and ranges first; the chief keeps them, the others drop each bucket as it comes. Every
/// worker makes the same calls (one program, one layout, the slots in the variables' order). A
/// worker that cannot send, or a chief that finds another bucket than it expects, still takes
/// part in every call; all raise together at the end. `workers`: null in a one-process job.
void gather_slots(const optim::Optimizer& optimizer, WorkerGroup* workers, GatheredState& out) {
  if (optimizer.shard_optimizer_state() == 0) return;
  const std::vector<optim::Optimizer::SlotPlacement> placements = optimizer.slot_placements();
  const int me = workers != nullptr ? workers->worker_index() : 0;
  const int local = job_replicas().local;
  const bool several = workers != nullptr && workers->num_workers() > 1 && local > 0;
  const auto worker_of = [&](size_t k) {
    return !several || placements[k].owner < 0 ? 0 : placements[k].owner / local;
  };
  const auto bytes_of = [&](size_t k) {
    return (placements[k].end - placements[k].begin) *
           static_cast<int64_t>(dtype_size(placements[k].variable.copy(0).dtype()));
  };
  // The whole slot on the chief, made at its first part; each part copied into its elements.
  std::map<std::string, int64_t> placed;  // elements per slot
  const auto place = [&](size_t k, const void* bytes) {
    const optim::Optimizer::SlotPlacement& p = placements[k];
    placed[p.name] += p.end - p.begin;
    auto it = out.slots.find(p.name);
    if (it == out.slots.end())
      it = out.slots
               .emplace(p.name,
                        Tensor::zeros(p.variable.copy(0).shape(), p.variable.copy(0).dtype()))
               .first;
    const size_t element = dtype_size(p.variable.copy(0).dtype());
    std::memcpy(static_cast<char*>(it->second.raw_data()) + static_cast<size_t>(p.begin) * element,
                bytes, static_cast<size_t>(bytes_of(k)));
  };
  // The chief's own parts of split slots. Without the other workers (Checkpoint::write alone),
  // a slot some of whose parts are not here is left out: the writer then refuses it by name
  // rather than writing zeros where the other parts belong.
  if (me == 0) {
    std::set<std::string> incomplete;
    if (!several)
      for (const optim::Optimizer::SlotPlacement& p : placements)
        if (!p.slot.defined()) incomplete.insert(p.name);
    for (size_t k = 0; k < placements.size(); ++k) {
      const bool split =
          placements[k].end - placements[k].begin != placements[k].variable.copy(0).numel();
      if (!split || worker_of(k) != 0 || !placements[k].slot.defined() ||
          incomplete.contains(placements[k].name))
        continue;
      place(k, placements[k].slot.copy(0).to(Device::cpu()).raw_data());
    }
  }
  // Every element of every slot assembled (what the layout promises), else nothing is written.
  const auto check_placed = [&]() -> std::string {
    for (const optim::Optimizer::SlotPlacement& p : placements) {
      const auto it = placed.find(p.name);
      if (it != placed.end() && it->second != p.variable.copy(0).numel())
        return detail::str_cat("checkpoint: optimizer slot \"", p.name, "\" has ", it->second,
                               " of its ", p.variable.copy(0).numel(),
                               " elements on the chief; nothing was written");
    }
    return {};
  };
  if (!several) {
    if (me == 0) {
      const std::string missing = check_placed();
      TANDEM_CHECK(missing.empty(), missing);
    }
    return;
  }
  const char* label = "checkpoint save (the optimizer slots other workers hold)";
  std::string failure;  // this worker's, the first
  size_t at = 0;
  while (at < placements.size()) {
    const int worker = worker_of(at);
    if (worker == 0) {
      ++at;
      continue;
    }
    size_t end = at;
    int64_t bytes = 0;
    while (end < placements.size() && worker_of(end) == worker &&
           (end == at || bytes + bytes_of(end) <= kSlotBucketBytes))
      bytes += bytes_of(end++);
    // The parts, '\n'-separated and ended by '\0', then the values; or '!' and an error.
    std::string names;
    for (size_t k = at; k < end; ++k)
      names += detail::str_cat(placements[k].name, " [", placements[k].begin, ", ",
                               placements[k].end, ")\n");
    std::vector<char> mine;
    if (me == worker) {
      for (size_t k = at; k < end && failure.empty(); ++k)
        if (!placements[k].slot.defined())
          failure = detail::str_cat("checkpoint: worker ", me, " does not hold optimizer slot \"",
                                    placements[k].name, "\" of its replica ", placements[k].owner);
      if (!failure.empty()) {
        mine.push_back('!');
        mine.insert(mine.end(), failure.begin(), failure.end());
      } else {
        mine.reserve(names.size() + 1 + static_cast<size_t>(bytes));
        put(mine, names.data(), names.size() + 1);
        for (size_t k = at; k < end; ++k) {
          const Tensor value = placements[k].slot.copy(0).to(Device::cpu());
          put(mine, value.raw_data(), value.nbytes());
        }
      }
    }
    const std::vector<char> got = workers->broadcast_from(worker, std::move(mine), label);
    if (me == 0 && failure.empty()) {
      const auto nul = std::find(got.begin(), got.end(), '\0');
      const size_t header = static_cast<size_t>(nul - got.begin()) + 1;
      if (!got.empty() && got.front() == '!') {
        failure = std::string(got.begin() + 1, got.end());
      } else if (nul == got.end() || std::string(got.begin(), nul) != names ||
                 got.size() - header != static_cast<size_t>(bytes)) {
        failure = detail::str_cat(
            "checkpoint: worker ", worker,
            " sent other optimizer slots than the chief expects from \"", placements[at].name,
            "\" on (", got.size(), " bytes, ", bytes,
            " of values expected); every worker must build the same model and optimizer");
      } else {
        size_t offset = header;
        for (size_t k = at; k < end; ++k) {
          place(k, got.data() + offset);
          offset += static_cast<size_t>(bytes_of(k));
        }
      }
    }
    at = end;
  }
  if (me == 0 && failure.empty()) failure = check_placed();
  std::vector<double> failed = {failure.empty() ? 0.0 : 1.0};
  workers->sum(failed, label);
  if (!failure.empty()) TANDEM_THROW(failure);
  if (failed[0] > 0)
    TANDEM_THROW("checkpoint: the optimizer slots other workers hold did not reach the chief (",
                 "its error is raised on the chief or the worker that could not send); nothing "
                 "was written");
}

/// The sums of the variables synchronized on read become their aggregates: a kMean one's
/// divided by the replicas of every worker.
void aggregate_on_read(GatheredState& state, const Checkpoint& checkpoint) {
  if (state.on_read.empty()) return;
  const nn::Module* model = tracked_one<nn::Module>(checkpoint.entries());
  for (const Variable& v : model->weights()) {
    auto it = state.on_read.find(v.name());
    if (it == state.on_read.end() || v.aggregation() != VariableAggregation::kMean) continue;
    it->second = ops::div(
        it->second, Tensor::scalar(static_cast<double>(state.num_replicas), it->second.dtype()));
  }
}

}  // namespace

GatheredState gather_state(const Checkpoint& checkpoint, WorkerGroup* workers) {
  GatheredState mine = local_state(checkpoint.entries(), checkpoint.num_replicas());
  if (workers == nullptr || workers->num_workers() == 1) {
    aggregate_on_read(mine, checkpoint);
    if (const optim::Optimizer* optimizer = tracked_optimizer(checkpoint.entries()))
      gather_slots(*optimizer, workers, mine);
    return mine;
  }
  const std::vector<std::vector<char>> all = workers->all_gather(
      to_bytes(mine, checkpoint.entries()), "checkpoint save (every worker saves together)");
  // Every worker's part, in worker (so global replica) order.
  GatheredState total;
  total.num_workers = workers->num_workers();
  total.num_replicas = 0;
  for (const auto& [name, metric] : tracked<metrics::Metric>(checkpoint.entries()))
    total.metrics[name] = metrics::MetricState(metric->variables());
  for (const auto& [name, sum] : mine.accumulators)
    total.accumulators.emplace_back(name, Tensor::zeros_like(sum));
  for (const auto& [name, sum] : mine.on_read) total.on_read[name] = Tensor::zeros_like(sum);
  for (int w = 0; w < workers->num_workers(); ++w)
    add_bytes(total, all[static_cast<size_t>(w)], w, checkpoint.entries());
  aggregate_on_read(total, checkpoint);
  if (const optim::Optimizer* optimizer = tracked_optimizer(checkpoint.entries()))
    gather_slots(*optimizer, workers, total);
  return total;
}

}  // namespace detail

}  // namespace tandem
