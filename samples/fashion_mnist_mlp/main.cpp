// fashion_mnist_mlp: the main job. Trains an MLP (784-256-128-10, ReLU) with Adam on
// Fashion-MNIST, data-parallel with MirroredStrategy on every device present, written the way
// docs/design.md §1 shows: a per-replica step that takes the ReplicaContext, strategy.run,
// strategy.reduce, optimizer.apply_gradients(ctx, ...). Resumes from its checkpoints; SIGTERM or
// Ctrl-C on any worker finishes the step, saves and exits 75 (every worker). Run from the
// repository root; --help lists the flags.
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <iomanip>
#include <iostream>
#include <optional>
#include <string>

#include "common/flags.h"
#include "common/reporting.h"
#include "common/training.h"
#include "tandem/tandem.h"

namespace td = tandem;

namespace {

const samples::SampleInfo kInfo{
    .name = "fashion_mnist_mlp",
    .description =
        "trains an MLP (784-256-128-10, ReLU, Adam) on Fashion-MNIST with MirroredStrategy",
    .default_checkpoint_dir = "checkpoints/fashion_mnist_mlp"};

int train_and_evaluate(const samples::Flags& flags) {
  // --devices, --replicas, or the best for how it was started (mpirun: every process a worker).
  const std::unique_ptr<td::Strategy> strategy_owner = samples::make_strategy(flags);
  td::Strategy& strategy = *strategy_owner;
  // --profile: where each step's time went, printed at each epoch's end (ends before the strategy).
  // --tensorboard: each epoch's figures and the profiler's breakdown, as TensorBoard scalars.
  samples::TensorBoardLog tensorboard(flags.tensorboard);
  const int num_replicas = strategy.num_replicas_in_sync();
  const int64_t global_batch = flags.per_replica_batch * num_replicas;
  const double learning_rate = flags.scaled_learning_rate(num_replicas);
  samples::print_setup(kInfo, strategy, global_batch, learning_rate, flags.accumulation_steps);

  auto train = td::data::fashion_mnist(td::data::Split::kTrain)
                   .shuffle(/*buffer_size=*/60000, flags.seed)
                   .batch(global_batch)
                   .prefetch(2);
  auto dist_train = strategy.distribute_dataset(train);  // splits each global batch
  auto dist_test = strategy.distribute_dataset(
      td::data::fashion_mnist(td::data::Split::kTest).batch(samples::eval_batch(strategy)));

  samples::set_precision(flags);  // the dtype policy the layers below are made under
  auto scope = strategy.scope();  // variables created while it lives are mirrored
  td::nn::Sequential model({td::nn::Flatten(), td::nn::Dense(256, td::nn::Activation::kRelu),
                            td::nn::Dense(128, td::nn::Activation::kRelu), td::nn::Dense(10)});
  model.set_seed(flags.seed);
  model.build({28, 28});
  // With --accumulation-steps N, each step adds into accumulators and every N-th step updates
  // with the mean of the N steps' gradients (one all-reduce per update).
  // With --shard-optimizer-state 1 or 2, each replica keeps only its own variables' slots.
  td::optim::Adam optimizer({.learning_rate = learning_rate,
                             .gradient_accumulation_steps = flags.accumulation_steps,
                             .shard_optimizer_state = flags.shard_optimizer_state});
  optimizer.build(model.trainable_variables());  // Adam's slots, mirrored like the weights
  // Under mixed_float16 the loss is scaled, so that small float16 gradients do not flush to
  // zero, and an update whose gradients overflow is skipped on every replica (Keras's
  // LossScaleOptimizer). bfloat16 has float32's range and needs none.
  std::optional<td::optim::LossScaleOptimizer> loss_scale;
  if (td::nn::global_policy().compute_dtype() == td::DType::kFloat16) loss_scale.emplace(optimizer);
  // What the step updates through: the loss scale when there is one, else Adam itself.
  td::optim::Optimizer& update =
      loss_scale ? static_cast<td::optim::Optimizer&>(*loss_scale) : optimizer;
  // Made after the optimizer, so that it ends first (its last summary reads the optimizer).
  const std::unique_ptr<td::profile::Profiler> profiler =
      samples::make_profiler(flags, strategy, tensorboard, &update);
  int64_t skipped_before = 0;  // updates the loss scale skipped before this epoch
  td::metrics::Mean train_loss("train_loss");
  td::metrics::SparseCategoricalAccuracy train_accuracy("train_accuracy");
  td::metrics::SparseCategoricalAccuracy test_accuracy("test_accuracy");
  td::losses::SparseCategoricalCrossentropy loss_fn(
      {.from_logits = true, .reduction = td::losses::Reduction::kNone});

  auto train_step = [&](td::ReplicaContext& ctx, const td::data::Batch& batch) {
    td::GradientTape tape;
    td::Tensor logits = model(batch.features(), /*training=*/true);
    td::Tensor per_example_loss = loss_fn(batch.labels(), logits);
    // Divided by the global batch of this step; the optimizer averages accumulated steps.
    td::Tensor loss = td::compute_average_loss(per_example_loss, global_batch);
    // The loss as scaled (under a loss scale), unscaled again before the update.
    auto grads = tape.gradient(update.scale_loss(loss), model.trainable_variables());
    update.apply_gradients(ctx, grads, model.trainable_variables());  // SUM across replicas
    train_loss.update_state(per_example_loss);
    train_accuracy.update_state(batch.labels(), logits);
    return loss;
  };

  // The metrics and the step counter are saved too, so that an epoch resumed after a stop
  // reports all its steps (and its examples: train_loss counts them).
  int64_t step_in_epoch = 0;
  td::Checkpoint checkpoint({{"model", &model},
                             {"optimizer", &update},
                             {"train_data", &dist_train},
                             {"train_loss", &train_loss},
                             {"train_accuracy", &train_accuracy},
                             {"step_in_epoch", &step_in_epoch}});
  // Every worker calls save(); only the chief writes.
  td::CheckpointManager manager(checkpoint, flags.checkpoint_dir,
                                {.max_to_keep = 3, .strategy = &strategy});
  // A build without HDF5 cannot write checkpoints; it trains without them.
  const bool checkpointing = td::build_info().hdf5;
  // SIGTERM (a preemption; tandem-run passes its own on) or Ctrl-C on any worker: every worker
  // finishes the step, the chief saves, and every worker exits with td::kPreemptedExitStatus.
  td::PreemptionCheckpointHandler preemption(strategy, manager, {.exit_process = false});
  const auto stop_requested = [&] {
    return checkpointing ? preemption.save_checkpoint_if_preempted() : preemption.job_preempted();
  };
  std::optional<std::string> restored;
  if (checkpointing && !flags.fresh) restored = manager.restore_or_initialize();
  samples::print_start(restored, checkpointing, flags, dist_train.epoch(), optimizer.iterations());

  // The chief alone writes the metrics file.
  samples::MetricsLog metrics_log(strategy.is_chief() ? flags.metrics_json : std::string(),
                                  /*append=*/restored.has_value());
  const int64_t steps_per_epoch = samples::steps_per_epoch(dist_train, flags);
  std::optional<double> final_test_accuracy;
  for (auto epoch = static_cast<int64_t>(dist_train.epoch()); epoch < flags.epochs; ++epoch) {
    samples::Progress progress(epoch + 1, flags.epochs, steps_per_epoch);
    tensorboard.set_epoch(epoch + 1);
    for (const auto& batch : dist_train) {  // td::PerReplica<td::data::Batch>
      td::PerReplica<td::Tensor> losses = strategy.run(train_step, batch);
      const float loss = strategy.reduce(td::ReduceOp::kSum, losses).item<float>();
      // This worker's examples times the workers (their shards are the same size).
      progress.step(++step_in_epoch, samples::examples_in(batch) * strategy.num_workers(), loss,
                    train_accuracy.result());
      if (stop_requested()) {
        // Mid-epoch: the data position, the metrics and the counters are saved with the weights.
        progress.finish();
        std::cout << "preempted: "
                  << (preemption.saved() ? "saved " + *preemption.saved() : "stopped")
                  << "; exiting with status " << td::kPreemptedExitStatus << std::endl;
        return td::kPreemptedExitStatus;
      }
      if (flags.step_limit_reached(step_in_epoch)) break;
    }
    progress.finish();
    if (dist_train.epoch() == static_cast<uint64_t>(epoch)) {
      dist_train.set_epoch(epoch + 1);      // --max-steps ended the epoch early
      if (profiler) profiler->end_epoch();  // which the dataset's end would have summarised
    }
    tensorboard.mark_profile(profiler.get());  // the epoch's training steps, not its evaluation

    samples::EpochResult result{
        .epoch = epoch + 1,
        .loss = train_loss.result(),
        .train_accuracy = train_accuracy.result(),
        .samples_per_sec = progress.samples_per_sec(),
        .train_seconds = progress.seconds(),
        .replicas = num_replicas,
        // Every replica's loss values, of every worker: the examples the epoch trained on.

        .examples = static_cast<int64_t>(train_loss.combined_state().scalar("count"))};
    if (loss_scale) {
      result.loss_scale = loss_scale->loss_scale();
      result.skipped_updates = loss_scale->skipped_updates() - skipped_before;
      skipped_before = loss_scale->skipped_updates();
    }
    const samples::Stopwatch eval_time;
    result.test_accuracy = samples::evaluate(strategy, model, dist_test, test_accuracy);
    result.eval_seconds = eval_time.seconds();
    samples::print_epoch_summary(result, flags.epochs);
    final_test_accuracy = result.test_accuracy;
    train_loss.reset_state();
    train_accuracy.reset_state();
    step_in_epoch = 0;
    std::optional<std::string> saved;
    if (checkpointing) saved = manager.save();
    // Logged once the checkpoint covering the epoch is saved: a run stopped before the save
    // resumes from the epoch before and logs this one once, when it trains it again.
    metrics_log.write(result);
    tensorboard.write(result, optimizer.current_learning_rate());
    tensorboard.write_profile(profiler.get());
    if (epoch + 1 < flags.epochs && preemption.job_preempted()) {  // a stop during the evaluation
      std::cout << "preempted: " << (saved ? "saved " + *saved : "stopped")
                << "; exiting with status " << td::kPreemptedExitStatus << std::endl;
      return td::kPreemptedExitStatus;
    }
  }

  if (!final_test_accuracy) {  // resumed a run that had already trained every epoch
    final_test_accuracy = samples::evaluate(strategy, model, dist_test, test_accuracy);
  }
  std::cout << "final test accuracy: " << std::fixed << std::setprecision(4) << *final_test_accuracy
            << std::endl;
  return EXIT_SUCCESS;
}

}  // namespace

int main(int argc, char** argv) {
  const samples::Flags flags = samples::parse_flags_or_exit(argc, argv, kInfo);
  try {
    return train_and_evaluate(flags);
  } catch (const std::exception& error) {
    std::cerr << kInfo.name << ": " << error.what() << std::endl;
    return EXIT_FAILURE;
  }
}
