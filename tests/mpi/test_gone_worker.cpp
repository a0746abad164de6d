// The program that tests/tools/test_worker_loss_mpi.cpp runs under mpirun with three workers:
// worker 1 dies right after it arrived in an all-reduce, while worker 2 waits there for
// worker 0, which is busy outside any exchange (as the chief is while it saves a checkpoint)
// for longer than mpirun gives a worker between its SIGTERM and its SIGKILL. Both survivors
// must name worker 1: worker 2 although worker 1 had arrived, worker 0 before it is killed.
#include <catch2/catch.hpp>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <iostream>
#include <thread>

#include "mpi/job.h"
#include "tandem/tandem.h"

namespace td = tandem;

TEST_CASE("multi-worker fault: a worker dies after arriving while another is busy",
          "[.gonefault]") {
  td::Strategy& s = tandem::testing::job_strategy();
  REQUIRE(s.num_workers() == 3);
  // As the samples do, a worker asked to stop by SIGTERM (mpirun ending the job) carries on
  // until it is killed.
  std::signal(SIGTERM, SIG_IGN);
  const auto reduce = [&] {
    s.run([&](td::ReplicaContext& ctx) {
      ctx.all_reduce(td::ReduceOp::kSum, td::Tensor::ones({4}));
    });
  };
  try {
    reduce();  // every worker connected
    switch (s.worker_index()) {
      case 0:
        std::cout << "worker 0 busy" << std::endl;
        std::this_thread::sleep_for(std::chrono::seconds(10));
        reduce();
        break;
      case 1: {
        std::thread arrive([&] {
          try {
            reduce();
          } catch (const std::exception&) {
          }
        });
        arrive.detach();
        std::this_thread::sleep_for(std::chrono::milliseconds(1500));  // its arrival is delivered
        std::cout << "worker 1 dies" << std::endl;
        std::raise(SIGKILL);
        break;
      }
      default:
        reduce();
    }
  } catch (const std::exception& e) {
    std::cout << "worker " << s.worker_index() << " raised: " << e.what() << std::endl;
    std::_Exit(3);  // non-zero: mpirun ends the job
  }
  FAIL("the all-reduce with a dead worker returned");
}
