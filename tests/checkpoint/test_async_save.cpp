// Asynchronous saves (CheckpointManager::Options::async_save): save() returns once the state is
// copied, so what the file holds is the step at save() even when training changes the weights
// right after; the state file moves only once the file is in place; a failed background write
// is raised at wait() or at the next save() and leaves the previous checkpoint the newest; and
// a process killed with SIGKILL at random moments of back-to-back background writes (30 times)
// always leaves a newest checkpoint that restores, every checkpoint file whole.
#include <algorithm>
#include <chrono>
#include <csignal>
#include <random>

#include "checkpoint_test_util.h"
#include "tandem/checkpoint/internal/file_io.h"

namespace td = tandem;
using namespace tandem::checkpoint_testing;

namespace {

constexpr const char* kChildTest = "asynchronous save: a child that saves until it is killed";

/// ~263K float32 weights, with Adam's two slots a ~3 MB checkpoint: large enough that a
/// background write takes a while (a child saving back to back is almost always inside one),
/// small enough that 30 child processes under the sanitizers on a busy machine stay quick.
struct Run {
  Run() {
    model.set_seed(5);
    model.build({256});
    optimizer.build(model.trainable_variables());
  }
  td::Checkpoint checkpoint() {
    return td::Checkpoint(
        {{"model", &model}, {"optimizer", &optimizer}, {"global_step", &global_step}});
  }
  td::nn::Sequential model{td::nn::Dense(512, td::nn::Activation::kRelu), td::nn::Dense(256)};
  td::optim::Adam optimizer;
  int64_t global_step = 1;
};

/// Every value of every weight equals `value`.
bool all_weights_are(const Run& run, float value) {
  for (const td::Variable& v : run.model.weights())
    for (float x : v.copy(0).to_vector<float>())
      if (x != value) return false;
  return true;
}

/// The step of the checkpoint `dir`'s state file names (the newest committed save), 0 without one.
int64_t committed_step(const std::string& dir) {
  const std::optional<std::string> latest = td::latest_checkpoint(dir);
  if (!latest) return 0;
  const std::string stem = fs::path(*latest).stem().string();  // ckpt-N
  return std::stoll(stem.substr(stem.find('-') + 1));
}

/// Polls until `dir`'s state file names step `step` or a later one; false after `timeout` or
/// when the child `pid` has exited first.
bool wait_for_commit(const std::string& dir, int64_t step, pid_t pid,
                     std::chrono::seconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (committed_step(dir) >= step) return true;
    int status = 0;
    if (::waitpid(pid, &status, WNOHANG) == pid) return committed_step(dir) >= step;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return false;
}

}  // namespace

TEST_CASE("asynchronous save: the file holds the step at save(), the state file moves after it",
          "[cpu][checkpoint]") {
  TempDir dir;
  Run run;
  td::CheckpointManager manager(run.checkpoint(), dir.str(),
                                {.max_to_keep = 2, .async_save = true});
  for (int64_t step = 1; step <= 4; ++step) {
    fill_model(run.model, static_cast<float>(step));
    run.global_step = step;
    REQUIRE(manager.save() == dir.file("ckpt-" + std::to_string(step) + ".h5"));
    // Training goes on at once: the weights change while the file is written.
    fill_model(run.model, -1.0f);
  }
  manager.wait();
  CHECK(manager.latest_checkpoint() == dir.file("ckpt-4.h5"));
  CHECK(manager.checkpoints() ==
        std::vector<std::string>{dir.file("ckpt-3.h5"), dir.file("ckpt-4.h5")});
  CHECK_FALSE(has_temp_files(dir.str()));
  for (const int64_t step : {3, 4}) {
    Run restored;
    td::CheckpointManager reader(restored.checkpoint(), dir.str());
    reader.restore(dir.file("ckpt-" + std::to_string(step) + ".h5"));
    CHECK(restored.global_step == step);
    CHECK(all_weights_are(restored, static_cast<float>(step)));
  }
  // restore_or_initialize waits for a write in flight: it finds the newest checkpoint.
  run.global_step = 5;
  fill_model(run.model, 5.0f);
  REQUIRE(manager.save().has_value());
  CHECK(manager.restore_or_initialize() == dir.file("ckpt-5.h5"));
  CHECK(all_weights_are(run, 5.0f));
}

TEST_CASE("asynchronous save: a failed background write is raised, the previous checkpoint kept",
          "[cpu][checkpoint]") {
  TempDir dir;
  Run run;
  td::CheckpointManager manager(run.checkpoint(), dir.str(), {.async_save = true});
  REQUIRE(manager.save() == dir.file("ckpt-1.h5"));
  manager.wait();
  auto fail_once_at = [](const std::string& point) {
    auto armed = std::make_shared<std::atomic<bool>>(true);
    td::detail::set_checkpoint_save_hook([armed, point](std::string_view reached) {
      if (reached == point && armed->exchange(false))
        throw td::Error("injected failure at " + point);
    });
  };

  SECTION("raised at wait()") {
    fail_once_at("temp_synced");
    run.global_step = 2;
    REQUIRE(manager.save() == dir.file("ckpt-2.h5"));  // the snapshot succeeded
    REQUIRE_THROWS_WITH(manager.wait(), Catch::Contains("injected failure at temp_synced"));
    manager.wait();  // raised once
  }
  SECTION("raised at the next save(), which then writes nothing") {
    fail_once_at("model_weights");
    run.global_step = 2;
    REQUIRE(manager.save().has_value());
    run.global_step = 3;
    REQUIRE_THROWS_WITH(manager.save(), Catch::Contains("injected failure at model_weights"));
    manager.wait();
    CHECK_FALSE(fs::exists(dir.file("ckpt-3.h5")));
  }
  td::detail::set_checkpoint_save_hook({});
  CHECK_FALSE(fs::exists(dir.file("ckpt-2.h5")));
  CHECK_FALSE(has_temp_files(dir.str()));
  CHECK(manager.latest_checkpoint() == dir.file("ckpt-1.h5"));
  // The manager works on.
  run.global_step = 4;
  REQUIRE(manager.save() == dir.file("ckpt-4.h5"));
  manager.wait();
  CHECK(manager.latest_checkpoint() == dir.file("ckpt-4.h5"));
}

TEST_CASE("asynchronous save: SIGKILL at random moments of background writes, 30 times",
          "[cpu][checkpoint]") {
  TempDir dir;
  {
    Run run;
    td::CheckpointManager manager(run.checkpoint(), dir.str(), {.max_to_keep = 3});
    fill_model(run.model, 1.0f);
    REQUIRE(manager.save() == dir.file("ckpt-1.h5"));
  }
  // Each kill lands after 0 or 1 of the child's saves has committed (the state file names it; the
  // parent waits for that rather than for a time, which a busy or sanitized machine stretches),
  // then up to 250 ms later: before the first commit, or inside or between the writes after it.
  std::mt19937 random(11);
  int64_t newest = 1;
  for (int run_index = 0; run_index < 30; ++run_index) {
    INFO("run " << run_index);
    const std::string marker = dir.file("ready");
    fs::remove(marker);
    const std::string log = dir.str() + "/../async-child.log";
    const pid_t pid = spawn_child(kChildTest,
                                  {{"TANDEM_CKPT_TEST_DIR", dir.str()},
                                   {"TANDEM_CKPT_TEST_MARKER", marker},
                                   {"TANDEM_LOG_LEVEL", "warning"}},
                                  log);
    REQUIRE(wait_for_file(marker, pid, std::chrono::seconds(120)));
    const auto commits = static_cast<int64_t>(random() % 2);
    INFO("killed after " << commits << " commits");
    REQUIRE(wait_for_commit(dir.str(), newest + commits, pid, std::chrono::seconds(120)));
    std::this_thread::sleep_for(std::chrono::milliseconds(random() % 250));
    const int64_t committed = committed_step(dir.str());
    ::kill(pid, SIGKILL);
    const int status = wait_child(pid);
    INFO("child output:\n" << read_text(log));
    REQUIRE(WIFSIGNALED(status));
    // Every checkpoint file in the directory is whole; the newest restores, with the weights of
    // its own step (the snapshot of that step, whatever the child did after).
    for (const std::string& name : list_dir(dir.str())) {
      if (!name.starts_with("ckpt-") || td::detail::is_temp_name(name)) continue;
      INFO(name);
      CHECK(td::verify_checkpoint(dir.file(name)).empty());
    }
    Run run;
    td::CheckpointManager manager(run.checkpoint(), dir.str(), {.max_to_keep = 3});
    CHECK_FALSE(has_temp_files(dir.str()));
    const std::optional<std::string> restored = manager.restore_or_initialize();
    REQUIRE(restored == dir.file("ckpt-" + std::to_string(run.global_step) + ".h5"));
    CHECK(run.global_step >= committed);  // never older than a checkpoint once committed
    newest = run.global_step;
    CHECK(all_weights_are(run, static_cast<float>(run.global_step)));
  }
  CHECK(newest > 1);
}

TEST_CASE("asynchronous save: a child that saves until it is killed", "[.child]") {
  const std::string dir = env_or_empty("TANDEM_CKPT_TEST_DIR");
  const std::string marker = env_or_empty("TANDEM_CKPT_TEST_MARKER");
  if (dir.empty() || marker.empty()) return;  // only run by the test above
  Run run;
  td::CheckpointManager manager(run.checkpoint(), dir, {.max_to_keep = 3, .async_save = true});
  REQUIRE(manager.restore_or_initialize().has_value());
  write_text(marker, "ready");
  // Saves until killed, or until the test that started it is gone (a test killed by a timeout
  // must not leave this loop running): then it is someone else's child.
  const pid_t parent = ::getppid();
  for (int64_t step = run.global_step + 1; ::getppid() == parent; ++step) {
    fill_model(run.model, static_cast<float>(step));
    run.global_step = step;
    manager.save();                // waits for the previous write, then returns after the snapshot
    fill_model(run.model, -1.0f);  // what the file must not hold
  }
}
