// tandem-run: each worker's TF_CONFIG and prefixed output; restarts after a failure, up to
// --max-restarts, with the failing worker's exit status at the end; a worker that keeps
// failing to start is left out above --min-workers and named otherwise; and with the MLP
// sample: SIGTERM to a worker mid-epoch saves, exits "preempted" and restarts, the final
// weights bitwise those of an uninterrupted run and every epoch counting 60000 examples;
// SIGTERM to tandem-run stops the job saved (75) and a second tandem-run resumes it; kill -9
// of workers at random moments still finishes the job with the uninterrupted run's weights.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <mutex>
#include <random>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "tandem/tandem.h"

namespace td = tandem;
namespace fs = std::filesystem;

namespace {

const std::string kTandemRun = TANDEM_RUN_TOOL;
const std::string kMlp =
    std::string(TANDEM_BINARY_DIR) + "/samples/fashion_mnist_mlp/fashion_mnist_mlp";

struct TempDir {
  TempDir() {
    std::string pattern = (fs::temp_directory_path() / "tandem_run_XXXXXX").string();
    path = mkdtemp(pattern.data());
  }
  ~TempDir() {
    std::error_code ignored;
    fs::remove_all(path, ignored);
  }
  std::string file(const std::string& name) const { return path + "/" + name; }
  std::string path;
};

struct Run {
  int status = -1;  // exit status, or 128 + signal
  std::vector<std::string> lines;
  std::string text() const {
    std::string out;
    for (const std::string& l : lines) out += l + "\n";
    return out;
  }
  bool has(const std::string& fragment) const { return text().find(fragment) != std::string::npos; }
};

/// Runs `args` (stdout and stderr together) and calls on_line(line, pid) for each line as it
/// comes; returns the exit status and the lines.
Run run(const std::vector<std::string>& args,
        const std::function<void(const std::string&, pid_t)>& on_line = {}) {
  int pipe_fds[2];
  REQUIRE(pipe(pipe_fds) == 0);
  const pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    dup2(pipe_fds[1], STDOUT_FILENO);
    dup2(pipe_fds[1], STDERR_FILENO);
    close(pipe_fds[0]);
    close(pipe_fds[1]);
    std::vector<char*> argv;
    for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    _exit(127);
  }
  close(pipe_fds[1]);
  Run result;
  FILE* in = fdopen(pipe_fds[0], "r");
  char buffer[8192];
  while (std::fgets(buffer, sizeof(buffer), in)) {
    std::string line(buffer);
    if (!line.empty() && line.back() == '\n') line.pop_back();
    result.lines.push_back(line);
    if (on_line) on_line(line, pid);
  }
  std::fclose(in);
  int status = 0;
  waitpid(pid, &status, 0);
  result.status = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return result;
}

/// tandem-run's command line for `options` and a shell script as the program.
std::vector<std::string> with_script(std::vector<std::string> options, const std::string& script) {
  options.insert(options.begin(), kTandemRun);
  for (const char* part : {"--", "/bin/sh", "-c"}) options.emplace_back(part);
  options.push_back(script);
  return options;
}

/// The digits at the start of `text` as a number; -1 when it does not start with one. (No
/// std::regex here: GCC 12 warns inside its std::function under the sanitizer build.)
long leading_number(std::string_view text) {
  size_t digits = 0;
  while (digits < text.size() && std::isdigit(static_cast<unsigned char>(text[digits]))) ++digits;
  return digits == 0 ? -1 : std::stol(std::string(text.substr(0, digits)));
}

/// The pid tandem-run reports for worker `slot` in an "attempt N: started" line; 0 if none.
pid_t worker_pid(const std::string& line, int slot) {
  const std::string key = "worker " + std::to_string(slot) + " pid ";
  const size_t at = line.find(key);
  if (at == std::string::npos) return 0;
  const long pid = leading_number(std::string_view(line).substr(at + key.size()));
  return pid > 0 ? static_cast<pid_t>(pid) : 0;
}

/// The model weights of a checkpoint, as the sample's MLP.
std::vector<std::vector<float>> mlp_weights(const std::string& checkpoint) {
  td::nn::Sequential model({td::nn::Flatten(), td::nn::Dense(256, td::nn::Activation::kRelu),
                            td::nn::Dense(128, td::nn::Activation::kRelu), td::nn::Dense(10)});
  model.build({28, 28});
  td::load_weights(model, checkpoint);
  std::vector<std::vector<float>> out;
  for (const td::Variable& v : model.weights()) out.push_back(v.value().to_vector<float>());
  return out;
}

/// The examples each epoch summary of worker 0 reports ("[worker 0] epoch 2/3: ... 60000
/// examples"), in order.
std::vector<long> examples_per_epoch(const Run& r) {
  std::vector<long> out;
  for (const std::string& line : r.lines) {
    if (!line.starts_with("[worker 0] epoch ") || !line.ends_with(" examples")) continue;
    const size_t colon = line.find(": ");
    if (colon == std::string::npos || line.find("/") > colon) continue;
    const std::string_view head(line.data(), line.size() - std::string_view(" examples").size());
    const size_t space = head.rfind(' ');
    if (space != std::string_view::npos) out.push_back(leading_number(head.substr(space + 1)));
  }
  return out;
}

/// The newest ckpt-N.h5 of a directory ("" when none).
std::string newest_checkpoint(const std::string& dir) {
  std::string best;
  long best_step = -1;
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (!name.starts_with("ckpt-") || !name.ends_with(".h5")) continue;
    const std::string_view middle = std::string_view(name).substr(5, name.size() - 8);
    const long step = leading_number(middle);
    if (step >= 0 && std::to_string(step) == middle && step > best_step) {
      best_step = step;
      best = entry.path().string();
    }
  }
  return best;
}

bool have_fashion_mnist() {
  return fs::exists(std::string(td::data::kFashionMnistDirectory) + "/train-images-idx3-ubyte.gz");
}

}  // namespace

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

TEST_CASE("SIGTERM to tandem-run: every worker saves and stops, and the next tandem-run resumes",
          "[cpu][tools][launcher][slow]") {
  if (!have_fashion_mnist()) {
    WARN("Fashion-MNIST is not installed; skipped");
    return;
  }
  TempDir dir;
  const std::vector<std::string> command = {
      kTandemRun, "--workers", "2", "--", kMlp, "--epochs", "2", "--checkpoint-dir", dir.path};
  bool sent = false;
  const Run r = run(command, [&](const std::string& line, pid_t launcher) {
    if (!sent && line.find("[worker 0] epoch 1/2  step 200/") != std::string::npos) {
      kill(launcher, SIGTERM);
      sent = true;
    }
  });
  INFO(r.text());
  REQUIRE(sent);
  CHECK(r.status == td::kPreemptedExitStatus);
  CHECK(r.has("tandem-run: SIGTERM: asking every worker to save and stop"));
  CHECK(r.lines.back().starts_with(
      "tandem-run: stopped: asked to stop; every worker saved and stopped"));
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
