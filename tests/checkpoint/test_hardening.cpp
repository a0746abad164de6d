// Damaged checkpoints found by an outside probe: every one must give a clear error naming the
// file and the dataset (or fall back to the previous checkpoint), never a crash, a hang, a
// gigabyte allocation or a silently different state; a save that fails on a full disk keeps the
// previous checkpoint and lets the process exit cleanly.
#include <sys/resource.h>
#include <sys/stat.h>

#include <cmath>
#include <csignal>
#include <future>
#include <limits>

#include "checkpoint_test_util.h"
#include "tandem/checkpoint/inspect.h"

namespace td = tandem;
using namespace tandem::checkpoint_testing;
using Catch::Matchers::Contains;

namespace {

/// Dense(hidden, relu), Dense(4) on 8 features, Adam: the model of test_errors.cpp.
struct Mlp {
  explicit Mlp(int64_t hidden = 16) {
    model.add(td::nn::Dense(hidden, td::nn::Activation::kRelu));
    model.add(td::nn::Dense(4));
    model.set_seed(5);
    model.build({8});
    optimizer.build(model.trainable_variables());
  }
  td::Checkpoint checkpoint() {
    return td::Checkpoint({{"model", &model},
                           {"optimizer", &optimizer},
                           {"global_step", &step},
                           {"step_in_epoch", &step_in_epoch},
                           {"train_loss", &loss}});
  }
  td::nn::Sequential model;
  td::optim::Adam optimizer;
  td::metrics::Mean loss{"train_loss"};
  int64_t step = 0;
  int64_t step_in_epoch = 0;
};

std::vector<float> values_of(const td::Variable& v) { return v.copy(0).to_vector<float>(); }

/// Sets element `index` of the float32 dataset `dataset` of the checkpoint `path` to `value`
/// (a save refuses NaN and Inf weights and slots, so such files are made by hand).
void set_in_file(const std::string& path, const std::string& dataset, size_t index, float value) {
  td::h5::File file = td::h5::File::open_for_update(path);
  std::vector<float> values = file.root().read_tensor(dataset).to_vector<float>();
  const td::Shape shape = file.root().read_tensor(dataset).shape();
  values[index] = value;
  file.root().remove(dataset);
  file.root().write_tensor(dataset, td::Tensor::from_vector(values, shape));
  file.close();
}

/// Replaces the dataset `dataset` of the checkpoint `path` by `value` (a save refuses values a
/// restore would, so such files are made by hand).
void replace_in_file(const std::string& path, const std::string& dataset, const td::Tensor& value) {
  td::h5::File file = td::h5::File::open_for_update(path);
  file.root().remove(dataset);
  file.root().write_tensor(dataset, value);
  file.close();
}

/// A directory with ckpt-1.h5 (every weight 1) and ckpt-2.h5 (every weight 2); `damage` runs
/// on the Mlp before ckpt-2 is written.
template <typename Damage>
void write_two(const TempDir& dir, Damage damage) {
  Mlp mlp;
  td::CheckpointManager manager(mlp.checkpoint(), dir.str(), {.max_to_keep = 3});
  fill_model(mlp.model, 1.0f);
  mlp.step = 1;
  manager.save();
  fill_model(mlp.model, 2.0f);
  mlp.step = 2;
  damage(mlp);
  manager.save();
}

/// restore_or_initialize on `dir` must restore ckpt-1.h5 and log why ckpt-2.h5 was skipped.
void check_falls_back_to_first(const TempDir& dir, const std::string& why) {
  Mlp mlp;
  td::CheckpointManager manager(mlp.checkpoint(), dir.str());
  std::optional<std::string> restored;
  std::string log;
  {
    CaptureStderr capture;
    restored = manager.restore_or_initialize();
    log = capture.text();
  }
  INFO("log:\n" << log);
  CHECK(restored == dir.file("ckpt-1.h5"));
  CHECK(mlp.step == 1);
  CHECK(values_of(mlp.model.weights()[0]) == std::vector<float>(8 * 16, 1.0f));
  CHECK_THAT(log, Contains("cannot restore " + dir.file("ckpt-2.h5")) && Contains(why) &&
                      Contains("restored " + dir.file("ckpt-1.h5")));
}

/// Offset of the first occurrence of `pattern` in `bytes` (fails the test when absent).
size_t find_bytes(const std::string& bytes, const std::string& pattern) {
  const size_t at = bytes.find(pattern);
  REQUIRE(at != std::string::npos);
  return at;
}

std::string fixture(const std::string& name) {
  return (fs::path(TANDEM_SOURCE_DIR) / "tests/checkpoint/fixtures" / name).string();
}

}  // namespace

// ---- 8. crashes --------------------------------------------------------------------------------

TEST_CASE("checkpoint hardening: an empty metric dataset is an error naming file, dataset, shape",
          "[cpu][checkpoint]") {
  TempDir dir;
  write_two(dir, [](Mlp&) {});
  const std::string path = dir.file("ckpt-2.h5");
  {
    td::h5::File file = td::h5::File::open_for_update(path);
    file.root().remove("training_state/metrics/train_loss/total");
    file.root().write_tensor("training_state/metrics/train_loss/total",
                             td::Tensor::zeros({0}, td::DType::kFloat64));
    file.close();
  }
  Mlp mlp;
  CHECK_THROWS_WITH(
      mlp.checkpoint().restore(path),
      Contains(path) && Contains("/training_state/metrics/train_loss/total") && Contains("[0]"));
  CHECK_THROWS_WITH(td::inspect_checkpoint(path),
                    Contains(path) && Contains("metrics/train_loss/total") && Contains("[0]"));
  // An empty counter too (inspect read [0] of it).
  {
    td::h5::File file = td::h5::File::open_for_update(dir.file("ckpt-1.h5"));
    file.root().remove("training_state/global_step");
    file.root().write_tensor("training_state/global_step",
                             td::Tensor::zeros({0}, td::DType::kInt64));
    file.close();
  }
  CHECK_THROWS_WITH(td::inspect_checkpoint(dir.file("ckpt-1.h5")),
                    Contains("training_state/global_step") && Contains("[0]"));
}

namespace {
constexpr const char* kDiskFullChild = "checkpoint hardening: a save past the file size limit";
}  // namespace

TEST_CASE("checkpoint hardening: a save on a full disk keeps the old checkpoint and exits cleanly",
          "[cpu][checkpoint]") {
  TempDir dir;
  {
    Mlp mlp(/*hidden=*/2048);  // ~200 KB of weights and Adam slots
    fill_model(mlp.model, 1.0f);
    mlp.step = 1;
    td::CheckpointManager manager(mlp.checkpoint(), dir.str());
    manager.save();
  }
  const std::string before = read_text(dir.file("ckpt-1.h5"));
  // The child saves ckpt-2.h5 under a file size limit of 64 KiB: its writes fail with EFBIG
  // as they would on a full disk. It must report that and then exit with status 0 (an HDF5 id
  // left open on the error path made HDF5's shutdown crash at exit).
  const pid_t pid =
      spawn_child(kDiskFullChild, {{"TANDEM_CKPT_TEST_DIR", dir.str()}}, dir.file("child.log"));
  const int status = wait_child(pid);
  const std::string log = read_text(dir.file("child.log"));
  INFO("child output:\n" << log);
  CHECK(WIFEXITED(status));
  CHECK((WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status)) == 0);
  CHECK_THAT(read_text(dir.file("save_error.txt")), Contains(dir.file("ckpt-2.h5")));
  CHECK(read_text(dir.file("ckpt-1.h5")) == before);
  CHECK_FALSE(fs::exists(dir.file("ckpt-2.h5")));
  CHECK_FALSE(has_temp_files(dir.str()));
  Mlp mlp(2048);
  td::CheckpointManager manager(mlp.checkpoint(), dir.str());
  CHECK(manager.restore_or_initialize() == dir.file("ckpt-1.h5"));
}

TEST_CASE("checkpoint hardening: a save past the file size limit", "[.child]") {
  const std::string dir = env_or_empty("TANDEM_CKPT_TEST_DIR");
  REQUIRE_FALSE(dir.empty());
  Mlp mlp(2048);
  fill_model(mlp.model, 2.0f);
  mlp.step = 2;
  td::CheckpointManager manager(mlp.checkpoint(), dir);
  std::signal(SIGXFSZ, SIG_IGN);  // a write past the limit then fails with EFBIG
  const rlimit limit{64 * 1024, 64 * 1024};
  REQUIRE(::setrlimit(RLIMIT_FSIZE, &limit) == 0);
  std::string message;
  try {
    manager.save();
  } catch (const td::Error& e) {
    message = e.what();
  }
  const rlimit unlimited{RLIM_INFINITY, RLIM_INFINITY};
  ::setrlimit(RLIMIT_FSIZE, &unlimited);  // lowering is allowed; raising back needs root
  write_text(dir + "/save_error.txt", message);
  CHECK_THAT(message, Contains(dir + "/ckpt-2.h5"));
}

// ---- 9. hangs and blow-ups --------------------------------------------------------------------

TEST_CASE("checkpoint hardening: a FIFO named as the newest checkpoint does not block",
          "[cpu][checkpoint]") {
  TempDir dir;
  write_two(dir, [](Mlp&) {});
  const std::string fifo = dir.file("ckpt-3.h5");
  REQUIRE(::mkfifo(fifo.c_str(), 0644) == 0);
  write_text(dir.file("checkpoint"),
             "model_checkpoint_path: \"ckpt-3.h5\"\n"
             "all_model_checkpoint_paths: \"ckpt-1.h5\"\n"
             "all_model_checkpoint_paths: \"ckpt-2.h5\"\n"
             "all_model_checkpoint_paths: \"ckpt-3.h5\"\n");
  // Each call runs on its own thread; one that blocks on the FIFO is released by opening its
  // write end (so that the test fails instead of hanging).
  auto within_10s = [&](auto call) {
    auto result = std::async(std::launch::async, call);
    const bool finished = result.wait_for(std::chrono::seconds(10)) == std::future_status::ready;
    if (!finished) {
      const int fd = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK);
      if (fd >= 0) ::close(fd);
    }
    CHECK(finished);
    return result.get();
  };
  Mlp mlp;
  const std::string error = within_10s([&]() -> std::string {
    try {
      mlp.checkpoint().restore(fifo);
    } catch (const std::exception& e) {
      return e.what();
    }
    return "";
  });
  CHECK_THAT(error, Contains(fifo) && Contains("FIFO"));
  const std::string inspected = within_10s([&]() -> std::string {
    try {
      return td::inspect_checkpoint(fifo);
    } catch (const std::exception& e) {
      return e.what();
    }
  });
  CHECK_THAT(inspected, Contains(fifo) && Contains("FIFO"));
  td::CheckpointManager manager(mlp.checkpoint(), dir.str());
  CaptureStderr quiet;
  CHECK(within_10s([&] { return manager.restore_or_initialize(); }) == dir.file("ckpt-2.h5"));
  CHECK(within_10s([&] { return td::latest_checkpoint(dir.str()); }) == dir.file("ckpt-2.h5"));
}

TEST_CASE("checkpoint hardening: a declared shape larger than the file is refused before reading",
          "[cpu][checkpoint]") {
  // v1_huge_dims.h5 is v1_no_checksums.h5 with one byte flipped in the dataspace of
  // model_weights/dense/dense/kernel:0: [7, 13] became [16777223, 13] (872 MB in a 29 KB file).
  const std::string path = fixture("v1_huge_dims.h5");
  FixtureModel reader;
  CHECK_THROWS_WITH(reader.checkpoint().restore(path),
                    Contains(path) && Contains("\"dense/kernel\"") && Contains("[16777223, 13]"));
  TempDir dir;
  const std::string copy = dir.file("ckpt-7.h5");
  fs::copy_file(path, copy);
  td::h5::File file = td::h5::File::open(copy);
  const td::h5::Group weights = file.root().open_group("model_weights/dense/dense");
  CHECK_THROWS_WITH(weights.read_tensor("kernel:0"), Contains(copy) && Contains("[16777223, 13]") &&
                                                         Contains("bytes") && Contains("damaged"));
}

// ---- 7. fall back past any damage --------------------------------------------------------------

TEST_CASE("checkpoint hardening: a shape changed by a flipped bit falls back, not 'another model'",
          "[cpu][checkpoint]") {
  TempDir dir;
  write_two(dir, [](Mlp&) {});
  {
    // The bias of dense_1 grows from [4] to [5] in ckpt-2.h5; its model_signature is left alone
    // (what a bit flip in the dataspace does).
    td::h5::File file = td::h5::File::open_for_update(dir.file("ckpt-2.h5"));
    file.root().remove("model_weights/dense_1/dense_1/bias:0");
    file.root().write_tensor("model_weights/dense_1/dense_1/bias:0",
                             td::Tensor::zeros({5}, td::DType::kFloat32));
    file.close();
  }
  check_falls_back_to_first(dir, "model_signature");
  // tandem::latest_checkpoint names the file that restores, not the damaged newer one.
  CHECK(td::latest_checkpoint(dir.str()) == dir.file("ckpt-1.h5"));
}

TEST_CASE("checkpoint hardening: a symbolic-link loop as the newest checkpoint falls back",
          "[cpu][checkpoint]") {
  TempDir dir;
  write_two(dir, [](Mlp&) {});
  fs::remove(dir.file("ckpt-2.h5"));
  fs::create_symlink("ckpt-2.h5", dir.file("ckpt-2.h5"));  // a link to itself: ELOOP
  Mlp mlp;
  std::optional<std::string> restored;
  std::string log;
  {
    CaptureStderr capture;
    td::CheckpointManager manager(mlp.checkpoint(), dir.str());
    restored = manager.restore_or_initialize();
    log = capture.text();
  }
  INFO("log:\n" << log);
  CHECK(restored == dir.file("ckpt-1.h5"));
  CHECK(mlp.step == 1);
  CHECK_THAT(log,
             Contains("cannot restore " + dir.file("ckpt-2.h5")) && Contains("symbolic links"));
  CHECK(td::latest_checkpoint(dir.str()) == dir.file("ckpt-1.h5"));
}

TEST_CASE("checkpoint hardening: only a directory where every checkpoint is of another model fails",
          "[cpu][checkpoint]") {
  TempDir dir;
  write_two(dir, [](Mlp&) {});
  Mlp wider(32);
  td::CheckpointManager manager(wider.checkpoint(), dir.str());
  CaptureStderr quiet;
  CHECK_THROWS_AS(manager.restore_or_initialize(), td::CheckpointMismatchError);
  CHECK_THROWS_WITH(manager.restore_or_initialize(), Contains(dir.file("ckpt-1.h5")) &&
                                                         Contains(dir.file("ckpt-2.h5")) &&
                                                         Contains("[8, 32]"));
}

TEST_CASE("checkpoint hardening: tandem-ckpt latest names a file that restores",
          "[cpu][checkpoint]") {
  TempDir dir;
  write_two(dir, [](Mlp&) {});
  set_in_file(dir.file("ckpt-2.h5"), "model_weights/dense/dense/kernel:0", 3, NAN);
  std::vector<std::string> skipped;
  CHECK(td::latest_checkpoint(dir.str(), &skipped) == dir.file("ckpt-1.h5"));
  REQUIRE(skipped.size() == 1);
  CHECK_THAT(skipped[0],
             Contains(dir.file("ckpt-2.h5")) && Contains("dense/kernel:0") && Contains("nan"));
#ifdef TANDEM_CKPT_TOOL
  const std::string scratch = dir.file("tool.out");
  const int status = std::system((std::string(TANDEM_CKPT_TOOL) + " latest " + dir.str() + " >" +
                                  scratch + " 2>" + scratch + ".err")
                                     .c_str());
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  CHECK(read_text(scratch) == dir.file("ckpt-1.h5") + "\n");
  CHECK_THAT(read_text(scratch + ".err"), Contains("skipped " + dir.file("ckpt-2.h5")));
#endif
}

// ---- 6. silently wrong restores ----------------------------------------------------------------

TEST_CASE("checkpoint hardening: a flipped bit in weight data fails its Fletcher-32 checksum",
          "[cpu][checkpoint]") {
  TempDir dir;
  write_two(dir, [](Mlp& mlp) {
    // A recognisable kernel: 128 distinct values 2.0 + j/1024.
    std::vector<float> values(8 * 16);
    for (size_t j = 0; j < values.size(); ++j) values[j] = 2.0f + static_cast<float>(j) / 1024.0f;
    const td::Variable kernel = mlp.model.weights()[0];
    td::Tensor copy = kernel.copy(0);
    copy.copy_from(td::Tensor::from_vector(values, kernel.shape()));
  });
  const std::string path = dir.file("ckpt-2.h5");
  std::string bytes = read_text(path);
  const float probe[2] = {2.0f + 40.0f / 1024.0f, 2.0f + 41.0f / 1024.0f};
  const size_t at = find_bytes(bytes, std::string(reinterpret_cast<const char*>(probe), 8));
  bytes[at] = static_cast<char>(bytes[at] ^ 0x01);  // one bit of element 40's mantissa
  write_text(path, bytes);
  Mlp mlp;
  CHECK_THROWS_WITH(
      mlp.checkpoint().restore(path),
      Contains(path) && Contains("model_weights/dense/dense/kernel:0") && Contains("checksum"));
  check_falls_back_to_first(dir, "checksum");
}

TEST_CASE("checkpoint hardening: impossible training state is refused and falls back",
          "[cpu][checkpoint]") {
  TempDir dir;
  std::string why;
  SECTION("an infinite weight") {
    write_two(dir, [](Mlp&) {});
    set_in_file(dir.file("ckpt-2.h5"), "model_weights/dense/dense/bias:0", 2, INFINITY);
    why = "model_weights/dense/dense/bias:0: value inf at index 2";
  }
  SECTION("a NaN optimizer slot") {
    write_two(dir, [](Mlp&) {});
    set_in_file(dir.file("ckpt-2.h5"), "optimizer_weights/m/dense/kernel:0", 5, NAN);
    why = "optimizer_weights/m/dense/kernel:0: value nan at index 5";
  }
  SECTION("a negative Adam second moment") {
    write_two(dir, [](Mlp&) {});
    set_in_file(dir.file("ckpt-2.h5"), "optimizer_weights/v/dense_1/kernel:0", 1, -0.5f);
    why = "optimizer_weights/v/dense_1/kernel:0: value -0.5 at index 1";
  }
  SECTION("iteration 2^62") {
    write_two(dir, [](Mlp&) {});
    replace_in_file(dir.file("ckpt-2.h5"), "optimizer_weights/iteration:0",
                    td::Tensor::from_vector(std::vector<int64_t>{int64_t{1} << 62}, td::Shape{}));
    why = "optimizer_weights/iteration:0 is 4611686018427387904";
  }
  SECTION("step_in_epoch -5") {
    write_two(dir, [](Mlp&) {});
    replace_in_file(dir.file("ckpt-2.h5"), "training_state/step_in_epoch",
                    td::Tensor::from_vector(std::vector<int64_t>{-5}, td::Shape{}));
    why = "training_state/step_in_epoch is -5";
  }
  SECTION("a NaN metric count") {
    write_two(dir, [](Mlp&) {});
    replace_in_file(dir.file("ckpt-2.h5"), "training_state/metrics/train_loss/count",
                    td::Tensor::from_vector(std::vector<double>{NAN}, td::Shape{}));
    why = "training_state/metrics/train_loss/count is nan";
  }
  INFO("expected reason: " << why);
  Mlp mlp;
  CHECK_THROWS_WITH(mlp.checkpoint().restore(dir.file("ckpt-2.h5")),
                    Contains(dir.file("ckpt-2.h5")) && Contains(why));
  check_falls_back_to_first(dir, why);
}

TEST_CASE("checkpoint hardening: a shuffle buffer that is not a permutation is refused",
          "[cpu][checkpoint]") {
  TempDir dir;
  std::string buffer_name;
  {
    TrainingRun run(/*replicas=*/1);
    run.train(3);
    td::CheckpointManager manager(run.checkpoint(), dir.str());
    manager.save(1);
    run.train(2);
    manager.save(2);
  }
  const std::string path = dir.file("ckpt-2.h5");
  {
    td::h5::File file = td::h5::File::open_for_update(path);
    const td::h5::Group data = file.root().open_group("training_state/data/train_data");
    for (const std::string& name : data.read_attr_strings("entry_names"))
      if (name.ends_with("shuffle/buffer")) buffer_name = name;
    REQUIRE_FALSE(buffer_name.empty());
    const td::Shape shape = data.dataset_shape(buffer_name);
    REQUIRE(shape.numel() == 64);
    data.remove(buffer_name);
    data.write_tensor(buffer_name, td::Tensor::zeros(shape, td::DType::kInt64));  // all #0
    file.close();
  }
  TrainingRun run(1);
  CHECK_THROWS_WITH(run.checkpoint().restore(path),
                    Contains(path) && Contains("training_state/data/train_data/" + buffer_name) &&
                        Contains("index 0 appears twice"));
  td::CheckpointManager manager(run.checkpoint(), dir.str());
  CaptureStderr quiet;
  CHECK(manager.restore_or_initialize() == dir.file("ckpt-1.h5"));
}

TEST_CASE("checkpoint hardening: files of format 1 without checksums still restore, with a note",
          "[cpu][checkpoint]") {
  const std::string path = fixture("v1_no_checksums.h5");  // written before the checksums
  FixtureModel reader;
  std::string log;
  {
    CaptureStderr capture;
    reader.checkpoint().restore(path);
    log = capture.text();
  }
  CHECK(reader.step == 7);
  const std::vector<td::Variable> weights = reader.model.weights();
  for (size_t i = 0; i < weights.size(); ++i)
    CHECK(values_of(weights[i]) == fixture_values(static_cast<int>(i), weights[i].shape().numel()));
  CHECK_THAT(log, Contains(path) && Contains("no checksums"));

  // A file written now carries them: Fletcher-32 on every dataset with data.
  TempDir dir;
  const std::string fresh = dir.file("ckpt-1.h5");
  reader.checkpoint().write(fresh);
  td::h5::File file = td::h5::File::open(fresh);
  CHECK(file.root().read_attr_string("tandem_checksums") == "fletcher32");
  const td::h5::Group weights_group = file.root().open_group("model_weights/dense/dense");
  CHECK(weights_group.has_checksum("kernel:0"));
  CHECK(weights_group.has_checksum("bias:0"));
  CHECK(file.root().open_group("optimizer_weights").has_checksum("v/dense_1/kernel:0"));
}
