// Multi-worker checkpoint guards: a save of NaN weights is refused on every worker alike, and a
// worker that is not the chief restores the chief's file through a private copy that no link or
// FIFO left at a predictable name can redirect or block.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "mpi/job.h"
#include "tandem/checkpoint/internal/file_io.h"
#include "tandem/distribute/internal/strategy_access.h"
#include "tandem/tandem.h"

namespace td = tandem;
namespace fs = std::filesystem;

namespace {

using Access = td::detail::StrategyAccess;

std::string text_of(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

/// Sets every copy of every weight to `value`, and element 3 of the first one to `odd`.
void fill(const td::nn::Module& model, float value, float odd) {
  const std::vector<td::Variable> weights = model.weights();
  for (size_t i = 0; i < weights.size(); ++i) {
    const td::Variable& v = weights[i];
    std::vector<float> values(static_cast<size_t>(v.shape().numel()), value);
    if (i == 0) values[3] = odd;
    for (int r = 0; r < v.num_copies(); ++r) {
      td::Tensor copy = v.copy(r);
      copy.copy_from(td::Tensor::from_vector(values, v.shape()));
    }
  }
}

/// Opens `fifo` for reading after 20 s unless stopped first: a worker blocked opening it for
/// writing is then released, and `released` says so.
class FifoWatchdog {
 public:
  explicit FifoWatchdog(std::string fifo)
      : thread_([this, fifo = std::move(fifo)] {
          const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
          while (!stop_ && std::chrono::steady_clock::now() < deadline)
            std::this_thread::sleep_for(std::chrono::milliseconds(10));
          if (stop_) return;
          released_ = true;
          const int fd = ::open(fifo.c_str(), O_RDONLY | O_NONBLOCK);
          std::this_thread::sleep_for(std::chrono::seconds(1));
          if (fd >= 0) ::close(fd);
        }) {}
  ~FifoWatchdog() { stop(); }
  /// Stops it; true when it had to release a blocked open.
  bool stop() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
    return released_;
  }

 private:
  std::atomic<bool> stop_{false}, released_{false};
  std::thread thread_;
};

}  // namespace

TEST_CASE(
    "multi-worker: NaN weights are refused on every worker, and a non-chief's restore copy "
    "passes over planted links and FIFOs",
    "[mpi]") {
  td::Strategy& s = tandem::testing::job_strategy();
  const std::string dir = tandem::testing::shared_temp_dir(s, "guard");
  const std::string own_dir =
      s.is_chief()
          ? dir
          : (fs::temp_directory_path() / ("tandem_mpi_guard_own_" + std::to_string(::getpid())))
                .string();
  td::nn::Sequential model;
  model.add(td::nn::Dense(8));
  td::optim::Adam optimizer;
  {
    auto scope = s.scope();
    model.set_seed(3);
    model.build({4});
    optimizer.build(model.trainable_variables());
  }
  int64_t step = 0;
  const td::Checkpoint checkpoint(
      {{"model", &model}, {"optimizer", &optimizer}, {"global_step", &step}});
  {
    td::CheckpointManager manager(checkpoint, own_dir, {.max_to_keep = 1, .strategy = &s});
    fill(model, 1.0f, 1.5f);
    step = 1;
    REQUIRE(manager.save().has_value());
    // The run diverges on every worker: every worker raises, none hangs, nothing is rotated.
    fill(model, 2.0f, NAN);
    step = 2;
    if (s.is_chief()) {
      CHECK_THROWS_WITH(manager.save(),
                        Catch::Contains("not writing " + dir + "/ckpt-2.h5 (step 2)") &&
                            Catch::Contains("\"dense/kernel\"") &&
                            Catch::Contains("first at index 3 (nan)"));
    } else {
      CHECK_THROWS_WITH(manager.save(),
                        Catch::Contains("the chief refused to write " + own_dir + "/ckpt-2.h5") &&
                            Catch::Contains("NaN or Inf"));
    }
    CHECK(Access::reduce_across_workers(s, td::ReduceOp::kSum, td::Tensor::scalar(1.0))
              .item<double>() == s.num_workers());
    if (s.is_chief()) CHECK(fs::exists(dir + "/ckpt-1.h5"));
  }

  // Every worker restores ckpt-1 twice: links and FIFOs sit at the names a copy once used
  // (/tmp/ckpt-1.h5.tmp.<pid>) and at the first name beside the worker's own directory.
  const std::string victim = own_dir + "/victim";
  if (!s.is_chief()) {
    fs::create_directories(own_dir);
    std::ofstream(victim) << "not yours";
  }
  const std::string old_name =
      td::detail::temp_path_for((fs::temp_directory_path() / "ckpt-1.h5").string());
  const std::string own_name = td::detail::temp_path_for(own_dir + "/ckpt-1.h5");
  for (const bool fifo_in_tmp : {false, true}) {
    INFO("FIFO at " << (fifo_in_tmp ? old_name : own_name));
    std::string fifo;
    if (!s.is_chief()) {
      fifo = fifo_in_tmp ? old_name : own_name;
      const std::string link = fifo_in_tmp ? own_name : old_name;
      fs::remove(old_name);
      fs::remove(own_name);
      fs::create_symlink(victim, link);
      REQUIRE(::mkfifo(fifo.c_str(), 0666) == 0);
    }
    fill(model, 0.0f, 0.0f);
    step = 0;
    td::CheckpointManager manager(checkpoint, own_dir, {.max_to_keep = 1, .strategy = &s});
    std::optional<FifoWatchdog> watchdog;
    if (!s.is_chief()) watchdog.emplace(fifo);
    CHECK(manager.restore_or_initialize() == dir + "/ckpt-1.h5");
    if (watchdog) CHECK_FALSE(watchdog->stop());
    CHECK(step == 1);
    CHECK(model.weights()[0].copy(0).to_vector<float>()[3] == 1.5f);
    if (!s.is_chief()) {
      CHECK(text_of(victim) == "not yours");
      CHECK(fs::is_fifo(fs::symlink_status(fifo)));
      // Only the planted names and the victim are left: the copy was removed.
      std::vector<std::string> names;
      for (const auto& entry : fs::directory_iterator(own_dir))
        names.push_back(entry.path().filename().string());
      CHECK(names.size() == 2);
    }
  }
  if (!s.is_chief()) {
    fs::remove(old_name);
    fs::remove_all(own_dir);
  }
  Access::reduce_across_workers(s, td::ReduceOp::kSum, td::Tensor::scalar(1.0));
  if (s.is_chief()) fs::remove_all(dir);
}
