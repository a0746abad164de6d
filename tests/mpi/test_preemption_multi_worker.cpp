// Preemption across workers: a stop asked of the last worker only stops every worker at the same
// step, each saves once (the chief writes), and every worker, the ones never signalled included,
// keeps SIGTERM harmless on its way out: a scheduler's or tandem-run's SIGTERM reaching a
// worker after its handler is gone must not turn the preemption into a failure.
#include <signal.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <string>

#include "mpi/job.h"
#include "tandem/tandem.h"

namespace td = tandem;
namespace fs = std::filesystem;

TEST_CASE(
    "multi-worker: a stop asked of one worker stops every worker, and none dies of a "
    "later SIGTERM",
    "[mpi]") {
  td::Strategy& s = tandem::testing::job_strategy();
  const std::string dir = tandem::testing::shared_temp_dir(s, "preempt");
  td::nn::Sequential model;
  model.add(td::nn::Dense(3));
  {
    auto scope = s.scope();
    model.build({4});
  }
  int64_t step = 0;
  td::CheckpointManager manager(td::Checkpoint({{"model", &model}, {"global_step", &step}}), dir,
                                {.max_to_keep = 2, .strategy = &s});
  struct sigaction before {};
  sigaction(SIGTERM, nullptr, &before);
  const bool last = s.worker_index() == s.num_workers() - 1;
  {
    td::PreemptionCheckpointHandler preemption(s, manager, {.exit_process = false});
    step = 1;
    CHECK_FALSE(preemption.save_checkpoint_if_preempted());
    step = 2;
    if (last) preemption.request_preemption();
    CHECK(preemption.signalled() == last);
    CHECK(preemption.save_checkpoint_if_preempted());  // every worker, at the same step
    if (s.is_chief()) CHECK(preemption.saved() == dir + "/ckpt-2.h5");
  }
  // Every worker is on its way out: its SIGTERM handler only sets a flag.
  struct sigaction now {};
  sigaction(SIGTERM, nullptr, &now);
  CHECK(now.sa_handler != SIG_DFL);
  CHECK(now.sa_handler != before.sa_handler);
  if (now.sa_handler != SIG_DFL) REQUIRE(::raise(SIGTERM) == 0);  // survives
  {
    // A new handler puts back the actions from before the first one when it ends unstopped.
    td::PreemptionCheckpointHandler again(s, manager, {.exit_process = false});
    CHECK_FALSE(again.signalled());
  }
  sigaction(SIGTERM, nullptr, &now);
  CHECK(now.sa_handler == before.sa_handler);
  if (s.is_chief()) fs::remove_all(dir);
}
