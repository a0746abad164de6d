// tandem-run on several machines (--rdzv, --nodes, --node-rank): workers numbered across the
// machines, a failure on one stopping and restarting all, a duplicate --node-rank refused, the
// job going on with --nodes 1:2 without a machine that does not come back, too few machines
// within --join-timeout; and with the MLP sample on two "machines" (network
// namespaces joined by a veth pair), one killed mid-epoch and restarted rejoins, and the job
// ends with the weights of an uninterrupted run.
#include <signal.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "tandem/tandem.h"
#include "tools/launcher_test_util.h"

using namespace tandem::launcher_testing;  // NOLINT: the tests' own helpers

TEST_CASE("two machines with --rdzv: a machine killed and restarted rejoins, the same weights",
          "[cpu][tools][launcher][slow]") {
  if (!have_fashion_mnist()) {
    WARN("Fashion-MNIST is not installed; skipped");
    return;
  }
  TwoHosts hosts;
  if (!hosts.ready) {
    WARN("cannot make network namespaces here (needs root and iproute2); skipped");
    return;
  }
  TempDir dir, whole;
  auto machine = [&](const std::string& ns, int rank) {
    return std::vector<std::string>{"/usr/bin/ip",
                                    "netns",
                                    "exec",
                                    ns,
                                    "/usr/bin/env",
                                    "TANDEM_WORKER_TRANSPORT=tcp",
                                    kTandemRun,
                                    "--workers",
                                    "1",
                                    "--rdzv",
                                    "10.231.0.1:29400",
                                    "--nodes",
                                    "2",
                                    "--node-rank",
                                    std::to_string(rank),
                                    "--",
                                    kMlp,
                                    "--epochs",
                                    "2",
                                    "--checkpoint-dir",
                                    dir.path};
  };
  pid_t second = spawn(machine(hosts.b, 1), dir.file("machine1.log"));
  pid_t restarted = 0;
  const Run r = run(machine(hosts.a, 0), [&](const std::string& line, pid_t) {
    // Mid-epoch 2: machine 1 goes away with everything on it, and comes back a second later.
    if (!restarted && line.find("[worker 0] epoch 2/2  step 200/") != std::string::npos) {
      TwoHosts::kill_all(hosts.b);
      std::this_thread::sleep_for(std::chrono::seconds(1));
      restarted = spawn(machine(hosts.b, 1), dir.file("machine1-again.log"));
    }
  });
  INFO(r.text());
  const int first_status = exit_status(second);
  const int again_status = exit_status(restarted);
  INFO("machine 1, first:\n" << file_text(dir.file("machine1.log")));
  INFO("machine 1, restarted:\n" << file_text(dir.file("machine1-again.log")));
  REQUIRE(restarted > 0);
  CHECK(first_status == 128 + SIGKILL);
  CHECK(r.status == 0);
  CHECK(again_status == 0);
  CHECK(r.has("[worker 0] fashion_mnist_mlp: 2 replicas"));
  CHECK(r.has("tandem-run: rendezvous: machine 1 (10.231.0.2) lost; restart 1 of 3"));
  CHECK(r.has("[worker 0] resumed from "));
  const std::string summary =
      "tandem-run: finished: the job ended on 2 workers on 2 machines; 1 of 3 restarts used "
      "(last failure: machine 1 (10.231.0.2) lost), 0 preemptions, 0 machines lost";
  CHECK(r.lines.back() == summary);
  CHECK(file_text(dir.file("machine1-again.log")).ends_with(summary + "\n"));
  CHECK(examples_per_epoch(r) == std::vector<long>{60000, 60000});

  // The same 2 workers on one machine without a stop: bitwise the same weights.
  const Run u = run({"/usr/bin/env", "TANDEM_WORKER_TRANSPORT=tcp", kTandemRun, "--workers", "2",
                     "--", kMlp, "--epochs", "2", "--checkpoint-dir", whole.path});
  REQUIRE(u.status == 0);
  const std::string last = "/ckpt-938.h5";  // 2 epochs x 469 steps of 128
  REQUIRE(newest_checkpoint(dir.path) == dir.path + last);
  REQUIRE(newest_checkpoint(whole.path) == whole.path + last);
  CHECK(mlp_weights(dir.path + last) == mlp_weights(whole.path + last));
}

TEST_CASE("tandem-run on several machines: one numbering, a failure anywhere restarts all",
          "[cpu][tools][launcher]") {
  TempDir dir;
  const std::string port = std::to_string(29500 + getpid() % 400);
  auto machine = [&](int rank, const std::string& nodes, std::vector<std::string> extra,
                     const std::string& script) {
    std::vector<std::string> args = {kTandemRun, "--workers",         rank == 0 ? "1" : "2",
                                     "--rdzv",   "127.0.0.1:" + port, "--nodes",
                                     nodes,      "--node-rank",       std::to_string(rank)};
    args.insert(args.end(), extra.begin(), extra.end());
    for (const char* part : {"--", "/bin/sh", "-c"}) args.emplace_back(part);
    args.push_back(script);
    return args;
  };
  SECTION("workers numbered across machines; machine 1's failure stops machine 0's worker") {
    // Machine 1's second worker fails in the first round; machine 0's would sleep for 60 s.
    const std::string script =
        "echo \"slot $TANDEM_RUN_WORKER $TF_CONFIG\"; "
        "if [ $TANDEM_RUN_WORKER = 2 ] && [ $TANDEM_RUN_ATTEMPT = 0 ]; then exit 5; fi; "
        "[ $TANDEM_RUN_ATTEMPT = 0 ] && exec sleep 60; echo done";
    const pid_t second = spawn(machine(1, "2", {}, script), dir.file("machine1.log"));
    const Run r = run(machine(0, "2", {}, script));
    INFO(r.text());
    // Machine 1 prints the job's last line after machine 0 has: read its log once it ended.
    CHECK(exit_status(second) == 0);
    const std::string other = file_text(dir.file("machine1.log"));
    INFO("machine 1:\n" << other);
    CHECK(r.status == 0);
    CHECK(r.has("[worker 0] slot 0 {\"cluster\": {\"worker\": [\"127.0.0.1:"));
    CHECK(other.find("[worker 2] slot 2 {\"cluster\"") != std::string::npos);
    CHECK(other.find("\"task\": {\"type\": \"worker\", \"index\": 2}}") != std::string::npos);
    CHECK(
        r.has("tandem-run: worker 2 on machine 1 (127.0.0.1) (exit status 5); stopping the "
              "workers here"));
    CHECK(r.has("[worker 0] done"));
    const std::string summary =
        "tandem-run: finished: the job ended on 3 workers on 2 machines; 1 of 3 restarts used "
        "(last failure: worker 2 on machine 1 (127.0.0.1) (exit status 5)), 0 preemptions, 0 "
        "machines lost";
    CHECK(r.lines.back() == summary);
    CHECK(other.ends_with(summary + "\n"));
  }
  SECTION("a second machine with the same --node-rank is refused") {
    const pid_t first = spawn(machine(1, "2", {}, "sleep 5"), dir.file("machine1.log"));
    const pid_t rendezvous =
        spawn(machine(0, "2", {"--join-timeout", "20"}, "sleep 5"), dir.file("machine0.log"));
    // Once the round has started (both in it), a second machine 1 comes.
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (file_text(dir.file("machine1.log")).find("attempt 1: machine 1") == std::string::npos &&
           std::chrono::steady_clock::now() < give_up)
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    const Run r = run(machine(1, "2", {}, "true"));
    INFO(r.text());
    CHECK(r.status == 1);
    CHECK(
        r.has("tandem-run: the rendezvous refused this machine: --node-rank 1 is already in "
              "the job (machine 1 (127.0.0.1))"));
    CHECK(exit_status(first) == 0);
    CHECK(exit_status(rendezvous) == 0);
  }
  SECTION("with --nodes 1:2 the job goes on without a machine that does not come back") {
    const pid_t second = spawn(machine(1, "1:2", {}, "exec sleep 60"), dir.file("machine1.log"));
    bool killed = false;
    const Run r =
        run(machine(0, "1:2", {}, "[ $TANDEM_RUN_ATTEMPT = 0 ] && exec sleep 60; echo done"),
            [&](const std::string& line, pid_t) {
              // Machine 1 goes away (its worker ends with its tandem-run).
              if (!killed && line.find("tandem-run: attempt 1: machine 0") == 0) {
                kill(second, SIGKILL);
                killed = true;
              }
            });
    INFO(r.text());
    REQUIRE(killed);
    CHECK(exit_status(second) == 128 + SIGKILL);
    CHECK(r.status == 0);
    CHECK(r.has("tandem-run: attempt 2: machine 0 (127.0.0.1) started 1 of 1 workers"));
    CHECK(r.has("[worker 0] done"));
    CHECK(r.lines.back() ==
          "tandem-run: finished: the job ended on 1 worker on 1 machine; 1 of 3 restarts used "
          "(last failure: machine 1 (127.0.0.1) lost), 0 preemptions, 1 machine lost (1)");
  }
  SECTION("fewer machines than --nodes' minimum within --join-timeout: the job fails") {
    const Run r = run(machine(0, "2:3", {"--join-timeout", "1"}, "true"));
    INFO(r.text());
    CHECK(r.status == 1);
    CHECK(r.lines.back().starts_with(
        "tandem-run: failed: 1 machine of at least 2 joined within 1 s (--join-timeout)"));
  }
}
