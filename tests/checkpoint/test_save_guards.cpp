// Saves that must not lose what a run can resume from: weights or optimizer slots that turned NaN
// or Inf are refused by name before anything is written or rotated away, and the temporary files
// of the write protocol are created exclusively, never through a symbolic link or FIFO someone
// left at their name.
#include <sys/stat.h>
#include <sys/types.h>

#include <cmath>
#include <functional>
#include <future>

#include "checkpoint_test_util.h"
#include "tandem/checkpoint/internal/file_io.h"

namespace td = tandem;
using namespace tandem::checkpoint_testing;
using Catch::Matchers::Contains;

namespace {

/// Dense(16, relu), Dense(4) on 8 features, Adam with its slots built.
struct Net {
  Net() {
    model.add(td::nn::Dense(16, td::nn::Activation::kRelu));
    model.add(td::nn::Dense(4));
    model.set_seed(5);
    model.build({8});
    optimizer.build(model.trainable_variables());
  }
  td::Checkpoint checkpoint() {
    return td::Checkpoint(
        {{"model", &model}, {"optimizer", &optimizer}, {"global_step", &step}, {"loss", &loss}});
  }
  td::nn::Sequential model;
  td::optim::Adam optimizer;
  int64_t step = 0;
  double loss = 0;  // the program's own value: NaN is allowed there
};

/// Sets element `index` of every copy of `v` to `value`.
void set_element(const td::Variable& v, size_t index, float value) {
  std::vector<float> values = v.copy(0).to_vector<float>();
  values[index] = value;
  for (int r = 0; r < v.num_copies(); ++r) {
    td::Tensor copy = v.copy(r);
    copy.copy_from(td::Tensor::from_vector(values, v.shape()));
  }
}

/// Every weight `value`, the step `step`, then a save that must write ckpt-`step`.h5.
void save_finite(Net& net, td::CheckpointManager& manager, float value, int64_t step,
                 const TempDir& dir) {
  fill_model(net.model, value);
  net.step = step;
  REQUIRE(manager.save() == dir.file("ckpt-" + std::to_string(step) + ".h5"));
}

/// Runs `action` on another thread; fails when it takes longer than 30 s (a blocking open of a
/// FIFO), first opening `fifo` from this side so that the blocked thread is released.
void within_time_limit(const std::function<void()>& action, const std::string& fifo) {
  std::future<void> done = std::async(std::launch::async, action);
  if (done.wait_for(std::chrono::seconds(30)) == std::future_status::ready) {
    done.get();
    return;
  }
  const int reader = ::open(fifo.c_str(), O_RDONLY | O_NONBLOCK);
  const int writer = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK);
  done.wait();
  if (reader >= 0) ::close(reader);
  if (writer >= 0) ::close(writer);
  FAIL("blocked for 30 s on the FIFO " << fifo);
}

}  // namespace

TEST_CASE("checkpoint save guards: a NaN weight is refused by name and nothing is rotated away",
          "[cpu][checkpoint]") {
  TempDir dir;
  Net net;
  td::CheckpointManager manager(net.checkpoint(), dir.str(), {.max_to_keep = 2});
  save_finite(net, manager, 1.0f, 1, dir);
  save_finite(net, manager, 2.0f, 2, dir);
  const std::string newest = read_text(dir.file("ckpt-2.h5"));
  const std::string state_file = read_text(dir.file("checkpoint"));

  // The run diverges: two variables turn non-finite; the program's own double may be NaN.
  REQUIRE(net.model.weights()[2].name() == "dense_1/kernel");
  set_element(net.model.weights()[2], 7, NAN);
  set_element(net.model.weights()[2], 9, INFINITY);
  set_element(net.model.weights()[3], 0, -INFINITY);
  net.loss = NAN;
  // It saves on (step 2 again: the name of the newest good checkpoint, which must not change).
  for (const int64_t step : {3, 4, 2, 5, 6}) {
    net.step = step;
    const std::string path = dir.file("ckpt-" + std::to_string(step) + ".h5");
    CHECK_THROWS_WITH(
        manager.save(),
        Contains("not writing " + path + " (step " + std::to_string(step) + ")") &&
            Contains("the model weight \"dense_1/kernel\" (/model_weights/dense_1/dense_1/"
                     "kernel:0) holds 2 non-finite values (1 NaN, 1 Inf) of 64, the first at "
                     "index 7 (nan)") &&
            Contains("1 more hold non-finite values: \"dense_1/bias\"") &&
            Contains("the newest earlier one is " + dir.file("ckpt-2.h5")));
  }
  // Nothing was written, renamed or deleted.
  CHECK(list_dir(dir.str()) == std::vector<std::string>{"checkpoint", "ckpt-1.h5", "ckpt-2.h5"});
  CHECK(read_text(dir.file("ckpt-2.h5")) == newest);
  CHECK(read_text(dir.file("checkpoint")) == state_file);
  CHECK(manager.checkpoints() ==
        std::vector<std::string>{dir.file("ckpt-1.h5"), dir.file("ckpt-2.h5")});
  CHECK(manager.latest_checkpoint() == dir.file("ckpt-2.h5"));

  // A new run resumes from the newest finite checkpoint.
  {
    Net resumed;
    td::CheckpointManager again(resumed.checkpoint(), dir.str(), {.max_to_keep = 2});
    CHECK(again.restore_or_initialize() == dir.file("ckpt-2.h5"));
    CHECK(resumed.step == 2);
    for (const td::Variable& v : resumed.model.weights())
      for (const float x : v.copy(0).to_vector<float>()) REQUIRE(x == 2.0f);
  }
  // Finite again, the run saves and rotates as before: the oldest goes.
  save_finite(net, manager, 7.0f, 7, dir);
  CHECK(list_dir(dir.str()) == std::vector<std::string>{"checkpoint", "ckpt-2.h5", "ckpt-7.h5"});
  CHECK(parse_state_file(dir.str()).first == "ckpt-7.h5");
}

TEST_CASE("checkpoint save guards: a non-finite optimizer slot is refused by name",
          "[cpu][checkpoint]") {
  TempDir dir;
  Net net;
  td::CheckpointManager manager(net.checkpoint(), dir.str(), {.max_to_keep = 1});
  save_finite(net, manager, 1.0f, 1, dir);
  const std::string first = read_text(dir.file("ckpt-1.h5"));
  const td::Variable kernel = net.model.trainable_variables()[0];
  set_element(net.optimizer.slot(kernel, "v"), 5, INFINITY);
  net.step = 2;
  const std::string expected =
      "the optimizer slot \"v/dense/kernel\" (/optimizer_weights/v/dense/kernel:0) holds 1 "
      "non-finite values (0 NaN, 1 Inf) of 128, the first at index 5 (inf)";
  CHECK_THROWS_WITH(manager.save(), Contains(dir.file("ckpt-2.h5")) && Contains(expected));
  CHECK(list_dir(dir.str()) == std::vector<std::string>{"checkpoint", "ckpt-1.h5"});
  CHECK(read_text(dir.file("ckpt-1.h5")) == first);
  // Checkpoint::write, without a manager, refuses it too and leaves no file behind.
  CHECK_THROWS_WITH(net.checkpoint().write(dir.file("direct.h5")),
                    Contains("not writing " + dir.file("direct.h5")) && Contains(expected));
  CHECK(list_dir(dir.str()) == std::vector<std::string>{"checkpoint", "ckpt-1.h5"});

  Net resumed;
  td::CheckpointManager again(resumed.checkpoint(), dir.str(), {.max_to_keep = 1});
  CHECK(again.restore_or_initialize() == dir.file("ckpt-1.h5"));
  CHECK(resumed.step == 1);
}

TEST_CASE("checkpoint save guards: an asynchronous save of NaN fails at the next call",
          "[cpu][checkpoint]") {
  TempDir dir;
  Net net;
  td::CheckpointManager manager(net.checkpoint(), dir.str(),
                                {.max_to_keep = 2, .async_save = true});
  save_finite(net, manager, 1.0f, 1, dir);
  save_finite(net, manager, 2.0f, 2, dir);
  manager.wait();
  const std::string state_file = read_text(dir.file("checkpoint"));
  const td::Variable bias = net.model.weights()[1];
  set_element(bias, 3, NAN);
  net.step = 3;
  CHECK(manager.save() == dir.file("ckpt-3.h5"));  // taken; the writer refuses it
  CHECK_THROWS_WITH(manager.wait(), Contains("not writing " + dir.file("ckpt-3.h5")) &&
                                        Contains("\"dense/bias\"") &&
                                        Contains("first at index 3 (nan)"));
  manager.wait();  // raised once
  net.step = 4;
  CHECK(manager.save() == dir.file("ckpt-4.h5"));
  CHECK_THROWS_WITH(manager.save(5), Contains("not writing " + dir.file("ckpt-4.h5")));
  CHECK(list_dir(dir.str()) == std::vector<std::string>{"checkpoint", "ckpt-1.h5", "ckpt-2.h5"});
  CHECK(read_text(dir.file("checkpoint")) == state_file);
  // Finite again: the next save writes.
  save_finite(net, manager, 6.0f, 6, dir);
  manager.wait();
  CHECK(list_dir(dir.str()) == std::vector<std::string>{"checkpoint", "ckpt-2.h5", "ckpt-6.h5"});
}

TEST_CASE("checkpoint save guards: a temporary file is never made through a planted link or FIFO",
          "[cpu][checkpoint]") {
  TempDir dir;
  const std::string victim = dir.file("victim");
  write_text(victim, "not yours");
  const std::string target = dir.file("ckpt-3.h5");
  const std::string predictable = td::detail::temp_path_for(target);
  REQUIRE(predictable == target + ".tmp." + std::to_string(::getpid()));
  fs::create_symlink(victim, predictable);

  const td::detail::TempFile file = td::detail::create_temp_beside(target, 0600);
  CHECK(file.path != predictable);
  CHECK(file.path.starts_with(predictable + "."));
  td::detail::write_all(file.fd, "new", 3, file.path);
  REQUIRE(::close(file.fd) == 0);
  CHECK(read_text(victim) == "not yours");
  CHECK(fs::is_symlink(predictable));
  struct stat info {};
  REQUIRE(::lstat(file.path.c_str(), &info) == 0);
  CHECK(S_ISREG(info.st_mode));
  CHECK((info.st_mode & 0777) == 0600);
  CHECK(read_text(file.path) == "new");

  // A FIFO at the name: passed over at once, never opened (an open would block).
  const std::string other = dir.file("ckpt-4.h5");
  REQUIRE(::mkfifo(td::detail::temp_path_for(other).c_str(), 0666) == 0);
  within_time_limit(
      [&] {
        const td::detail::TempFile made = td::detail::create_temp_beside(other, 0600);
        ::close(made.fd);
        CHECK(made.path != td::detail::temp_path_for(other));
      },
      td::detail::temp_path_for(other));
}

TEST_CASE("checkpoint save guards: a save passes over a link and a FIFO at its temporary names",
          "[cpu][checkpoint]") {
  TempDir dir;
  Net net;
  td::CheckpointManager manager(net.checkpoint(), dir.str(), {.max_to_keep = 2});
  save_finite(net, manager, 1.0f, 1, dir);
  // Another user's link where the checkpoint's temporary would go, and a FIFO where the state
  // file's would (both names are predictable: the pid).
  const std::string victim = dir.file("victim");
  write_text(victim, "not yours");
  const std::string link = td::detail::temp_path_for(dir.file("ckpt-2.h5"));
  const std::string fifo = td::detail::temp_path_for(dir.file("checkpoint"));
  fs::create_symlink(victim, link);
  REQUIRE(::mkfifo(fifo.c_str(), 0666) == 0);
  within_time_limit([&] { save_finite(net, manager, 2.0f, 2, dir); }, fifo);
  CHECK(read_text(victim) == "not yours");
  CHECK(fs::is_symlink(link));
  CHECK(fs::is_fifo(fs::symlink_status(fifo)));
  CHECK(parse_state_file(dir.str()).first == "ckpt-2.h5");
  Net resumed;
  td::CheckpointManager again(resumed.checkpoint(), dir.str());
  CHECK(again.restore_or_initialize() == dir.file("ckpt-2.h5"));
  CHECK(resumed.step == 2);
}

TEST_CASE(
    "checkpoint save guards: state a restore would refuse (a NaN metric) is not written and "
    "rotates nothing away",
    "[cpu][checkpoint]") {
  // Weights and slots are finite; the metric's total is not. The written file is read back
  // through the validation a restore runs: refused, nothing renamed, nothing rotated.
  TempDir dir;
  Net net;
  td::metrics::Mean mean("mean_loss");
  td::Checkpoint checkpoint({{"model", &net.model},
                             {"optimizer", &net.optimizer},
                             {"global_step", &net.step},
                             {"mean_loss", &mean}});
  td::CheckpointManager manager(checkpoint, dir.str(), {.max_to_keep = 1});
  mean.update_state(td::Tensor::from_vector<float>({1.0f, 2.0f}));
  net.step = 1;
  REQUIRE(manager.save() == dir.file("ckpt-1.h5"));
  mean.update_state(td::Tensor::from_vector<float>({std::nanf("")}));
  net.step = 2;
  CHECK_THROWS_WITH(manager.save(), Contains(dir.file("ckpt-2.h5")) &&
                                        Contains("would not restore") && Contains("mean_loss") &&
                                        Contains("nothing was written"));
  CHECK(list_dir(dir.str()) == std::vector<std::string>{"checkpoint", "ckpt-1.h5"});
  td::metrics::Mean restored_mean("mean_loss");
  Net restored;
  td::Checkpoint reader({{"model", &restored.model},
                         {"optimizer", &restored.optimizer},
                         {"global_step", &restored.step},
                         {"mean_loss", &restored_mean}});
  td::CheckpointManager again(reader, dir.str(), {.max_to_keep = 1});
  CHECK(again.restore_or_initialize() == dir.file("ckpt-1.h5"));
  CHECK(restored.step == 1);
  CHECK(restored_mean.result() == 1.5);
}
