// PreemptionCheckpointHandler in one process: nothing happens until a stop is requested; a
// SIGTERM (sent to the process) or a request makes the next save_checkpoint_if_preempted save
// the current step, even within checkpoint_interval, and report it; with exit_process the
// process exits with kPreemptedExitStatus; one handler at a time, the previous signal handlers
// back after it unless a stop was asked for (then SIGTERM stays harmless until the exit, so a
// storm of them through the save and the exit still ends with 75). Several workers:
// tests/tools/test_tandem_run.cpp.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "checkpoint_test_util.h"

namespace td = tandem;
using namespace tandem::checkpoint_testing;

namespace {

struct Small {
  Small() { model.build({4}); }
  td::Checkpoint checkpoint() {
    return td::Checkpoint({{"model", &model}, {"global_step", &global_step}});
  }
  td::nn::Sequential model{td::nn::Dense(3)};
  int64_t global_step = 0;
};

}  // namespace

TEST_CASE("preemption handler: a SIGTERM makes the next step boundary save and stop",
          "[cpu][checkpoint]") {
  TempDir dir;
  Small s;
  td::CheckpointManager manager(s.checkpoint(), dir.str(),
                                {.max_to_keep = 3, .checkpoint_interval = 100});
  td::MirroredStrategy strategy = td::MirroredStrategy::cpu(1);
  struct sigaction before {};
  sigaction(SIGTERM, nullptr, &before);
  {
    td::PreemptionCheckpointHandler preemption(strategy, manager, {.exit_process = false});
    REQUIRE_THROWS_WITH(td::PreemptionCheckpointHandler(strategy, manager),
                        Catch::Contains("another one is alive"));
    s.global_step = 7;
    REQUIRE(manager.save().has_value());  // ckpt-7
    s.global_step = 8;
    CHECK_FALSE(preemption.save_checkpoint_if_preempted());
    CHECK_FALSE(preemption.job_preempted());
    CHECK_FALSE(preemption.saved().has_value());
    // The signal only sets the flag, however often it comes (a scheduler and tandem-run may
    // both send one): the process goes on.
    REQUIRE(kill(getpid(), SIGTERM) == 0);
    REQUIRE(kill(getpid(), SIGTERM) == 0);
    CHECK(preemption.signalled());
    CHECK(preemption.job_preempted());
    // Saved although checkpoint_interval (100) steps have not passed since ckpt-7.
    CHECK(preemption.save_checkpoint_if_preempted());
    REQUIRE(preemption.saved() == dir.str() + "/ckpt-8.h5");
    CHECK(fs::exists(dir.str() + "/ckpt-8.h5"));
    CHECK(manager.latest_checkpoint() == dir.str() + "/ckpt-8.h5");
  }
  // The handler is gone, but a stop was asked for: the process is on its way out, and a
  // SIGTERM still coming only sets the flag (the default action would kill it).
  struct sigaction now {};
  sigaction(SIGTERM, nullptr, &now);
  CHECK(now.sa_handler != before.sa_handler);
  CHECK(now.sa_handler != SIG_DFL);
  {
    // A new handler starts unsignalled; without a stop its destructor puts back the actions
    // from before the first handler.
    td::PreemptionCheckpointHandler again(strategy, manager, {.exit_process = false});
    CHECK_FALSE(again.signalled());
  }
  sigaction(SIGTERM, nullptr, &now);
  CHECK(now.sa_handler == before.sa_handler);
}

TEST_CASE("preemption handler: a SIGTERM storm through the save and the exit still exits 75",
          "[cpu][checkpoint]") {
  // A scheduler may signal a process again and again: while it saves, and after the handler
  // is gone while the program returns kPreemptedExitStatus from main. None of those SIGTERMs
  // may kill it (that would be a failure, not a preemption).
  TempDir dir;
  int ready[2];
  REQUIRE(pipe(ready) == 0);
  const pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    close(ready[0]);
    Small s;
    td::CheckpointManager manager(s.checkpoint(), dir.str());
    td::MirroredStrategy strategy = td::MirroredStrategy::cpu(1);
    {
      td::PreemptionCheckpointHandler preemption(strategy, manager, {.exit_process = false});
      const char byte = 1;
      if (write(ready[1], &byte, 1) != 1) _exit(2);
      for (s.global_step = 1; !preemption.save_checkpoint_if_preempted(); ++s.global_step)
        usleep(1000);  // a training step
    }
    // The program's own teardown after the loop, 300 ms of it, the storm going on (each
    // signal cuts a sleep short).
    const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(300);
    while (std::chrono::steady_clock::now() < end) usleep(1000);
    _exit(td::kPreemptedExitStatus);
  }
  close(ready[1]);
  char byte = 0;
  REQUIRE(read(ready[0], &byte, 1) == 1);  // the handler is installed
  close(ready[0]);
  int status = 0, sent = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (waitpid(child, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      kill(child, SIGKILL);
      waitpid(child, &status, 0);
      FAIL("the child did not stop within 30 s of the first SIGTERM");
    }
    if (kill(child, SIGTERM) == 0) ++sent;
    usleep(1000);
  }
  INFO(sent << " SIGTERMs sent");
  CHECK(sent >= 20);
  REQUIRE_FALSE(WIFSIGNALED(status));
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == td::kPreemptedExitStatus);
  CHECK(td::latest_checkpoint(dir.str()).has_value());
}

TEST_CASE("preemption handler: by default the process saves and exits with status 75",
          "[cpu][checkpoint]") {
  TempDir dir;
  const pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    Small s;
    td::CheckpointManager manager(s.checkpoint(), dir.str());
    td::MirroredStrategy strategy = td::MirroredStrategy::cpu(1);
    td::PreemptionCheckpointHandler preemption(strategy, manager);
    s.global_step = 3;
    td::PreemptionCheckpointHandler::request_preemption();
    preemption.save_checkpoint_if_preempted();
    _exit(1);  // not reached
  }
  int status = 0;
  waitpid(child, &status, 0);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == td::kPreemptedExitStatus);
  CHECK(fs::exists(dir.str() + "/ckpt-3.h5"));
}
