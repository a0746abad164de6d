// The parts of the samples' training programs that are the same in every sample and not their
// point: the strategy --replicas asks for, the setup line, and evaluation on the test split.
// SIGTERM and Ctrl-C are tandem::PreemptionCheckpointHandler's: every worker finishes the step,
// the chief saves, and every worker exits with tandem::kPreemptedExitStatus (75).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "common/flags.h"
#include "common/reporting.h"
#include "tandem/tandem.h"

namespace samples {

/// Global batch of the test-split evaluation (split across the replicas like training batches),
/// before eval_batch rounds it to the workers.
inline constexpr int64_t kEvalBatch = 1000;

/// kEvalBatch rounded up to a multiple of the strategy's workers (each worker takes an equal
/// part of every global batch): 1002 for 3 workers.
int64_t eval_batch(const tandem::Strategy& strategy);

/// MirroredStrategy::cpu(N) for --replicas N; otherwise MirroredStrategy's default choice (every
/// GPU, else TANDEM_CPU_REPLICAS CPU replicas), which logs one line saying which and why.
std::unique_ptr<tandem::Strategy> make_strategy(const Flags& flags);

/// The step-timeline profiler of --profile FILE (else of TANDEM_PROFILE; with --tensorboard
/// too, its summaries for `tensorboard`.write_profile, which the sample calls after each save),
/// or null, reporting the memory `optimizer` holds per replica. It must end before the
/// strategy and the optimizer do.
std::unique_ptr<tandem::profile::Profiler> make_profiler(const Flags& flags,
                                                         const tandem::Strategy& strategy,
                                                         const TensorBoardLog& tensorboard,
                                                         const tandem::optim::Optimizer* optimizer);

/// Prints the replicas and their devices, the thread budget, the global batch and the learning
/// rate on one line; with gradient accumulation (accumulation_steps > 1) a second line gives the
/// effective batch of one update.
void print_setup(const SampleInfo& info, const tandem::Strategy& strategy, int64_t global_batch,
                 double learning_rate, int accumulation_steps = 1);

/// Makes --precision the global dtype policy (call before making the model) and, unless it is
/// float32, says so.
void set_precision(const Flags& flags);

/// Says where training starts: the checkpoint restored (`restored`, with the data's `epoch`
/// (0-based) and the optimizer's `step`), or a fresh start, and whether checkpoints are written.
void print_start(const std::optional<std::string>& restored, bool checkpointing, const Flags& flags,
                 uint64_t epoch, int64_t step);

/// Examples in one step: the sum of the replicas' batch sizes.
int64_t examples_in(const tandem::PerReplica<tandem::data::Batch>& batch);

/// Training steps in one epoch of `train_data` (capped by --max-steps); 0 when unknown.
int64_t steps_per_epoch(const tandem::data::DistributedDataset& train_data, const Flags& flags);

/// Accuracy of `model` on one pass over `test_data`: every replica runs the forward pass on its
/// part of each batch and updates `accuracy` (sync-on-read); result() then combines the
/// counts of every replica, of every worker in a multi-worker job (every worker calls this).
/// Resets `accuracy` first.
double evaluate(tandem::Strategy& strategy, const tandem::nn::Module& model,
                tandem::data::DistributedDataset& test_data,
                tandem::metrics::SparseCategoricalAccuracy& accuracy);

}  // namespace samples
