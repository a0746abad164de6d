// api_tour: the complete example of docs/api-tour.md. Fits a linear model to synthetic data
// made on the host, on two CPU replicas: a per-replica step run by strategy.run on each batch
// of a distributed dataset, compute_average_loss, strategy.reduce, a metric and checkpoints.
// Exits non-zero unless the fit is close. Usage: api_tour [--epochs N] [--checkpoint-dir DIR]
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <iostream>
#include <string>
#include <string_view>
#include <vector>

#include "tandem/tandem.h"

namespace td = tandem;

int main(int argc, char** argv) {
  try {
    int epochs = 20;
    std::string checkpoint_dir = "checkpoints/api_tour";
    for (int i = 1; i < argc; i += 2) {
      const std::string_view flag = argv[i];
      TANDEM_CHECK((flag == "--epochs" || flag == "--checkpoint-dir") && i + 1 < argc,
                   "usage: api_tour [--epochs N] [--checkpoint-dir DIR] (got ", flag, ")");
      if (flag == "--epochs") epochs = std::stoi(argv[i + 1]);
      if (flag == "--checkpoint-dir") checkpoint_dir = argv[i + 1];
    }

    // Host data: y = 3 x0 - 2 x1 + 0.5 x2 + 1, plus a little noise.
    const int64_t num_examples = 1024, num_features = 3;
    td::Generator generator(/*seed=*/7);
    const std::vector<float> x =
        td::Tensor::normal({num_examples, num_features}, generator).to_vector<float>();
    const std::vector<float> noise =
        td::Tensor::normal({num_examples}, generator, /*mean=*/0.0, /*stddev=*/0.01)
            .to_vector<float>();
    std::vector<float> y(num_examples);
    for (int64_t i = 0; i < num_examples; ++i) {
      const float* row = &x[i * num_features];
      y[i] = 3.0f * row[0] - 2.0f * row[1] + 0.5f * row[2] + 1.0f + noise[i];
    }
    td::Tensor features = td::Tensor::from_vector(x, {num_examples, num_features});
    td::Tensor targets = td::Tensor::from_vector(y, {num_examples, 1});

    td::MirroredStrategy strategy = td::MirroredStrategy::cpu(2);  // replicas cpu:0 and cpu:1
    const int64_t global_batch = 32 * strategy.num_replicas_in_sync();
    auto dataset = td::data::from_tensor_slices({features, targets})
                       .shuffle(/*buffer_size=*/num_examples, /*seed=*/42)
                       .batch(global_batch);
    auto dist_dataset = strategy.distribute_dataset(dataset);  // splits each global batch

    auto scope = strategy.scope();  // variables created while it lives are mirrored
    td::nn::Sequential model({td::nn::Dense(1)});
    model.build({num_features});
    td::optim::Adam optimizer({.learning_rate = 0.05});
    optimizer.build(model.trainable_variables());
    td::losses::MeanSquaredError loss_fn({.reduction = td::losses::Reduction::kNone});
    td::metrics::Mean train_loss("train_loss");

    auto train_step = [&](td::ReplicaContext& ctx, const td::data::Batch& batch) {
      td::GradientTape tape;
      td::Tensor predictions = model(batch.features(), /*training=*/true);
      td::Tensor per_example_loss = loss_fn(batch.labels(), predictions);
      td::Tensor loss = td::compute_average_loss(per_example_loss, global_batch);
      auto grads = tape.gradient(loss, model.trainable_variables());
      optimizer.apply_gradients(ctx, grads, model.trainable_variables());  // SUM across replicas
      train_loss.update_state(per_example_loss);
      return loss;
    };

    // Checkpoints need HDF5 in the build; a run resumes from the newest one.
    const bool checkpointing = td::build_info().hdf5;
    int64_t epoch = 0;  // epochs done: restored with the rest, so a resumed run goes on from it
    td::Checkpoint checkpoint({{"model", &model},
                               {"optimizer", &optimizer},
                               {"train_data", &dist_dataset},
                               {"train_loss", &train_loss},
                               {"epoch", &epoch}});
    td::CheckpointManager manager(checkpoint, checkpoint_dir,
                                  {.max_to_keep = 2, .strategy = &strategy});
    if (checkpointing) {
      if (auto restored = manager.restore_or_initialize())
        std::cout << "resumed from " << *restored << "\n";
    }

    while (epoch < epochs) {
      train_loss.reset_state();
      float last_step_loss = 0.0f;
      for (const auto& batch : dist_dataset) {  // a td::PerReplica<td::data::Batch>
        td::PerReplica<td::Tensor> losses = strategy.run(train_step, batch);
        last_step_loss = strategy.reduce(td::ReduceOp::kSum, losses).item<float>();
      }
      ++epoch;
      if (checkpointing) manager.save();
      if (epoch == 1 || epoch % 5 == 0 || epoch == epochs) {
        std::cout << "epoch " << epoch << "/" << epochs << "  mean loss " << train_loss.result()
                  << "  last step " << last_step_loss << "\n";
      }
    }

    // Outside strategy.run a mirrored variable reads as replica 0's copy (all are equal).
    const td::nn::Dense dense = model.layer(0).as<td::nn::Dense>();
    const std::vector<float> w = dense.kernel().value().to_vector<float>();
    const float b = dense.bias().value().item<float>();
    std::cout << "learned w = [" << w[0] << ", " << w[1] << ", " << w[2] << "], b = " << b
              << "  (true: [3, -2, 0.5], 1)\n";
    if (!(train_loss.result() < 0.01)) {
      std::cerr << "api_tour: FAILED: the mean loss is " << train_loss.result() << "\n";
      return EXIT_FAILURE;
    }
    std::cout << "api_tour: OK\n";
    return EXIT_SUCCESS;
  } catch (const std::exception& e) {
    std::cerr << "api_tour: " << e.what() << "\n";
    return EXIT_FAILURE;
  }
}
