// Checkpoint saves, synchronous against asynchronous (CheckpointManager::Options::async_save):
// how long save() blocks the training loop, against the copy of the state an asynchronous save
// takes (every weight and optimizer slot cloned); and the training steps per second while a
// background write is in flight against without one. The sample MLP and a large MLP, Adam.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "tandem/tandem.h"
#include "timing.h"

namespace td = tandem;
namespace fs = std::filesystem;
using tandem::bench::now_seconds;

namespace {

struct Config {
  const char* name;
  const char* model;
  std::vector<int64_t> hidden;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct Result {
  int64_t parameters = 0;
  double file_mb = 0, copy_ms = 0, sync_ms = 0, async_ms = 0, step_ms = 0, step_ms_during_write = 0;
};

Result measure(const Config& c, int saves) {
  td::nn::Sequential model;
  model.add(td::nn::Flatten());
  for (const int64_t h : c.hidden) model.add(td::nn::Dense(h, td::nn::Activation::kRelu));
  model.add(td::nn::Dense(10));
  model.set_seed(1);
  model.build({28, 28});
  const std::vector<td::Variable> variables = model.trainable_variables();
  td::optim::Adam optimizer;
  optimizer.build(variables);
  td::Generator g(2);
  const td::Tensor x = td::Tensor::uniform({256, 28, 28}, g);
  const td::Tensor y =
      td::ops::cast(td::ops::mul(td::Tensor::uniform({256}, g), 9.99), td::DType::kInt64);
  const td::losses::SparseCategoricalCrossentropy loss_fn({.from_logits = true});
  auto step = [&] {
    td::GradientTape tape;
    const td::Tensor loss = loss_fn(y, model(x, true));
    optimizer.apply_gradients(tape.gradient(loss, variables), variables);
  };
  step();
  int64_t global_step = 0;
  td::Checkpoint checkpoint(
      {{"model", &model}, {"optimizer", &optimizer}, {"global_step", &global_step}});
  const std::string root =
      (fs::temp_directory_path() / ("tandem_bench_ckpt_" + std::to_string(getpid()))).string();
  fs::create_directories(root + "/sync");
  fs::create_directories(root + "/async");
  Result r;
  {
    td::CheckpointManager sync(checkpoint, root + "/sync", {.max_to_keep = 2});
    td::CheckpointManager async(checkpoint, root + "/async",
                                {.max_to_keep = 2, .async_save = true});
    std::vector<double> copy, sync_t, async_t, plain_steps, during_steps;
    for (const td::Variable& v : model.weights()) r.parameters += v.shape().numel();
    for (int i = 0; i < saves; ++i) {
      // The copy an asynchronous save takes: every weight and slot cloned to host memory.
      double start = now_seconds();
      std::vector<td::Tensor> copies;
      for (const td::Variable& v : model.weights()) copies.push_back(v.copy(0).clone());
      for (const auto& [name, slot] : optimizer.slot_variables())
        copies.push_back(slot.copy(0).clone());
      copy.push_back(now_seconds() - start);

      ++global_step;
      start = now_seconds();
      const std::string path = *sync.save();
      sync_t.push_back(now_seconds() - start);
      r.file_mb = static_cast<double>(fs::file_size(path)) / 1e6;

      // Steps without a write in flight, then the same number right after an asynchronous
      // save() returns, while its file is written.
      const int steps = 4;
      start = now_seconds();
      for (int s = 0; s < steps; ++s) step();
      plain_steps.push_back((now_seconds() - start) / steps);
      async.wait();
      ++global_step;
      start = now_seconds();
      async.save();
      async_t.push_back(now_seconds() - start);
      start = now_seconds();
      for (int s = 0; s < steps; ++s) step();
      during_steps.push_back((now_seconds() - start) / steps);
    }
    async.wait();
    r.copy_ms = median(copy) * 1e3;
    r.sync_ms = median(sync_t) * 1e3;
    r.async_ms = median(async_t) * 1e3;
    r.step_ms = median(plain_steps) * 1e3;
    r.step_ms_during_write = median(during_steps) * 1e3;
  }
  fs::remove_all(root);
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  int saves = 15;
  for (int i = 1; i + 1 < argc; ++i)
    if (std::string(argv[i]) == "--saves") saves = std::max(3, std::atoi(argv[i + 1]));
  setenv("TANDEM_LOG_LEVEL", "warning", 0);
  const std::vector<Config> configs = {{"mlp", "784-256-128-10 (the sample)", {256, 128}},
                                       {"large", "784-1024-1024-10", {1024, 1024}}};
  std::printf(
      "CheckpointManager::save, model + Adam slots + counters, one process, median of %d saves\n"
      "copy = cloning every weight and slot (what an asynchronous save copies); sync = save() "
      "writing, checksumming, syncing and renaming; async = save() with async_save (the copy, "
      "then a background write); step = a training step (batch 256) alone and right after an "
      "asynchronous save() while its write runs\n\n",
      saves);
  std::printf("%-6s %-28s %10s %8s %9s %9s %9s %10s %9s %9s %12s %11s\n", "config", "model",
              "params", "file_MB", "copy_ms", "sync_ms", "async_ms", "async/copy", "sync/async",
              "step_ms", "step_ms_bg", "throughput");
  for (const Config& c : configs) {
    const Result r = measure(c, saves);
    std::printf("%-6s %-28s %10lld %8.2f %9.3f %9.3f %9.3f %10.2f %9.1fx %9.3f %12.3f %10.2fx\n",
                c.name, c.model, static_cast<long long>(r.parameters), r.file_mb, r.copy_ms,
                r.sync_ms, r.async_ms, r.async_ms / r.copy_ms, r.sync_ms / r.async_ms, r.step_ms,
                r.step_ms_during_write, r.step_ms / r.step_ms_during_write);
  }
  std::printf("\nthroughput = steps/s during a background write / without one\n");
  std::printf(
      "reproduce: cmake --build build --target bench_checkpoint_cpu && "
      "./build/bench/bench_checkpoint_cpu --saves %d\n",
      saves);
  return 0;
}
