// What the tandem-run tests share: running a command and reading its lines, the MLP sample's
// weights and epoch summaries, checkpoints, and two "machines" in network namespaces.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <mutex>
#include <random>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "tandem/tandem.h"

namespace tandem::launcher_testing {

namespace td = tandem;
namespace fs = std::filesystem;

inline const std::string kTandemRun = TANDEM_RUN_TOOL;
inline const std::string kMlp =
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
inline Run run(const std::vector<std::string>& args,
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
inline std::vector<std::string> with_script(std::vector<std::string> options,
                                            const std::string& script) {
  options.insert(options.begin(), kTandemRun);
  for (const char* part : {"--", "/bin/sh", "-c"}) options.emplace_back(part);
  options.push_back(script);
  return options;
}

/// The digits at the start of `text` as a number; -1 when it does not start with one. (No
/// std::regex here: GCC 12 warns inside its std::function under the sanitizer build.)
inline long leading_number(std::string_view text) {
  size_t digits = 0;
  while (digits < text.size() && std::isdigit(static_cast<unsigned char>(text[digits]))) ++digits;
  return digits == 0 ? -1 : std::stol(std::string(text.substr(0, digits)));
}

/// The pid tandem-run reports for worker `slot` in an "attempt N: started" line; 0 if none.
inline pid_t worker_pid(const std::string& line, int slot) {
  const std::string key = "worker " + std::to_string(slot) + " pid ";
  const size_t at = line.find(key);
  if (at == std::string::npos) return 0;
  const long pid = leading_number(std::string_view(line).substr(at + key.size()));
  return pid > 0 ? static_cast<pid_t>(pid) : 0;
}

/// The model weights of a checkpoint, as the sample's MLP.
inline std::vector<std::vector<float>> mlp_weights(const std::string& checkpoint) {
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
inline std::vector<long> examples_per_epoch(const Run& r) {
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
inline std::string newest_checkpoint(const std::string& dir) {
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

inline bool have_fashion_mnist() {
  return fs::exists(std::string(td::data::kFashionMnistDirectory) + "/train-images-idx3-ubyte.gz");
}

/// Two network namespaces joined by a veth pair, 10.231.0.1 and 10.231.0.2: two machines as
/// far as sockets go. Needs root and iproute2; `ready` says whether they could be made.
struct TwoHosts {
  TwoHosts() {
    const std::string id = std::to_string(getpid() % 100000);
    a = "tda" + id;
    b = "tdb" + id;
    ready = sh("ip netns add " + a + " && ip netns add " + b + " && ip link add v" + a +
               " type veth peer name v" + b + " && ip link set v" + a + " netns " + a +
               " && ip link set v" + b + " netns " + b + " && ip -n " + a +
               " addr add 10.231.0.1/24 dev v" + a + " && ip -n " + b +
               " addr add 10.231.0.2/24 dev v" + b + " && ip -n " + a + " link set v" + a +
               " up && ip -n " + b + " link set v" + b + " up && ip -n " + a +
               " link set lo up && ip -n " + b + " link set lo up");
  }
  ~TwoHosts() {
    kill_all(b);
    kill_all(a);
    sh("ip netns del " + a + "; ip netns del " + b);
  }
  static bool sh(const std::string& command) {
    return std::system((command + " >/dev/null 2>&1").c_str()) == 0;
  }
  /// SIGKILL to every process in namespace `name`: the machine is gone.
  static void kill_all(const std::string& name) {
    FILE* pids = popen(("ip netns pids " + name + " 2>/dev/null").c_str(), "r");
    if (!pids) return;
    long pid = 0;
    while (std::fscanf(pids, "%ld", &pid) == 1) kill(static_cast<pid_t>(pid), SIGKILL);
    pclose(pids);
  }
  std::string a, b;
  bool ready = false;
};

/// Starts `args` with its output into `log`; returns its pid.
inline pid_t spawn(const std::vector<std::string>& args, const std::string& log) {
  const pid_t pid = fork();
  if (pid == 0) {
    const int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fd, STDOUT_FILENO);
    dup2(fd, STDERR_FILENO);
    std::vector<char*> argv;
    for (const std::string& arg : args) argv.push_back(const_cast<char*>(arg.c_str()));
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    _exit(127);
  }
  return pid;
}

inline int exit_status(pid_t pid) {
  int status = 0;
  if (pid <= 0 || waitpid(pid, &status, 0) != pid) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

inline std::string file_text(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

}  // namespace tandem::launcher_testing
