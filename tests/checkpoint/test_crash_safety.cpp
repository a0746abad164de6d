// Crash safety: a child process saving a large checkpoint is killed with SIGKILL at every step of
// the write protocol (stopped there by the save-point hook) and at arbitrary moments of a save
// loop; the previous checkpoint still restores, and the temporary file is removed at the next
// start.
#include <csignal>

#include "checkpoint_test_util.h"

namespace td = tandem;
using namespace tandem::checkpoint_testing;

namespace {

constexpr const char* kChildTest = "checkpoint crash: a child that saves until it is killed";

/// ~2.1M float32 weights (8.4 MB), with Adam's two slots a ~25 MB checkpoint.
struct BigRun {
  BigRun() {
    model.set_seed(9);
    model.build({1024});
    optimizer.build(model.trainable_variables());
  }
  td::Checkpoint checkpoint() {
    return td::Checkpoint(
        {{"model", &model}, {"optimizer", &optimizer}, {"global_step", &global_step}});
  }
  td::nn::Sequential model{td::nn::Dense(1024, td::nn::Activation::kRelu), td::nn::Dense(1024)};
  td::optim::Adam optimizer;
  int64_t global_step = 1;
};

/// The steps of a save, in order (see detail::set_checkpoint_save_hook).
const std::vector<std::string> kPoints = {"temp_created",   "model_weights", "optimizer_weights",
                                          "training_state", "temp_closed",   "temp_synced",
                                          "renamed",        "state_written", "rotated"};

bool before_rename(const std::string& point) {
  return point != "renamed" && point != "state_written" && point != "rotated";
}

void copy_dir(const std::string& from, const std::string& to) {
  for (const std::string& name : list_dir(from)) fs::copy_file(from + "/" + name, to + "/" + name);
}

/// Starts the child, waits for its marker, kills it with SIGKILL.
void kill_child_at(const std::string& dir, const std::string& point, int delay_ms) {
  const std::string marker = dir + "/reached";
  const pid_t pid = spawn_child(kChildTest,
                                {{"TANDEM_CKPT_TEST_DIR", dir},
                                 {"TANDEM_CKPT_TEST_KILL_POINT", point},
                                 {"TANDEM_CKPT_TEST_MARKER", marker},
                                 {"TANDEM_LOG_LEVEL", "warning"}},
                                dir + "/../child-" + point + ".log");
  const bool reached = wait_for_file(marker, pid, std::chrono::seconds(180));
  if (delay_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
  ::kill(pid, SIGKILL);
  const int status = wait_child(pid);
  INFO("child output:\n" << read_text(dir + "/../child-" + point + ".log"));
  REQUIRE(reached);
  REQUIRE(WIFSIGNALED(status));
  REQUIRE(WTERMSIG(status) == SIGKILL);
  fs::remove(marker);
}

}  // namespace

TEST_CASE("checkpoint crash safety: SIGKILL at every step of a save and at random moments",
          "[cpu][checkpoint]") {
  TempDir root;
  const std::string base = root.file("base");
  fs::create_directories(base);
  std::vector<float> initial_kernel;
  {
    BigRun run;
    initial_kernel = run.model.weights()[0].copy(0).to_vector<float>();
    td::CheckpointManager manager(run.checkpoint(), base, {.max_to_keep = 2});
    REQUIRE(manager.save() == base + "/ckpt-1.h5");
  }
  // The first kernel of the checkpoint numbered `step`: the initial values for 1, else the
  // constant the child filled the model with before saving.
  auto expected_kernel = [&](int64_t step) {
    return step == 1 ? initial_kernel
                     : std::vector<float>(initial_kernel.size(), static_cast<float>(step));
  };

  for (const std::string& point : kPoints) {
    {
      INFO("killed at " << point);
      const std::string dir = root.file(point);
      fs::create_directories(dir);
      copy_dir(base, dir);
      kill_child_at(dir, point, /*delay_ms=*/0);
      if (before_rename(point)) CHECK(has_temp_files(dir));  // it died mid-write
      if (point == "renamed") CHECK(fs::exists(dir + "/ckpt-2.h5"));

      BigRun run;
      td::CheckpointManager manager(run.checkpoint(), dir, {.max_to_keep = 2});
      CHECK_FALSE(has_temp_files(dir));  // cleaned at start-up
      const std::optional<std::string> restored = manager.restore_or_initialize();
      // The state file is the commit point: until it names ckpt-2, ckpt-1 is the checkpoint.
      const int64_t step = (point == "state_written" || point == "rotated") ? 2 : 1;
      CHECK(restored == dir + "/ckpt-" + std::to_string(step) + ".h5");
      CHECK(run.global_step == step);
      CHECK(run.model.weights()[0].copy(0).to_vector<float>() == expected_kernel(step));
    }
  }

  for (int delay_ms : {40, 150, 400}) {
    {
      INFO("killed " << delay_ms << " ms into a save loop");
      const std::string dir = root.file("loop" + std::to_string(delay_ms));
      fs::create_directories(dir);
      copy_dir(base, dir);
      kill_child_at(dir, "loop", delay_ms);
      BigRun run;
      td::CheckpointManager manager(run.checkpoint(), dir, {.max_to_keep = 2});
      CHECK_FALSE(has_temp_files(dir));
      const std::optional<std::string> restored = manager.restore_or_initialize();
      REQUIRE(restored.has_value());
      CHECK(*restored == dir + "/ckpt-" + std::to_string(run.global_step) + ".h5");
      CHECK(run.model.weights()[0].copy(0).to_vector<float>() == expected_kernel(run.global_step));
      CHECK(td::latest_checkpoint(dir) == restored);
      // A kill between deleting the oldest checkpoint and rewriting the state file leaves that
      // name listed (the protocol's order); the next save lists only files that exist.
      run.global_step = 1000;
      REQUIRE(manager.save() == dir + "/ckpt-1000.h5");
      const auto [latest, all] = parse_state_file(dir);
      CHECK(latest == "ckpt-1000.h5");
      CHECK(all.size() == 2);
      for (const std::string& name : all) CHECK(fs::exists(dir + "/" + name));
    }
  }
}

TEST_CASE("checkpoint crash: a child that saves until it is killed", "[.child]") {
  const std::string dir = env_or_empty("TANDEM_CKPT_TEST_DIR");
  const std::string point = env_or_empty("TANDEM_CKPT_TEST_KILL_POINT");
  const std::string marker = env_or_empty("TANDEM_CKPT_TEST_MARKER");
  if (dir.empty() || point.empty() || marker.empty()) return;  // only run by the test above
  BigRun run;
  td::CheckpointManager manager(run.checkpoint(), dir, {.max_to_keep = 2});
  REQUIRE(manager.restore_or_initialize() == dir + "/ckpt-1.h5");
  if (point == "loop") {
    write_text(marker, "ready");
    for (int64_t step = 2;; ++step) {
      fill_model(run.model, static_cast<float>(step));
      run.global_step = step;
      manager.save();
    }
  }
  td::detail::set_checkpoint_save_hook([&](std::string_view reached) {
    if (reached != point) return;
    write_text(marker, "reached");
    for (;;) ::pause();  // wait here for SIGKILL
  });
  fill_model(run.model, 2.0f);
  run.global_step = 2;
  manager.save();
  FAIL("the save finished without reaching the point " << point);
}
