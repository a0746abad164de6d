// The program that tests/mpi/stopped_worker.sh runs under mpirun: every worker trains a small
// model in a loop (its gradients large enough for the blocking MPI all-reduce, and a small
// all-reduce each step that rides on the arrival messages) and says its pid; the script stops
// one worker with SIGSTOP mid-training and requires the others to name it and end the job
// within TANDEM_COLLECTIVE_TIMEOUT + 5 s.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdlib>
#include <iostream>

#include "mpi/job.h"
#include "tandem/collectives/internal/process_watch.h"
#include "tandem/tandem.h"

namespace td = tandem;

// What the workers' watch tells from /proc: only a stopped process counts as stopped (one
// sleeping or busy, a worker in a slow exchange, is not), and only the process that started at
// the recorded time (not another that got its pid).
TEST_CASE("process watch: a stopped process is told from a sleeping and an ended one", "[mpi]") {
  namespace tc = tandem::collectives;
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    for (;;) ::pause();  // sleeping until killed
  }
  tc::ProcessIdentity who = tc::this_process();
  who.pid = static_cast<int32_t>(child);
  REQUIRE(tc::process_state(child, &who.start_time));
  CHECK_FALSE(tc::process_stopped(who));
  int status = 0;
  REQUIRE(::kill(child, SIGSTOP) == 0);
  REQUIRE(::waitpid(child, &status, WUNTRACED) == child);
  REQUIRE(WIFSTOPPED(status));
  CHECK(tc::process_stopped(who));
  tc::ProcessIdentity other = who;  // the same pid, started at another time
  other.start_time += 1;
  CHECK_FALSE(tc::process_stopped(other));
  REQUIRE(::kill(child, SIGCONT) == 0);
  REQUIRE(::waitpid(child, &status, WCONTINUED) == child);
  CHECK_FALSE(tc::process_stopped(who));
  REQUIRE(::kill(child, SIGKILL) == 0);
  REQUIRE(::waitpid(child, &status, 0) == child);
  CHECK_FALSE(tc::process_stopped(who));
  CHECK(tc::process_ended(who));
}

TEST_CASE("multi-worker fault: a worker stopped (SIGSTOP) mid-training", "[.stopfault]") {
  td::Strategy& s = tandem::testing::job_strategy();
  std::cout << "worker " << s.worker_index() << " pid " << ::getpid() << std::endl;
  td::nn::Sequential model({td::nn::Dense(256, td::nn::Activation::kRelu), td::nn::Dense(64)});
  std::unique_ptr<td::optim::SGD> optimizer;
  {
    auto scope = s.scope();
    model.build({64});
    optimizer = std::make_unique<td::optim::SGD>(td::optim::SGD::Options{.learning_rate = 0.01});
  }
  const std::vector<td::Variable> variables = model.trainable_variables();
  td::Generator g(7);
  const td::Tensor x = td::Tensor::normal({8, 64}, g);
  const auto start = std::chrono::steady_clock::now();
  try {
    // Until the script stops a worker; a job nobody stops ends after two minutes.
    for (int step = 1; std::chrono::steady_clock::now() - start < std::chrono::minutes(2); ++step) {
      s.run([&](td::ReplicaContext& ctx) {
        td::GradientTape tape;
        const td::Tensor loss = td::ops::mean(td::ops::square(model(x, true)));
        optimizer->apply_gradients(ctx, tape.gradient(loss, variables), variables);
        ctx.all_reduce(td::ReduceOp::kSum, loss);
      });
      if (step == 5 && s.is_chief()) std::cout << "training" << std::endl;
    }
  } catch (const std::exception& e) {
    std::cout << "worker " << s.worker_index() << " raised: " << e.what() << std::endl;
    std::_Exit(3);  // non-zero: mpirun ends the job
  }
  FAIL("training went on for two minutes: no worker was stopped");
}
