// CheckpointManager: numbering, rotation with max_to_keep, the TensorFlow state file after every
// save, the checkpoint interval, chief-only writes with 4 replicas, and the leftover-temp cleanup.
#include "checkpoint_test_util.h"

namespace td = tandem;
using namespace tandem::checkpoint_testing;

namespace {

/// A one-replica model and optimizer, with a global_step counter the test drives.
struct Small {
  Small() {
    model.set_seed(3);
    model.build({4});
  }
  td::Checkpoint checkpoint() {
    return td::Checkpoint(
        {{"model", &model}, {"optimizer", &optimizer}, {"global_step", &global_step}});
  }
  td::nn::Sequential model{td::nn::Dense(3), td::nn::Dense(2)};
  td::optim::SGD optimizer{td::optim::SGD::Options{.learning_rate = 0.1, .momentum = 0.9}};
  int64_t global_step = 0;
};

std::vector<std::string> ckpt_files(const std::string& dir) {
  std::vector<std::string> out;
  for (const std::string& name : list_dir(dir))
    if (name.starts_with("ckpt-")) out.push_back(name);
  return out;
}

}  // namespace

TEST_CASE(
    "checkpoint manager: rotation keeps max_to_keep and the state file is valid after every save",
    "[cpu][checkpoint]") {
  TempDir dir;
  Small s;
  td::CheckpointManager manager(s.checkpoint(), dir.str(), {.max_to_keep = 3});
  REQUIRE_FALSE(manager.latest_checkpoint().has_value());
  std::vector<std::string> expected;
  for (int64_t step = 1; step <= 7; ++step) {
    s.global_step = step * 10;
    const std::optional<std::string> path = manager.save();
    REQUIRE(path == dir.file("ckpt-" + std::to_string(step * 10) + ".h5"));
    expected.push_back("ckpt-" + std::to_string(step * 10) + ".h5");
    if (expected.size() > 3) expected.erase(expected.begin());

    const auto [latest, all] = parse_state_file(dir.str());
    CHECK(latest == expected.back());
    CHECK(all == expected);  // oldest first
    for (const std::string& name : all) CHECK(fs::exists(dir.file(name)));
    std::vector<std::string> sorted_expected = expected;
    std::sort(sorted_expected.begin(), sorted_expected.end());
    CHECK(ckpt_files(dir.str()) == sorted_expected);  // nothing beyond max_to_keep remains
    CHECK(manager.latest_checkpoint() == dir.file(expected.back()));
    CHECK_FALSE(has_temp_files(dir.str()));
  }
  CHECK(manager.checkpoints() == std::vector<std::string>{dir.file("ckpt-50.h5"),
                                                          dir.file("ckpt-60.h5"),
                                                          dir.file("ckpt-70.h5")});

  // A new manager on the directory continues the rotation from the state file.
  td::CheckpointManager again(s.checkpoint(), dir.str(), {.max_to_keep = 3});
  CHECK(again.checkpoints() == manager.checkpoints());
  s.global_step = 80;
  again.save();
  CHECK(parse_state_file(dir.str()).second ==
        std::vector<std::string>{"ckpt-60.h5", "ckpt-70.h5", "ckpt-80.h5"});
  CHECK_FALSE(fs::exists(dir.file("ckpt-50.h5")));
  CHECK(td::latest_checkpoint(dir.str()) == dir.file("ckpt-80.h5"));
}

TEST_CASE("checkpoint manager: max_to_keep 0 keeps everything and save(step) names the file",
          "[cpu][checkpoint]") {
  TempDir dir;
  Small s;
  td::CheckpointManager manager(s.checkpoint(), dir.str(), {.max_to_keep = 0});
  for (int64_t step : {5, 6, 7, 8, 9})
    CHECK(manager.save(step) == dir.file("ckpt-" + std::to_string(step) + ".h5"));
  CHECK(ckpt_files(dir.str()).size() == 5);
  CHECK(parse_state_file(dir.str()).second.size() == 5);
  // Saving the same step again replaces that file and lists it once, as the newest.
  manager.save(7);
  CHECK(parse_state_file(dir.str()).second ==
        std::vector<std::string>{"ckpt-5.h5", "ckpt-6.h5", "ckpt-8.h5", "ckpt-9.h5", "ckpt-7.h5"});
}

TEST_CASE("checkpoint manager: checkpoint_interval is judged on the global step",
          "[cpu][checkpoint]") {
  TempDir dir;
  Small s;
  td::CheckpointManager manager(s.checkpoint(), dir.str(),
                                {.max_to_keep = 0, .checkpoint_interval = 3});
  std::vector<int64_t> written;
  for (int64_t step = 0; step <= 10; ++step) {
    s.global_step = step;
    if (manager.save()) written.push_back(step);
  }
  CHECK(written == std::vector<int64_t>{0, 3, 6, 9});

  // TensorFlow's rule: the first save writes whatever its step, later ones once the interval
  // has passed since the last written (steps from 1, interval 20: 1, 21, 41).
  TempDir from_one;
  td::CheckpointManager tf_rule(s.checkpoint(), from_one.str(),
                                {.max_to_keep = 0, .checkpoint_interval = 20});
  written.clear();
  for (int64_t step = 1; step <= 50; ++step) {
    s.global_step = step;
    if (tf_rule.save()) written.push_back(step);
  }
  CHECK(written == std::vector<int64_t>{1, 21, 41});

  // Without a global_step counter the optimizer's iterations number the checkpoints.
  TempDir other;
  Small t;
  td::CheckpointManager by_iterations(
      td::Checkpoint({{"model", &t.model}, {"optimizer", &t.optimizer}}), other.str());
  t.optimizer.set_iterations(42);
  CHECK(by_iterations.save() == other.file("ckpt-42.h5"));
}

TEST_CASE("checkpoint manager: with 4 replicas exactly one file per save appears",
          "[cpu][checkpoint]") {
  TempDir dir;
  auto strategy = td::MirroredStrategy::cpu(4);
  td::nn::Sequential model(
      {td::nn::Dense(8, td::nn::Activation::kRelu), td::nn::Dropout(0.5), td::nn::Dense(2)});
  std::unique_ptr<td::optim::Adam> optimizer;
  {
    auto scope = strategy.scope();
    model.build({4});
    optimizer = std::make_unique<td::optim::Adam>();
    optimizer->build(model.trainable_variables());
  }
  td::metrics::Mean loss_metric("loss");
  int64_t global_step = 0;
  td::Checkpoint checkpoint({{"model", &model},
                             {"optimizer", optimizer.get()},
                             {"loss", &loss_metric},
                             {"global_step", &global_step}});
  td::CheckpointManager manager(checkpoint, dir.str(), {.max_to_keep = 0});

  std::atomic<int> temp_files_created{0};
  auto previous = td::detail::set_checkpoint_save_hook([&](std::string_view point) {
    if (point == "temp_created") ++temp_files_created;
  });

  // Every replica calls save() inside strategy.run (each also updates its metric partial
  // first): replica 0 alone writes, after all have arrived; all return its path.
  for (int save = 1; save <= 3; ++save) {
    global_step = save;
    const auto results = strategy.run([&](td::ReplicaContext& ctx) {
      loss_metric.update_state(td::Tensor::scalar(1.0 + ctx.replica_id_in_sync_group()));
      return manager.save();
    });
    for (const std::optional<std::string>& result : strategy.local_results(results))
      CHECK(result == dir.file("ckpt-" + std::to_string(save) + ".h5"));
    CHECK(temp_files_created.load() == save);
    CHECK(ckpt_files(dir.str()).size() == static_cast<size_t>(save));
    CHECK_FALSE(has_temp_files(dir.str()));
  }
  // And from the training loop's thread (the chief in one process): one more file.
  global_step = 4;
  CHECK(manager.save() == dir.file("ckpt-4.h5"));
  CHECK(temp_files_created.load() == 4);
  CHECK(ckpt_files(dir.str()).size() == 4);
  td::detail::set_checkpoint_save_hook(previous);

  // The gathered state: 4 replica rows of dropout streams; the metric partials' SUM.
  td::h5::File file = td::h5::File::open(dir.file("ckpt-3.h5"));
  const td::h5::Group state = file.root().open_group("training_state");
  CHECK(state.dataset_shape("rng/replica_state") == td::Shape({4, 4}));
  CHECK(state.read_tensor("metrics/loss/count").to_vector<double>()[0] == 12.0);
  CHECK(state.read_tensor("metrics/loss/total").to_vector<double>()[0] == 3 * (1 + 2 + 3 + 4));
  CHECK(file.root().read_attr_int64("num_replicas") == 4);
}

TEST_CASE("checkpoint manager: leftover temporary files are removed at start-up",
          "[cpu][checkpoint]") {
  TempDir dir;
  Small s;
  {
    td::CheckpointManager manager(s.checkpoint(), dir.str());
    manager.save(1);
  }
  write_text(dir.file("ckpt-2.h5.tmp.99999"), "half a checkpoint");
  write_text(dir.file("checkpoint.tmp.4242"), "model_checkpoint_path: \"ckpt-2.h5\"\n");
  write_text(dir.file("notes.tmp.txt"), "not ours");
  td::CheckpointManager manager(s.checkpoint(), dir.str());
  CHECK(list_dir(dir.str()) ==
        std::vector<std::string>{"checkpoint", "ckpt-1.h5", "notes.tmp.txt"});
  CHECK(manager.restore_or_initialize() == dir.file("ckpt-1.h5"));
}
