// Helpers shared by the checkpoint tests: a small data-parallel training run whose whole state is
// checkpointed, temporary directories, file damage, stderr capture, and child processes made by
// re-executing this test binary (/proc/self/exe) on a hidden test case.
#pragma once

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "tandem/checkpoint/internal/file_io.h"
#include "tandem/io/internal/hdf5_file.h"
#include "tandem/tandem.h"

extern char** environ;

namespace tandem::checkpoint_testing {

namespace fs = std::filesystem;

/// A fresh directory under the system temp directory, removed with its contents at the end.
class TempDir {
 public:
  TempDir() {
    static std::atomic<int> counter{0};
    path_ = fs::temp_directory_path() /
            ("tandem_ckpt_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string str() const { return path_.string(); }
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  fs::path path_;
};

/// The file names in `dir`, sorted.
inline std::vector<std::string> list_dir(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(dir)) names.push_back(entry.path().filename());
  std::sort(names.begin(), names.end());
  return names;
}

inline bool has_temp_files(const std::string& dir) {
  for (const std::string& name : list_dir(dir))
    if (name.find(".tmp.") != std::string::npos) return true;
  return false;
}

inline std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

inline void write_text(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
}

/// Cuts `path` to half its size (a checkpoint whose write was interrupted by a full disk).
inline void truncate_to_half(const std::string& path) {
  fs::resize_file(path, fs::file_size(path) / 2);
}

/// Replaces `path` with `bytes` random bytes.
inline void fill_with_random_bytes(const std::string& path, size_t bytes, uint64_t seed) {
  Generator g(seed);
  std::string data(bytes, '\0');
  for (char& c : data) c = static_cast<char>(g.next_u32() & 0xff);
  write_text(path, data);
}

/// The TensorFlow CheckpointState text file of `dir`, parsed independently of the library:
/// (model_checkpoint_path, all_model_checkpoint_paths). Fails the test when a line is not in the
/// format.
inline std::pair<std::string, std::vector<std::string>> parse_state_file(const std::string& dir) {
  const std::string text = read_text(dir + "/checkpoint");
  std::istringstream in(text);
  std::string line, latest;
  std::vector<std::string> all;
  // Each line is KEY: "VALUE", KEY one of the two names, VALUE free of quotes and backslashes.
  // (Parsed by hand: <regex> trips g++ 12's -Wmaybe-uninitialized in sanitizer builds.)
  while (std::getline(in, line)) {
    INFO("state file line: " << line);
    const size_t colon = line.find(": \"");
    REQUIRE(colon != std::string::npos);
    const std::string key = line.substr(0, colon);
    REQUIRE((key == "model_checkpoint_path" || key == "all_model_checkpoint_paths"));
    const size_t open = colon + 3;
    REQUIRE(line.size() > open);
    REQUIRE(line.back() == '"');
    const std::string value = line.substr(open, line.size() - open - 1);
    REQUIRE(value.find_first_of("\"\\") == std::string::npos);
    if (key == "model_checkpoint_path") {
      REQUIRE(latest.empty());
      latest = value;
    } else {
      all.push_back(value);
    }
  }
  return {latest, all};
}

/// Redirects this process's stderr (fd 2) to a file while alive; text() returns what was written.
class CaptureStderr {
 public:
  CaptureStderr()
      : path_(fs::temp_directory_path() / ("tandem_stderr_" + std::to_string(::getpid()))) {
    std::fflush(stderr);
    saved_ = ::dup(2);
    const int fd = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(fd, 2);
    ::close(fd);
  }
  ~CaptureStderr() { restore(); }
  std::string text() {
    restore();
    return read_text(path_.string());
  }

 private:
  void restore() {
    if (saved_ < 0) return;
    std::fflush(stderr);
    ::dup2(saved_, 2);
    ::close(saved_);
    saved_ = -1;
  }
  fs::path path_;
  int saved_ = -1;
};

// ---- child processes ---------------------------------------------------------------------------

/// Starts this test binary again (a new process: nothing shared but the file system) running the
/// hidden test case `test_name`, with `env` added to the environment and its output in
/// `log_path`. Returns the child's pid.
inline pid_t spawn_child(const std::string& test_name,
                         const std::vector<std::pair<std::string, std::string>>& env,
                         const std::string& log_path) {
  const std::string exe = fs::read_symlink("/proc/self/exe").string();
  std::vector<std::string> env_strings;
  for (char** e = environ; *e != nullptr; ++e) env_strings.emplace_back(*e);
  for (const auto& [key, value] : env) env_strings.push_back(key + "=" + value);
  std::vector<char*> envp;
  for (std::string& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::vector<std::string> args = {exe, test_name};
  std::vector<char*> argv;
  for (std::string& s : args) argv.push_back(s.data());
  argv.push_back(nullptr);

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC,
                                   0644);
  posix_spawn_file_actions_adddup2(&actions, 1, 2);
  pid_t pid = -1;
  const int status = posix_spawn(&pid, exe.c_str(), &actions, nullptr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  REQUIRE(status == 0);
  return pid;
}

/// Waits for `pid`; returns its wait status.
inline int wait_child(pid_t pid) {
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return status;
}

/// Runs a child to completion and requires that it exits with 0 (its log is shown otherwise).
inline void run_child(const std::string& test_name,
                      const std::vector<std::pair<std::string, std::string>>& env,
                      const std::string& log_path) {
  const int status = wait_child(spawn_child(test_name, env, log_path));
  INFO("child output:\n" << read_text(log_path));
  REQUIRE(WIFEXITED(status));
  REQUIRE(WEXITSTATUS(status) == 0);
}

/// Polls for `path` to exist (a child signalling it reached a point); false after `timeout` or
/// when the child `pid` has exited.
inline bool wait_for_file(const std::string& path, pid_t pid, std::chrono::seconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (fs::exists(path)) return true;
    int status = 0;
    if (::waitpid(pid, &status, WNOHANG) == pid) return fs::exists(path);
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return false;
}

/// The value of environment variable `name`, or "" (children read their instructions here).
inline std::string env_or_empty(const char* name) {
  const char* value = std::getenv(name);
  return value ? value : "";
}

// ---- a small training run whose whole state is checkpointed -------------------------------

/// Data: kExamples examples of kFeatures features, 4 classes from a fixed rule, shuffled
/// (buffer smaller than the data, so the shuffle state matters), batched by kGlobalBatch (the
/// last batch of each epoch is short), prefetched.
struct TrainingRun {
  static constexpr int64_t kFeatures = 8;
  static constexpr int64_t kClasses = 4;
  static constexpr int64_t kExamples = 330;  // 11 steps per epoch, the last one of 10 examples
  static constexpr int64_t kGlobalBatch = 32;

  /// The update rule of the run's optimizer.
  enum class Rule { kAdam, kLion };

  /// `accumulation_steps` > 1: each train() step is a micro-step of an accumulating optimizer.
  explicit TrainingRun(int replicas, int accumulation_steps = 1, Rule rule = Rule::kAdam)
      : strategy(MirroredStrategy::cpu(replicas)),
        data(strategy.distribute_dataset(make_dataset())),
        accuracy("train_accuracy") {
    auto scope = strategy.scope();
    model = std::make_unique<nn::Sequential>(std::initializer_list<nn::Module>{
        nn::Dense(16, nn::Activation::kRelu), nn::Dropout(0.25), nn::Dense(kClasses)});
    model->set_seed(11);
    model->build({kFeatures});
    if (rule == Rule::kLion) {
      optimizer = std::make_unique<optim::Lion>(
          optim::Lion::Options{.learning_rate = 0.003,
                               .weight_decay = 0.1,
                               .gradient_accumulation_steps = accumulation_steps});
    } else {
      optimizer = std::make_unique<optim::Adam>(optim::Adam::Options{
          .learning_rate = 0.01, .gradient_accumulation_steps = accumulation_steps});
    }
  }

  static data::Dataset make_dataset() {
    Generator g(/*seed=*/2024);
    const Tensor features = Tensor::normal({kExamples, kFeatures}, g);
    std::vector<int64_t> labels(static_cast<size_t>(kExamples));
    const float* f = features.data<float>();
    for (size_t i = 0; i < labels.size(); ++i) {
      const float score = f[i * kFeatures] + 0.5f * f[i * kFeatures + 1] - f[i * kFeatures + 2];
      labels[i] = score < -0.7f ? 0 : score < 0.0f ? 1 : score < 0.7f ? 2 : 3;
    }
    return data::from_tensor_slices({features, Tensor::from_vector(labels)})
        .shuffle(/*buffer_size=*/64, /*seed=*/42)
        .batch(kGlobalBatch)
        .prefetch(2);
  }

  Checkpoint checkpoint() {
    return Checkpoint({{"model", model.get()},
                       {"optimizer", optimizer.get()},
                       {"train_data", &data},
                       {"train_accuracy", &accuracy},
                       {"step_in_epoch", &step_in_epoch}});
  }

  /// Runs `steps` training steps, crossing epoch boundaries as needed; records a hash of every
  /// replica's batch.
  void train(int64_t steps) {
    const std::vector<Variable> variables = model->trainable_variables();
    auto step = [&](ReplicaContext& ctx, const data::Batch& batch) {
      GradientTape tape;
      const Tensor logits = (*model)(batch.features(), /*training=*/true);
      const Tensor loss = compute_average_loss(
          losses::sparse_categorical_crossentropy(batch.labels(), logits, /*from_logits=*/true),
          kGlobalBatch);
      optimizer->apply_gradients(ctx, tape.gradient(loss, variables), variables);
      accuracy.update_state(batch.labels(), logits);
      return loss;
    };
    std::vector<data::Batch> batches;
    for (int64_t s = 0; s < steps; ++s) {
      if (!data.next(batches)) {
        step_in_epoch = 0;
        REQUIRE(data.next(batches));
      }
      for (const data::Batch& b : batches) batch_hashes.push_back(hash_batch(b));
      strategy.run(step, PerReplica<data::Batch>(batches));
      ++step_in_epoch;
    }
  }

  static uint64_t hash_batch(const data::Batch& batch) {
    uint64_t h = 0xcbf29ce484222325ULL;
    for (const Tensor& t : batch.tensors()) {
      const Tensor host = t.to(Device::cpu());
      const auto* bytes = static_cast<const unsigned char*>(host.raw_data());
      for (size_t i = 0; i < host.nbytes(); ++i) h = (h ^ bytes[i]) * 0x100000001b3ULL;
      h = (h ^ static_cast<uint64_t>(t.dim(0))) * 0x100000001b3ULL;
    }
    return h;
  }

  /// Every replica copy of every model variable and optimizer slot, and the counters, as named
  /// byte strings (bitwise comparison, also across processes through save_state/load_state).
  std::map<std::string, std::string> state() const {
    std::map<std::string, std::string> out;
    auto add = [&](const std::string& name, const Variable& v) {
      for (int r = 0; r < v.num_copies(); ++r) {
        const Tensor host = v.copy(r).to(Device::cpu());
        out[name + "@" + std::to_string(r)] =
            std::string(static_cast<const char*>(host.raw_data()), host.nbytes());
      }
    };
    for (const Variable& v : model->weights()) add(v.name(), v);
    for (const auto& [name, slot] : optimizer->slot_variables()) add(name, slot);
    add("iteration", optimizer->iterations_variable());
    for (const auto& [name, accumulator] : optimizer->accumulator_variables())
      add("grad_accum/" + name, accumulator);
    out["micro_step"] = std::to_string(optimizer->micro_step());
    const metrics::MetricState m = accuracy.combined_state();
    out["accuracy_total"] = std::to_string(m.scalar("total"));
    out["accuracy_count"] = std::to_string(m.scalar("count"));
    out["step_in_epoch"] = std::to_string(step_in_epoch);
    out["data_epoch"] = std::to_string(data.epoch());
    return out;
  }

  MirroredStrategy strategy;
  data::DistributedDataset data;
  std::unique_ptr<nn::Sequential> model;
  std::unique_ptr<optim::Optimizer> optimizer;
  metrics::SparseCategoricalAccuracy accuracy;
  int64_t step_in_epoch = 0;
  std::vector<uint64_t> batch_hashes;
};

/// Writes named byte strings as "name size\n<bytes>\n" records.
inline void save_state(const std::string& path, const std::map<std::string, std::string>& state) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  for (const auto& [name, bytes] : state)
    out << name << " " << bytes.size() << "\n" << bytes << "\n";
}

inline std::map<std::string, std::string> load_state(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::map<std::string, std::string> state;
  std::string name;
  size_t size = 0;
  while (in >> name >> size) {
    in.get();  // the newline after the size
    std::string bytes(size, '\0');
    in.read(bytes.data(), static_cast<std::streamsize>(size));
    in.get();
    state[name] = bytes;
  }
  return state;
}

/// Sets every replica copy of every model weight to `value`.
inline void fill_model(const nn::Module& model, float value) {
  for (const Variable& v : model.weights()) {
    for (int r = 0; r < v.num_copies(); ++r) {
      Tensor copy = v.copy(r);
      copy.fill_(value);
    }
  }
}

/// The weights the checked-in fixtures were written with: element j of variable i is
/// (i + 1) + j / 1000.
inline std::vector<float> fixture_values(int variable, int64_t numel) {
  std::vector<float> values(static_cast<size_t>(numel));
  for (size_t j = 0; j < values.size(); ++j)
    values[j] = static_cast<float>(variable + 1) + static_cast<float>(j) / 1000.0f;
  return values;
}

/// The model of the checked-in fixtures (tests/checkpoint/fixtures): Dense(13, relu), Dense(3)
/// on 7 features, Adam, global_step 7.
struct FixtureModel {
  FixtureModel() {
    model.add(nn::Dense(13, nn::Activation::kRelu));
    model.add(nn::Dense(3));
    model.build({7});
  }
  Checkpoint checkpoint() {
    return Checkpoint({{"model", &model}, {"optimizer", &optimizer}, {"global_step", &step}});
  }
  nn::Sequential model;
  optim::Adam optimizer;
  int64_t step = 0;
};

}  // namespace tandem::checkpoint_testing
