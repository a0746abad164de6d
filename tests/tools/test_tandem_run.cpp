// tandem-run: each worker's TF_CONFIG and prefixed output; restarts after a failure, up to
// --max-restarts, with the failing worker's exit status at the end; a worker that keeps
// failing to start is left out above --min-workers and named otherwise; and with the MLP
// sample: SIGTERM to a worker mid-epoch saves, exits "preempted" and restarts, the final
// weights bitwise those of an uninterrupted run and every epoch counting 60000 examples;
// SIGTERM again and again (a storm) to a worker is still one preemption, and to tandem-run
// passes one SIGTERM to each worker, never a SIGKILL before --grace: the job stops saved (75)
// and a second tandem-run resumes it; kill -9
// of workers at random moments still finishes the job with the uninterrupted run's weights.
// Several machines: test_tandem_run_nodes.cpp.
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "tandem/tandem.h"
#include "tools/launcher_test_util.h"

using namespace tandem::launcher_testing;  // NOLINT: the tests' own helpers

TEST_CASE("tandem-run gives each worker its TF_CONFIG and prefixes its lines",
          "[cpu][tools][launcher]") {
  const Run r = run(with_script({"--workers", "3"},
                                "echo \"slot $TANDEM_RUN_WORKER $TF_CONFIG\"; echo to-stderr >&2; "
                                "printf unterminated"));
  INFO(r.text());
  REQUIRE(r.status == 0);
  for (int i = 0; i < 3; ++i) {
    const std::string prefix = "[worker " + std::to_string(i) + "] ";
    CHECK(
        r.has(prefix + "slot " + std::to_string(i) + " {\"cluster\": {\"worker\": [\"127.0.0.1:"));
    CHECK(r.has("\"task\": {\"type\": \"worker\", \"index\": " + std::to_string(i) + "}}"));
    CHECK(r.has(prefix + "to-stderr"));
    CHECK(r.has(prefix + "unterminated"));
  }
  CHECK(
      r.lines.back().starts_with("tandem-run: finished: the job ended on 3 workers; 0 of 3 "
                                 "restarts used"));
}

TEST_CASE("tandem-run restarts every worker after a failure, up to --max-restarts",
          "[cpu][tools][launcher]") {
  SECTION("worker 1 fails in the first two attempts, then the job finishes") {
    const Run r = run(with_script({"--workers", "2", "--start-window", "0"},
                                  "if [ $TANDEM_RUN_WORKER = 1 ] && [ $TANDEM_RUN_ATTEMPT -lt 2 ]; "
                                  "then exit 4; fi; sleep 0.2; echo done"));
    INFO(r.text());
    REQUIRE(r.status == 0);
    CHECK(r.has("tandem-run: worker 1 (pid "));
    CHECK(r.has("failed after"));
    CHECK(r.has("restart 2 of 3"));
    CHECK(r.has("[worker 0] done"));
    CHECK(r.lines.back().find("2 of 3 restarts used (last failure: worker 1, exit status 4)") !=
          std::string::npos);
  }
  SECTION("a worker killed by a signal every time: the restarts run out") {
    const Run r = run(with_script({"--workers", "2", "--max-restarts", "1", "--start-window", "0"},
                                  "if [ $TANDEM_RUN_WORKER = 0 ]; then kill -9 $$; fi; sleep 30"));
    INFO(r.text());
    CHECK(r.status == 128 + SIGKILL);
    CHECK(
        r.lines.back().starts_with("tandem-run: failed: worker 0 failed (killed by signal 9 "
                                   "(SIGKILL)) and no restarts are left (--max-restarts 1)"));
  }
  SECTION("bad arguments") {
    CHECK(run({kTandemRun, "--workers", "2"}).status == 2);
    CHECK(run({kTandemRun, "--workers", "0", "--", "true"}).status == 2);
    const Run r = run({kTandemRun, "--workers", "2", "--min-workers", "3", "--", "true"});
    CHECK(r.status == 2);
    CHECK(r.has("--min-workers 3 is more than --workers 2"));
    CHECK(run({kTandemRun, "--workers", "1", "--rdzv", "127.0.0.1:29400", "--", "true"})
              .has("needs --rdzv, --nodes and --node-rank together"));
    CHECK(run({kTandemRun, "--workers", "1", "--rdzv", "127.0.0.1:29400", "--nodes", "2",
               "--node-rank", "2", "--", "true"})
              .has("--node-rank 2 is not below --nodes' maximum 2"));
    CHECK(run({kTandemRun, "--workers", "1", "--rdzv", "127.0.0.1", "--", "true"})
              .has("--rdzv needs HOST:PORT, got \"127.0.0.1\""));
    CHECK(run({kTandemRun, "--workers", "1", "--nodes", "3:2", "--", "true"})
              .has("--nodes needs A:B with 1 <= A <= B, got \"3:2\""));
  }
}

TEST_CASE("tandem-run leaves out a worker that keeps failing to start, down to --min-workers",
          "[cpu][tools][launcher]") {
  if (!have_fashion_mnist()) {
    WARN("Fashion-MNIST is not installed; skipped");
    return;
  }
  TempDir dir;
  // Worker 2 exits at once every time; the others train the MLP sample a few steps.
  const std::string script = "[ $TANDEM_RUN_WORKER = 2 ] && exit 3; exec " + kMlp +
                             " --epochs 1 --max-steps 20 --checkpoint-dir " + dir.path;
  SECTION("with --min-workers 2 the job finishes on 2 workers") {
    const Run r = run(with_script({"--workers", "3", "--min-workers", "2"}, script));
    INFO(r.text());
    REQUIRE(r.status == 0);
    CHECK(
        r.has("tandem-run: worker 2 failed to start 2 times in a row; leaving it out, 2 "
              "workers remain (--min-workers 2)"));
    CHECK(r.has("[worker 0] fashion_mnist_mlp: 2 replicas"));
    CHECK(r.lines.back().starts_with("tandem-run: finished: the job ended on 2 workers"));
    CHECK(r.lines.back().find("1 worker lost (2)") != std::string::npos);
  }
  SECTION("without it tandem-run stops, naming the worker") {
    const Run r = run(with_script({"--workers", "3"}, script));
    INFO(r.text());
    CHECK(r.status == 3);
    CHECK(r.lines.back().starts_with(
        "tandem-run: failed: worker 2 failed to start 2 times in a row (exit status 3); leaving "
        "it out would leave 2 workers, fewer than --min-workers 3"));
  }
}

TEST_CASE("a SIGTERM storm to tandem-run while the workers save: one SIGTERM each, exit 75",
          "[cpu][tools][launcher]") {
  // Each worker stands for a program with a PreemptionCheckpointHandler: on SIGTERM it notes
  // the signal, "saves" for a second (a save may take that long; more SIGTERMs may come
  // meanwhile, from a scheduler that signals again and again) and exits 75.
  TempDir dir;
  auto script = [&](const std::string& save) {
    const std::string w = dir.path + "/$TANDEM_RUN_WORKER";
    return "trap 'echo term >> " + w +
           ".terms; stop=1' TERM; echo ready; while [ -z \"$stop\" ]; " + "do sleep 0.05; done; " +
           save + "; echo saved > " + w + ".saved; exit 75";
  };
  // 20 SIGTERMs to tandem-run, 20 ms apart, once every worker runs.
  auto storm = [](int* ready, std::chrono::steady_clock::time_point* first) {
    return [ready, first](const std::string& line, pid_t launcher) {
      if (line.find("] ready") == std::string::npos || ++*ready != 2) return;
      *first = std::chrono::steady_clock::now();
      for (int i = 0; i < 20; ++i) {
        kill(launcher, SIGTERM);
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    };
  };
  SECTION("the workers save within --grace: every one saved, nothing killed") {
    int ready = 0;
    std::chrono::steady_clock::time_point first{};
    const Run r = run(with_script({"--workers", "2", "--grace", "30"}, script("sleep 1")),
                      storm(&ready, &first));
    INFO(r.text());
    REQUIRE(ready == 2);
    CHECK(r.status == td::kPreemptedExitStatus);
    CHECK(r.has("tandem-run: SIGTERM: asking every worker to save and stop"));
    CHECK(r.has("tandem-run: SIGTERM again: the workers are already saving and stopping"));
    CHECK_FALSE(r.has("killing"));
    CHECK(r.lines.back() ==
          "tandem-run: stopped: asked to stop; every worker saved and stopped; 0 of 3 restarts "
          "used (last failure: none), 0 preemptions, 0 workers lost");
    for (const std::string worker : {"0", "1"}) {
      INFO("worker " << worker);
      CHECK(file_text(dir.file(worker + ".saved")) == "saved\n");
      CHECK(file_text(dir.file(worker + ".terms")) == "term\n");  // one SIGTERM, passed on once
    }
  }
  SECTION("a worker still saving at the --grace deadline is killed then, not before") {
    int ready = 0;
    std::chrono::steady_clock::time_point first{};
    const Run r = run(with_script({"--workers", "2", "--grace", "1"},
                                  script("[ $TANDEM_RUN_WORKER = 1 ] && sleep 30")),
                      storm(&ready, &first));
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - first).count();
    INFO(r.text());
    REQUIRE(ready == 2);
    CHECK(seconds >= 1.0);
    CHECK(seconds < 20.0);
    CHECK(r.status == 1);
    CHECK(r.has("tandem-run: worker 1 did not stop within 1 s of SIGTERM; killing it"));
    CHECK(r.lines.back().starts_with("tandem-run: stopped: asked to stop; not every worker saved"));
    CHECK(file_text(dir.file("0.saved")) == "saved\n");
    CHECK_FALSE(fs::exists(dir.file("1.saved")));
  }
}

TEST_CASE("a killed worker is named by every survivor within 5 s, over shared memory and Gloo",
          "[cpu][tools][launcher]") {
  if (!have_fashion_mnist()) {
    WARN("Fashion-MNIST is not installed; skipped");
    return;
  }
  for (const std::string transport : {"shm", "tcp"}) {
    INFO("TANDEM_WORKER_TRANSPORT=" << transport);
    TempDir dir;
    pid_t worker1 = 0;
    std::chrono::steady_clock::time_point killed{};
    std::vector<double> named_after;  // seconds from the kill to each survivor's message
    const Run r = run(
        {"/usr/bin/env", "TANDEM_WORKER_TRANSPORT=" + transport, kTandemRun, "--workers", "3",
         "--max-restarts", "0", "--grace", "30", "--", kMlp, "--epochs", "2", "--checkpoint-dir",
         dir.path},
        [&](const std::string& line, pid_t) {
          if (!worker1) worker1 = worker_pid(line, 1);
          if (worker1 && killed == std::chrono::steady_clock::time_point{} &&
              line.find("[worker 0] epoch 1/2  step 100/") != std::string::npos) {
            kill(worker1, SIGKILL);
            killed = std::chrono::steady_clock::now();
          }
          if (line.find("worker 1 (127.0.0.1:") != std::string::npos &&
              line.find("is gone") != std::string::npos)
            named_after.push_back(
                std::chrono::duration<double>(std::chrono::steady_clock::now() - killed).count());
        });
    INFO(r.text());
    REQUIRE(killed != std::chrono::steady_clock::time_point{});
    CHECK(r.status == 128 + SIGKILL);
    CHECK(r.has("[worker 0] fashion_mnist_mlp: "));
    CHECK(r.has("[worker 2] fashion_mnist_mlp: "));
    // Both survivors, each naming worker 1 and its address, well within 5 s.
    REQUIRE(named_after.size() == 2);
    for (const double seconds : named_after) CHECK(seconds < 5.0);
  }
}

TEST_CASE("SIGTERM to a worker mid-epoch: saved, preempted, restarted, the same final weights",
          "[cpu][tools][launcher][slow]") {
  if (!have_fashion_mnist()) {
    WARN("Fashion-MNIST is not installed; skipped");
    return;
  }
  TempDir stopped, whole;
  auto sample = [&](const std::string& checkpoints) {
    return std::vector<std::string>{
        kTandemRun, "--workers", "2", "--", kMlp, "--epochs", "3", "--checkpoint-dir", checkpoints};
  };
  pid_t worker1 = 0;
  bool sent = false;
  const Run r = run(sample(stopped.path), [&](const std::string& line, pid_t) {
    if (!worker1) worker1 = worker_pid(line, 1);
    // Mid-epoch 2 (progress lines come every 100 steps without a terminal).
    if (!sent && worker1 && line.find("[worker 0] epoch 2/3  step 100/") != std::string::npos) {
      kill(worker1, SIGTERM);
      sent = true;
    }
  });
  INFO(r.text());
  REQUIRE(sent);
  REQUIRE(r.status == 0);
  CHECK(r.has("[worker 0] preempted: saved "));
  CHECK(
      r.has("the workers saved and stopped (preempted); restarting them (not counted as a "
            "failure)"));
  CHECK(r.has("[worker 0] resumed from "));
  CHECK(r.lines.back().find("0 of 3 restarts used (last failure: none), 1 preemption") !=
        std::string::npos);
  // The stopped epoch counts its examples before and after the stop: each exactly once.
  CHECK(examples_per_epoch(r) == std::vector<long>{60000, 60000, 60000});

  const Run u = run(sample(whole.path));
  INFO(u.text());
  REQUIRE(u.status == 0);
  const std::string last = "/ckpt-1407.h5";  // 3 epochs x 469 steps of 128
  REQUIRE(newest_checkpoint(stopped.path) == stopped.path + last);
  REQUIRE(newest_checkpoint(whole.path) == whole.path + last);
  CHECK(mlp_weights(stopped.path + last) == mlp_weights(whole.path + last));
}

TEST_CASE("SIGTERM to a worker again and again: one preemption, restarted, not a failure",
          "[cpu][tools][launcher][slow]") {
  if (!have_fashion_mnist()) {
    WARN("Fashion-MNIST is not installed; skipped");
    return;
  }
  TempDir dir;
  pid_t worker1 = 0;
  std::atomic<bool> storming{false}, stop_storm{false};
  std::atomic<int> sent{0};
  std::thread storm;
  // From mid-epoch until tandem-run has seen worker 1 end: 20 SIGTERMs to it at once, then one
  // every 2 ms, through its save, its return from main and its exit.
  const Run r =
      run({kTandemRun, "--workers", "2", "--", kMlp, "--epochs", "1", "--checkpoint-dir", dir.path},
          [&](const std::string& line, pid_t) {
            if (!worker1) worker1 = worker_pid(line, 1);
            if (!storming && worker1 &&
                line.find("[worker 0] epoch 1/1  step 100/") != std::string::npos) {
              storming = true;
              storm = std::thread([&, pid = worker1] {
                while ((sent < 20 || !stop_storm) && sent < 20000) {
                  if (kill(pid, SIGTERM) != 0) break;
                  // 20 at once, then one every 2 ms.
                  if (++sent >= 20) std::this_thread::sleep_for(std::chrono::milliseconds(2));
                }
              });
            }
            if (line.find("tandem-run: the workers saved and stopped") == 0 ||
                line.find("failed after") != std::string::npos)
              stop_storm = true;
          });
  stop_storm = true;
  if (storm.joinable()) storm.join();
  INFO(r.text());
  INFO(sent << " SIGTERMs sent to worker 1");
  REQUIRE(storming);
  CHECK(sent >= 20);
  CHECK(r.status == 0);
  CHECK(r.has("[worker 0] preempted: saved "));
  CHECK_FALSE(r.has("failed after"));
  CHECK(r.lines.back().find("0 of 3 restarts used (last failure: none), 1 preemption,") !=
        std::string::npos);
  CHECK(examples_per_epoch(r) == std::vector<long>{60000});
}

TEST_CASE("a SIGTERM storm to tandem-run and its workers: every worker saves, exit 75, resumed",
          "[cpu][tools][launcher][slow]") {
  if (!have_fashion_mnist()) {
    WARN("Fashion-MNIST is not installed; skipped");
    return;
  }
  TempDir dir;
  const std::vector<std::string> command = {
      kTandemRun, "--workers", "2", "--", kMlp, "--epochs", "2", "--checkpoint-dir", dir.path};
  // As a scheduler that reclaims the machine may: SIGTERM to every process of the job, 20
  // times, 10 ms apart.
  std::vector<pid_t> workers(2, 0);
  bool sent = false;
  const Run r = run(command, [&](const std::string& line, pid_t launcher) {
    for (int slot = 0; slot < 2; ++slot)
      if (const pid_t pid = worker_pid(line, slot)) workers[static_cast<size_t>(slot)] = pid;
    if (!sent && line.find("[worker 0] epoch 1/2  step 200/") != std::string::npos) {
      sent = true;
      for (int i = 0; i < 20; ++i) {
        for (const pid_t pid : {launcher, workers[0], workers[1]})
          if (pid > 0) kill(pid, SIGTERM);
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
    }
  });
  INFO(r.text());
  REQUIRE(sent);
  CHECK(r.status == td::kPreemptedExitStatus);
  CHECK(r.has("tandem-run: SIGTERM: asking every worker to save and stop"));
  CHECK(r.has("[worker 0] preempted: saved "));
  CHECK_FALSE(r.has("killing"));
  CHECK(r.lines.back() ==
        "tandem-run: stopped: asked to stop; every worker saved and stopped; 0 of 3 restarts "
        "used (last failure: none), 0 preemptions, 0 workers lost");
  REQUIRE(!newest_checkpoint(dir.path).empty());
  CHECK(mlp_weights(newest_checkpoint(dir.path)).size() == 6);  // the saved step loads
  const Run again = run(command);
  INFO(again.text());
  CHECK(again.status == 0);
  CHECK(again.has("[worker 0] resumed from "));
  CHECK(examples_per_epoch(again) == std::vector<long>{60000, 60000});
}

TEST_CASE("kill -9 of workers at random moments: the job finishes as it would have",
          "[cpu][tools][launcher][slow]") {
  if (!have_fashion_mnist()) {
    WARN("Fashion-MNIST is not installed; skipped");
    return;
  }
  TempDir chaos, whole;
  auto sample = [&](const std::string& checkpoints) {
    return std::vector<std::string>{
        kTandemRun, "--workers", "3", "--max-restarts",   "10",       "--start-window", "0", "--",
        kMlp,       "--epochs",  "3", "--checkpoint-dir", checkpoints};
  };
  // A random worker of the current attempt is killed 1-2.5 s after the previous kill, three
  // times (an epoch of 3 workers on these machines takes about a second).
  std::mt19937 random(static_cast<unsigned>(std::random_device{}()));
  std::vector<pid_t> pids(3, 0);
  std::atomic<int> kills{0};
  std::atomic<bool> done{false};
  std::mutex mutex;
  std::thread killer([&] {
    while (!done && kills < 3) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1000 + random() % 1500));
      std::lock_guard<std::mutex> lock(mutex);
      const pid_t victim = pids[random() % 3];
      if (!done && victim > 0 && kill(victim, SIGKILL) == 0) ++kills;
    }
  });
  const Run r = run(sample(chaos.path), [&](const std::string& line, pid_t) {
    std::lock_guard<std::mutex> lock(mutex);
    for (int slot = 0; slot < 3; ++slot)
      if (const pid_t pid = worker_pid(line, slot)) pids[static_cast<size_t>(slot)] = pid;
  });
  done = true;
  killer.join();
  INFO(r.text());
  REQUIRE(r.status == 0);
  INFO(kills << " workers killed");
  CHECK(kills > 0);
  // Every epoch trained on each example once (an epoch cut short restarts from its start).
  const std::vector<long> examples = examples_per_epoch(r);
  REQUIRE(!examples.empty());
  for (const long e : examples) CHECK(e == 60000);
  const Run u = run(sample(whole.path));
  REQUIRE(u.status == 0);
  const std::string last = "/ckpt-939.h5";  // 3 epochs x 313 steps of 192 (the last of 96)
  REQUIRE(newest_checkpoint(chaos.path) == chaos.path + last);
  REQUIRE(newest_checkpoint(whole.path) == whole.path + last);
  CHECK(mlp_weights(chaos.path + last) == mlp_weights(whole.path + last));
}
