// DistributedDataset (splitting global batches across replicas, or per-replica batches from
// a function of InputContext), InputContext arithmetic and auto-sharding across workers.
#include "tandem/data/distributed_dataset.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <utility>

#include "tandem/core/logging.h"
#include "tandem/core/spans.h"
#include "tandem/data/internal/node.h"
#include "tandem/tensor/internal/device_memory.h"

namespace tandem::data {

// ---- InputContext ----------------------------------------------------------------------------

InputContext::InputContext(int64_t num_input_pipelines, int64_t input_pipeline_id,
                           int64_t num_replicas_in_sync)
    : num_input_pipelines_(num_input_pipelines),
      input_pipeline_id_(input_pipeline_id),
      num_replicas_in_sync_(num_replicas_in_sync) {
  TANDEM_CHECK(num_input_pipelines >= 1, "InputContext: num_input_pipelines must be at least 1, ",
               "got ", num_input_pipelines);
  TANDEM_CHECK(input_pipeline_id >= 0 && input_pipeline_id < num_input_pipelines,
               "InputContext: input_pipeline_id ", input_pipeline_id, " is out of range for ",
               num_input_pipelines, " input pipelines");
  TANDEM_CHECK(num_replicas_in_sync >= 1, "InputContext: num_replicas_in_sync must be at least ",
               "1, got ", num_replicas_in_sync);
}

int64_t InputContext::get_per_replica_batch_size(int64_t global_batch_size) const {
  TANDEM_CHECK(global_batch_size >= 1, "get_per_replica_batch_size: the global batch size must ",
               "be positive, got ", global_batch_size);
  TANDEM_CHECK(global_batch_size % num_replicas_in_sync_ == 0,
               "get_per_replica_batch_size: ", "the global batch size ", global_batch_size,
               " is not divisible by the ", num_replicas_in_sync_, " replicas in sync");
  return global_batch_size / num_replicas_in_sync_;
}

// ---- auto-sharding ---------------------------------------------------------------------------

namespace {

const char* policy_name(AutoShardPolicy policy) {
  switch (policy) {
    case AutoShardPolicy::kOff:
      return "kOff";
    case AutoShardPolicy::kFile:
      return "kFile";
    case AutoShardPolicy::kData:
      return "kData";
    case AutoShardPolicy::kAuto:
      return "kAuto";
  }
  return "?";
}

void check_workers(int64_t num_workers, int64_t worker_index) {
  TANDEM_CHECK(num_workers >= 1, "DistributeOptions: num_workers must be at least 1, got ",
               num_workers);
  TANDEM_CHECK(worker_index >= 0 && worker_index < num_workers,
               "DistributeOptions: ", "worker_index ", worker_index, " is out of range for ",
               num_workers, " workers");
}

/// The files of the pipeline's source (none when it reads no files).
std::vector<std::string> source_files(const Dataset& dataset) {
  const detail::Node* n = dataset.node().get();
  while (n->input() != nullptr) n = n->input().get();
  const auto source = n->source();
  return source ? source->files() : std::vector<std::string>{};
}

/// The policy auto_shard applies (kOff with one worker).
AutoShardPolicy effective_policy(const Dataset& dataset, AutoShardPolicy policy,
                                 int64_t num_workers) {
  if (num_workers == 1) return AutoShardPolicy::kOff;
  if (policy != AutoShardPolicy::kAuto) return policy;
  return source_files(dataset).size() >= static_cast<size_t>(num_workers) ? AutoShardPolicy::kFile
                                                                          : AutoShardPolicy::kData;
}

}  // namespace

Dataset auto_shard(const Dataset& dataset, AutoShardPolicy policy, int64_t num_workers,
                   int64_t worker_index) {
  check_workers(num_workers, worker_index);
  if (num_workers == 1 || policy == AutoShardPolicy::kOff) return dataset;
  using detail::Node;
  std::vector<std::shared_ptr<const Node>> chain;  // top first, source last
  for (auto n = dataset.node(); n != nullptr; n = n->input()) chain.push_back(n);
  const std::shared_ptr<const Node>& source_node = chain.back();
  const auto source = source_node->source();
  const std::vector<std::string> files = source_files(dataset);
  const auto workers = static_cast<size_t>(num_workers);

  const AutoShardPolicy effective = effective_policy(dataset, policy, num_workers);
  if (effective == AutoShardPolicy::kFile) {
    TANDEM_CHECK(!files.empty(), "AutoShardPolicy::kFile: the dataset reads no files (",
                 dataset.describe(), "); use kData or kAuto");
    TANDEM_CHECK(files.size() >= workers, "AutoShardPolicy::kFile: ", files.size(),
                 " file(s) cannot be dealt to ", num_workers, " workers; use kData (or kAuto), ",
                 "or split the input into at least as many files as workers");
  }

  // The batch nearest the source is the global batch; each worker batches its share of it.
  ptrdiff_t batch_at = -1;
  for (size_t k = 0; k < chain.size(); ++k)
    if (chain[k]->batch_size() > 0) batch_at = static_cast<ptrdiff_t>(k);

  std::shared_ptr<const Node> rebuilt = source_node;
  if (effective == AutoShardPolicy::kFile) {
    std::vector<std::string> dealt;
    for (size_t f = static_cast<size_t>(worker_index); f < files.size(); f += workers)
      dealt.push_back(files[f]);
    rebuilt = detail::make_source_node(source->with_files(std::move(dealt)), source_node->kind());
  }
  for (ptrdiff_t k = static_cast<ptrdiff_t>(chain.size()) - 2; k >= 0; --k) {
    const Node& node = *chain[static_cast<size_t>(k)];
    if (k == batch_at) {
      if (effective == AutoShardPolicy::kData)
        rebuilt = detail::make_worker_shard_node(rebuilt, num_workers, worker_index);
      const int64_t global = node.batch_size();
      TANDEM_CHECK(global % num_workers == 0, "auto-sharding (", policy_name(policy), "): the ",
                   "global batch size ", global, " is not divisible by ", num_workers, " workers");
      rebuilt = detail::make_batch_node(rebuilt, global / num_workers, node.drop_remainder(),
                                        effective == AutoShardPolicy::kData ? global : 0);
    } else {
      rebuilt = node.with_input(rebuilt);
    }
  }
  if (effective == AutoShardPolicy::kData && batch_at < 0)
    rebuilt = detail::make_worker_shard_node(rebuilt, num_workers, worker_index);
  return Dataset(rebuilt);
}

// ---- DistributedDataset ----------------------------------------------------------------------

struct DistributedDataset::State {
  enum class Mode { kSplitGlobalBatches, kPerReplicaBatches };
  State(Mode m, Dataset d, int64_t n) : mode(m), dataset(std::move(d)), num_replicas(n) {}
  Mode mode;
  Dataset dataset;
  int64_t num_replicas;
  uint64_t epoch = 0;
  std::optional<Iterator> iterator;  // the epoch under way, if any
  int64_t steps_in_epoch = 0;        // steps taken in the epoch under way (-1: unknown)
  bool restored = false;             // the epoch under way continues from restore()
  Element last;                      // the last batch seen: the shapes of empty batches
  std::vector<Device> devices;       // per replica, when batches go to GPUs; else empty
  std::function<bool(bool)> agree;   // several workers: does any worker still have data?
  bool exhausted = false;            // this worker ran out; others still had data
  // SplitPolicy::kBySpeed: the strategy's measurements, the run counter when the latest step was
  // pulled, each replica's smoothed examples per second of compute (0: not measured yet).
  SplitPolicy split = SplitPolicy::kEven;
  std::function<ReplicaTimes()> timing;
  std::optional<uint64_t> pulled_at_run;
  std::vector<double> speeds;
  std::vector<int64_t> last_sizes;  // the latest step's split
  // Workers reading shares of each global batch (1: this process reads it whole; 0: every
  // worker reads everything, kOff), and the largest share seen: a step of a full share holds
  // workers x share examples in all.
  int64_t workers = 1;
  int64_t full_share = 0;
  // AutoShardPolicy::kFile with several workers: each worker's position is in its own files.
  bool file_sharded = false;
};

namespace {

/// Views of rows [begin, begin + rows) of every tensor of a batch.
Element rows_of(const Element& batch, int64_t begin, int64_t rows) {
  Element piece;
  piece.reserve(batch.size());
  for (const Tensor& t : batch) {
    const Shape row_shape = detail::drop_first_dim(t.shape());
    const size_t row_bytes = static_cast<size_t>(row_shape.numel()) * dtype_size(t.dtype());
    piece.push_back(
        t.view_as(detail::prepend_dim(rows, row_shape), static_cast<size_t>(begin) * row_bytes));
  }
  return piece;
}

Element empty_like_batch(const Element& batch) {
  Element empty;
  for (const Tensor& t : batch)
    empty.push_back(Tensor::empty(detail::prepend_dim(0, detail::drop_first_dim(t.shape())),
                                  t.dtype(), t.device()));
  return empty;
}

void check_batched(const Element& batch, const char* who) {
  TANDEM_CHECK(!batch.empty(), who, ": an element holds no tensors");
  for (size_t c = 0; c < batch.size(); ++c) {
    TANDEM_CHECK(batch[c].rank() >= 1, who, ": tensor ", c, " of an element is a scalar; the ",
                 "dataset must yield batches (call .batch(global_batch_size) first)");
    TANDEM_CHECK(batch[c].dim(0) == batch[0].dim(0), who, ": tensor ", c, " has ", batch[c].dim(0),
                 " rows (", batch[c].shape(), ") but tensor 0 has ", batch[0].dim(0), " (",
                 batch[0].shape(), "); the elements must be batches");
  }
}

}  // namespace

std::vector<int64_t> proportional_split(int64_t rows, const std::vector<double>& weights) {
  TANDEM_CHECK(!weights.empty(), "proportional_split: no weights");
  TANDEM_CHECK(rows >= 0, "proportional_split: rows must be >= 0, got ", rows);
  double total = 0;
  for (size_t i = 0; i < weights.size(); ++i) {
    TANDEM_CHECK(weights[i] > 0 && std::isfinite(weights[i]), "proportional_split: weight ", i,
                 " is ", weights[i], "; weights must be positive and finite");
    total += weights[i];
  }
  const auto n = static_cast<int64_t>(weights.size());
  // While there are enough rows, each replica keeps one and the rest is shared out.
  const int64_t floor_each = rows >= n ? 1 : 0;
  const int64_t shared = rows - floor_each * n;
  std::vector<int64_t> sizes(weights.size(), floor_each);
  std::vector<std::pair<double, size_t>> remainders;
  int64_t given = 0;
  for (size_t i = 0; i < weights.size(); ++i) {
    const double exact = static_cast<double>(shared) * weights[i] / total;
    const auto whole = static_cast<int64_t>(std::floor(exact));
    sizes[i] += whole;
    given += whole;
    remainders.emplace_back(exact - static_cast<double>(whole), i);
  }
  // The rows left by rounding down go to the largest remainders, ties to the lower index.
  std::stable_sort(remainders.begin(), remainders.end(),
                   [](const auto& a, const auto& b) { return a.first > b.first; });
  for (int64_t k = 0; k < shared - given; ++k)
    ++sizes[remainders[static_cast<size_t>(k) % remainders.size()].second];
  return sizes;
}

/// How a global batch of `rows` splits across the replicas this step. Even: sizes differ by at
/// most one, larger first (7 on 2 -> 4, 3; 1 on 2 -> 1, 0). By speed: the latest measurement, if
/// it is of the run that consumed this dataset's previous step, updates each replica's smoothed
/// speed (half the old value, half the new), and once every replica has one the split follows
/// them.
std::vector<int64_t> DistributedDataset::split(int64_t rows) {
  State& s = *state_;
  const auto n = static_cast<size_t>(s.num_replicas);
  std::vector<int64_t> even(n);
  for (size_t r = 0; r < n; ++r)
    even[r] = rows / s.num_replicas + (static_cast<int64_t>(r) < rows % s.num_replicas ? 1 : 0);
  if (s.split != SplitPolicy::kBySpeed || !s.timing) return even;
  const ReplicaTimes latest = s.timing();
  if (s.pulled_at_run && latest.run == *s.pulled_at_run + 1 && latest.compute_seconds.size() == n &&
      s.last_sizes.size() == n) {
    for (size_t r = 0; r < n; ++r) {
      const double seconds = latest.compute_seconds[r];
      if (s.last_sizes[r] <= 0 || !(seconds > 0)) continue;  // no examples, nothing learnt
      const double speed = static_cast<double>(s.last_sizes[r]) / seconds;
      s.speeds[r] = s.speeds[r] > 0 ? 0.5 * s.speeds[r] + 0.5 * speed : speed;
    }
  }
  s.pulled_at_run = latest.run;
  for (double speed : s.speeds)
    if (!(speed > 0)) return even;
  return proportional_split(rows, s.speeds);
}

DistributedDataset::DistributedDataset(Dataset dataset, int64_t num_replicas,
                                       DistributeOptions options) {
  TANDEM_CHECK(num_replicas >= 1, "DistributedDataset: num_replicas must be at least 1, got ",
               num_replicas);
  Dataset local =
      auto_shard(dataset, options.auto_shard_policy, options.num_workers, options.worker_index);
  state_ =
      std::make_shared<State>(State::Mode::kSplitGlobalBatches, std::move(local), num_replicas);
  state_->split = options.split;
  state_->workers = options.num_workers == 1 || options.auto_shard_policy != AutoShardPolicy::kOff
                        ? options.num_workers
                        : 0;
  state_->speeds.assign(static_cast<size_t>(num_replicas), 0.0);
  state_->file_sharded = effective_policy(dataset, options.auto_shard_policy,
                                          options.num_workers) == AutoShardPolicy::kFile;
}

DistributedDataset DistributedDataset::from_function(std::function<Dataset(const InputContext&)> fn,
                                                     int64_t num_replicas,
                                                     DistributeOptions options) {
  TANDEM_CHECK(fn != nullptr, "DistributedDataset::from_function: the function is empty");
  TANDEM_CHECK(options.split == SplitPolicy::kEven,
               "distribute_datasets_from_function: SplitPolicy::kBySpeed needs a global batch to "
               "split (distribute_dataset); the function's dataset is batched per replica");
  TANDEM_CHECK(num_replicas >= 1, "DistributedDataset::from_function: num_replicas must be at ",
               "least 1, got ", num_replicas);
  check_workers(options.num_workers, options.worker_index);
  const InputContext context(options.num_workers, options.worker_index,
                             num_replicas * options.num_workers);
  Dataset dataset = fn(context);
  return DistributedDataset(
      std::make_shared<State>(State::Mode::kPerReplicaBatches, std::move(dataset), num_replicas));
}

int64_t DistributedDataset::num_replicas() const { return state_->num_replicas; }
const Dataset& DistributedDataset::dataset() const { return state_->dataset; }
uint64_t DistributedDataset::epoch() const { return state_->epoch; }

namespace {
/// Replica r's batch on devices[r] (no-op without GPU devices).
void place(std::vector<Batch>& per_replica, const std::vector<Device>& devices) {
  if (devices.empty()) return;
  for (size_t r = 0; r < per_replica.size(); ++r)
    per_replica[r] = Batch(stage_to_device(per_replica[r].tensors(), devices[r]),
                           per_replica[r].global_batch_size());
}
}  // namespace

bool DistributedDataset::next(std::vector<Batch>& per_replica) {
  // The training loop waits here for the step's batches: the input share of the timeline,
  // with the step's examples.
  profile::Span waiting(profile::Phase::kInput, {profile::TrackKind::kInput, 0});
  const bool more = next_step(per_replica);
  if (more && profile::enabled()) {
    int64_t examples = 0;
    for (const Batch& b : per_replica) examples += b.batch_size();
    waiting.set_bytes(examples);
  }
  return more;
}

bool DistributedDataset::next_step(std::vector<Batch>& per_replica) {
  State& s = *state_;
  if (!s.agree) {
    if (pull(per_replica)) {
      if (s.steps_in_epoch >= 0) ++s.steps_in_epoch;
      return true;
    }
    end_epoch();
    return false;
  }
  // Several workers: the step happens while any worker has data; a worker that ran out feeds
  // its replicas empty batches (they contribute nothing) until every worker has.
  const bool mine = !s.exhausted && pull(per_replica);
  if (!s.agree(mine)) {
    end_epoch();
    return false;
  }
  if (!mine) {
    s.exhausted = true;
    per_replica = empty_batches();
    place(per_replica, s.devices);
  }
  if (s.steps_in_epoch >= 0) ++s.steps_in_epoch;
  return true;
}

void DistributedDataset::end_epoch() {
  State& s = *state_;
  if (profile::enabled()) {
    const int64_t now = profile::now_ns();
    profile::record(
        {profile::Phase::kEpochEnd, {profile::TrackKind::kInput, 0}, now, now, 0, false, -1});
  }
  s.iterator.reset();
  s.exhausted = false;
  s.steps_in_epoch = 0;
  s.restored = false;
  ++s.epoch;
}

void DistributedDataset::set_replica_timing(std::function<ReplicaTimes()> latest_run) {
  state_->timing = std::move(latest_run);
}

std::vector<int64_t> DistributedDataset::last_split() const { return state_->last_sizes; }

void DistributedDataset::set_end_of_data_agreement(std::function<bool(bool)> any_worker_has_data) {
  state_->agree = std::move(any_worker_has_data);
}

bool DistributedDataset::pull(std::vector<Batch>& per_replica) {
  State& s = *state_;
  if (!s.iterator) s.iterator.emplace(s.dataset.iterator(s.epoch));
  const auto replicas = static_cast<size_t>(s.num_replicas);
  per_replica.resize(replicas);
  Element element;
  if (s.mode == State::Mode::kSplitGlobalBatches) {
    if (!s.iterator->next(element)) return false;
    check_batched(element, "distribute_dataset");
    const int64_t rows = element[0].dim(0);
    const std::vector<int64_t> sizes = split(rows);
    // The step's examples on every worker: known for this worker's whole batch, and for a
    // full share of a global batch that several workers read (the last share may be shorter).
    s.full_share = std::max(s.full_share, rows);
    const int64_t global = s.workers == 1 ? rows : rows == s.full_share ? rows * s.workers : 0;
    int64_t begin = 0;
    for (size_t r = 0; r < replicas; ++r) {
      per_replica[r] = Batch(rows_of(element, begin, sizes[r]), global);
      begin += sizes[r];
    }
    s.last_sizes = sizes;
    s.last = std::move(element);
    place(per_replica, s.devices);
    return true;
  }
  for (size_t r = 0; r < replicas; ++r) {
    if (s.iterator->next(element)) {
      check_batched(element, "distribute_datasets_from_function");
      s.last = element;
      per_replica[r] = Batch(std::move(element));
    } else if (r == 0) {
      return false;
    } else {
      // The pipeline ran out mid-step: the remaining replicas still get a (empty) batch.
      per_replica[r] = Batch(empty_like_batch(s.last));
    }
  }
  place(per_replica, s.devices);
  return true;
}

void DistributedDataset::set_devices(std::vector<Device> devices) {
  TANDEM_CHECK(static_cast<int64_t>(devices.size()) == state_->num_replicas,
               "DistributedDataset::set_devices: ", devices.size(), " devices for ",
               state_->num_replicas, " replicas");
  bool any_gpu = false;
  for (const Device& d : devices) any_gpu = any_gpu || d.is_cuda();
  state_->devices = any_gpu ? std::move(devices) : std::vector<Device>();
}

std::vector<Batch> DistributedDataset::empty_batches() const {
  Element shape_source = state_->last;
  if (shape_source.empty()) {
    for (const TensorSpec& spec : state_->dataset.element_spec()) {
      std::vector<int64_t> dims = spec.shape.dims();
      for (int64_t& d : dims) d = std::max<int64_t>(d, 0);
      TANDEM_CHECK(!dims.empty(), "DistributedDataset: the dataset's elements are not batches");
      shape_source.push_back(Tensor::empty(Shape(dims), spec.dtype));
    }
  }
  return std::vector<Batch>(static_cast<size_t>(state_->num_replicas),
                            Batch(empty_like_batch(shape_source)));
}

IteratorState DistributedDataset::save() const {
  const State& s = *state_;
  IteratorState state;
  if (s.iterator) state = s.iterator->save();
  state.set("distributed/epoch", {static_cast<int64_t>(s.epoch)});
  state.set("distributed/in_epoch", {s.iterator ? 1 : 0});
  return state;
}

void DistributedDataset::restore(const IteratorState& state) {
  State& s = *state_;
  const int64_t epoch = state.get_scalar("distributed/epoch");
  TANDEM_CHECK(epoch >= 0, "DistributedDataset::restore: negative epoch ", epoch);
  if (state.get_scalar("distributed/in_epoch") != 0) {
    Iterator iterator = s.dataset.iterator(static_cast<uint64_t>(epoch));
    try {
      iterator.restore(state);
    } catch (const Error& error) {
      if (!s.file_sharded) throw;
      TANDEM_THROW(error.what(), "; this worker reads its own files (AutoShardPolicy::kFile), ",
                   "and a saved position is the saving worker's: it restores on a worker whose ",
                   "files hold as many records, at the same number of workers. Use ",
                   "AutoShardPolicy::kData (each worker reads its share of every global batch) ",
                   "for a position that restores on every worker and at any number of workers");
    }
    s.iterator.emplace(std::move(iterator));
  } else {
    s.iterator.reset();
  }
  s.epoch = static_cast<uint64_t>(epoch);
  s.restored = s.iterator.has_value();
  s.steps_in_epoch = s.restored ? -1 : 0;  // the file holds the position, not the step
}

void DistributedDataset::set_epoch(uint64_t epoch) {
  state_->iterator.reset();
  state_->epoch = epoch;
  state_->steps_in_epoch = 0;
  state_->restored = false;
}

DistributedDataset::StepCursor::StepCursor(DistributedDataset* owner) : owner_(owner) {
  // A loop that starts in the middle of an epoch is easy to miss: a loop left by `break` or an
  // exception leaves its epoch under way, and the next loop walks only what remained (tf.data's
  // iter() would start afresh).
  // An endless dataset (repeat() without a count) is walked in loops that each end by `break`
  // (TensorFlow's steps_per_epoch loop): continuing is what such a loop means, so it is not
  // reported.
  State& s = *owner_->state_;
  const bool endless = s.dataset.cardinality() == kInfiniteCardinality;
  if (s.iterator.has_value() && !endless) {
    if (s.restored) {
      TANDEM_LOG_INFO("distributed dataset: this loop continues epoch ", s.epoch,
                      " from the position a restore gave it");
    } else {
      // After a restore the steps before it are not known: the message then names none.
      const std::string where = s.steps_in_epoch >= 0
                                    ? ::tandem::detail::str_cat(" after step ", s.steps_in_epoch)
                                    : std::string();
      TANDEM_LOG_WARNING("distributed dataset: this loop continues epoch ", s.epoch, where,
                         ", where the previous loop over it stopped (a break or an exception); "
                         "set_epoch(",
                         s.epoch, ") first starts that epoch from its beginning");
    }
  }
  s.restored = false;  // a later loop of this epoch follows this one, not the restore
  done_ = !owner_->next(current_.values());
}

DistributedDataset::StepCursor& DistributedDataset::StepCursor::operator++() {
  done_ = !owner_->next(current_.values());
  return *this;
}

}  // namespace tandem::data
