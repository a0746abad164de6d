// The training loop of the image samples (fashion_mnist_cnn, fashion_mnist_resnet): the loop of
// fashion_mnist_mlp (docs/design.md §1, written out there), on images reshaped to [28, 28, 1]
// for a model the sample makes.
#include "common/image_classifier.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <iomanip>
#include <iostream>
#include <optional>
#include <string>

#include "common/reporting.h"
#include "common/training.h"

namespace samples {

namespace td = tandem;

namespace {

/// Images [B, 28, 28] -> [B, 28, 28, 1] (NHWC with one channel), a view of the same rows.
td::data::Element add_channel_axis(td::data::Element batch) {
  const td::Tensor& images = batch[0];
  batch[0] = images.reshape({images.dim(0), images.dim(1), images.dim(2), 1});
  return batch;
}

/// Writes Fashion-MNIST's training images into `directory` as TFRecord files of
/// tf.train.Examples {image: PNG bytes, label: int64}, as a tf.data pipeline's input would come.
void write_fashion_mnist_tfrecords(const std::string& directory, int files) {
  std::filesystem::create_directories(directory);
  const td::data::Dataset images = td::data::fashion_mnist(td::data::Split::kTrain);
  const int64_t total = images.cardinality();
  const int64_t per_file = (total + files - 1) / files;
  std::cout << "writing Fashion-MNIST's " << total << " training images to " << directory
            << " as PNGs in tf.train.Examples (" << files << " TFRecord files)" << std::endl;
  td::data::Iterator it = images.iterator();
  td::data::Element element;
  for (int f = 0; f < files; ++f) {
    const std::string name =
        directory + "/train-" + std::to_string(f) + "-of-" + std::to_string(files) + ".tfrecord";
    td::io::TFRecordWriter writer(name + ".part");
    for (int64_t i = 0; i < per_file && it.next(element); ++i) {
      const std::vector<float> pixels = element[0].to_vector<float>();  // in [0, 1]: k / 255
      std::vector<uint8_t> bytes(pixels.size());
      for (size_t p = 0; p < pixels.size(); ++p)
        bytes[p] = static_cast<uint8_t>(std::lround(pixels[p] * 255.0f));
      td::data::Example example;
      example
          .set_bytes("image", {td::data::encode_png(td::Tensor::from_vector(bytes, {28, 28, 1}))})
          .set_int64s("label", {element[1].item<int64_t>()});
      writer.write(example.serialize());
    }
    writer.close();
    std::filesystem::rename(name + ".part", name);  // whole files only, should this be stopped
  }
}

/// The training examples as global batches of {float32 [B, 28, 28] in [0, 1], int64 [B]}:
/// Fashion-MNIST's IDX files, or (--tfrecords) TFRecord files of PNG/JPEG Examples, parsed and
/// decoded on every core of the compute budget.
td::data::Dataset training_batches(const Flags& flags, int64_t global_batch) {
  if (flags.tfrecords.empty()) {
    return td::data::fashion_mnist(td::data::Split::kTrain)
        .shuffle(/*buffer_size=*/60000, flags.seed)
        .batch(global_batch);
  }
  const std::string pattern = flags.tfrecords + "/*.tfrecord";
  std::error_code ignored;
  bool any = false;
  for (const auto& entry : std::filesystem::directory_iterator(flags.tfrecords, ignored))
    any = any || entry.path().extension() == ".tfrecord";
  if (!any) write_fashion_mnist_tfrecords(flags.tfrecords, /*files=*/8);
  const td::data::FeatureSpec spec = {{"image", td::data::FixedLenFeature{{}, td::DType::kUInt8}},
                                      {"label", td::data::FixedLenFeature{{}, td::DType::kInt64}}};
  auto decode = [spec](td::data::Element record) {
    td::data::Element example = td::data::parse_example(record[0], spec);
    const td::Tensor image = td::data::decode_image(example[0], /*channels=*/1);
    TANDEM_CHECK(image.dim(0) == 28 && image.dim(1) == 28, "--tfrecords: an image is ",
                 image.dim(0), "x", image.dim(1), ", not 28x28");
    return td::data::Element{
        td::data::normalize(image, {0.0f}, {1.0f}, td::DType::kFloat32).reshape({28, 28}),
        example[1]};
  };
  const td::data::Dataset records = td::data::tfrecord(td::data::list_files(pattern));
  return records.shuffle(/*buffer_size=*/records.cardinality(), flags.seed)
      .map(decode, td::data::kAutotune)
      .batch(global_batch);
}

}  // namespace

int train_image_classifier(const SampleInfo& info, const Flags& flags,
                           const std::function<td::nn::Sequential()>& make_model) {
  // --devices, --replicas, or the best for how it was started (mpirun: every process a worker).
  const std::unique_ptr<td::Strategy> strategy_owner = make_strategy(flags);
  td::Strategy& strategy = *strategy_owner;
  // --profile: where each step's time went, printed at each epoch's end (ends before the strategy).
  // --tensorboard: each epoch's figures and the profiler's breakdown, as TensorBoard scalars.
  TensorBoardLog tensorboard(flags.tensorboard);
  const int num_replicas = strategy.num_replicas_in_sync();
  const int64_t global_batch = flags.per_replica_batch * num_replicas;
  const double learning_rate = flags.scaled_learning_rate(num_replicas);
  print_setup(info, strategy, global_batch, learning_rate, flags.accumulation_steps);

  auto train = training_batches(flags, global_batch).map(add_channel_axis).prefetch(2);
  auto dist_train = strategy.distribute_dataset(train);  // splits each global batch
  auto dist_test = strategy.distribute_dataset(td::data::fashion_mnist(td::data::Split::kTest)
                                                   .batch(eval_batch(strategy))
                                                   .map(add_channel_axis));

  set_precision(flags);           // the dtype policy the layers below are made under
  auto scope = strategy.scope();  // variables created while it lives are mirrored
  td::nn::Sequential model = make_model();
  model.set_seed(flags.seed);
  model.build({28, 28, 1});
  // With --accumulation-steps N, each step adds into accumulators and every N-th step updates
  // with the mean of the N steps' gradients (one all-reduce per update).
  // --lr-schedule cosine: from the learning rate to 0 over every update of --epochs.
  const int64_t steps_per_epoch = samples::steps_per_epoch(dist_train, flags);
  const int64_t updates =
      std::max<int64_t>(flags.epochs * steps_per_epoch / flags.accumulation_steps, 1);
  const td::optim::LearningRate rate =
      flags.lr_schedule == "cosine"
          ? td::optim::LearningRate(td::optim::schedules::CosineDecay(learning_rate, updates))
          : td::optim::LearningRate(learning_rate);
  if (flags.lr_schedule == "cosine")
    std::cout << "learning rate: cosine decay from " << learning_rate << " to 0 over " << updates
              << " updates" << std::endl;
  td::optim::Adam optimizer({.learning_rate = rate,
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
      make_profiler(flags, strategy, tensorboard, &update);
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
  print_start(restored, checkpointing, flags, dist_train.epoch(), optimizer.iterations());

  // The chief alone writes the metrics file.
  MetricsLog metrics_log(strategy.is_chief() ? flags.metrics_json : std::string(),
                         /*append=*/restored.has_value());
  std::optional<double> final_test_accuracy;
  for (auto epoch = static_cast<int64_t>(dist_train.epoch()); epoch < flags.epochs; ++epoch) {
    Progress progress(epoch + 1, flags.epochs, steps_per_epoch);
    tensorboard.set_epoch(epoch + 1);
    for (const auto& batch : dist_train) {  // td::PerReplica<td::data::Batch>
      td::PerReplica<td::Tensor> losses = strategy.run(train_step, batch);
      const float loss = strategy.reduce(td::ReduceOp::kSum, losses).item<float>();
      // This worker's examples times the workers (their shards are the same size).
      progress.step(++step_in_epoch, examples_in(batch) * strategy.num_workers(), loss,
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

    EpochResult result{
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
    const Stopwatch eval_time;
    result.test_accuracy = evaluate(strategy, model, dist_test, test_accuracy);
    result.eval_seconds = eval_time.seconds();
    print_epoch_summary(result, flags.epochs);
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
    final_test_accuracy = evaluate(strategy, model, dist_test, test_accuracy);
  }
  std::cout << "final test accuracy: " << std::fixed << std::setprecision(4) << *final_test_accuracy
            << std::endl;
  return EXIT_SUCCESS;
}

}  // namespace samples
