// PreemptionCheckpointHandler in one process: nothing happens until a stop is requested; a
// SIGTERM (sent to the process) or a request makes the next save_checkpoint_if_preempted save
// the current step, even within checkpoint_interval, and report it; with exit_process the
// process exits with kPreemptedExitStatus; one handler at a time, the previous signal handlers
// back after it. Several workers: tests/tools/test_tandem_run.cpp.
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
  // The handler is gone: SIGTERM has its previous action again.
  struct sigaction now {};
  sigaction(SIGTERM, nullptr, &now);
  CHECK(now.sa_handler == before.sa_handler);
  // A new handler starts unsignalled.
  td::PreemptionCheckpointHandler again(strategy, manager, {.exit_process = false});
  CHECK_FALSE(again.signalled());
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
