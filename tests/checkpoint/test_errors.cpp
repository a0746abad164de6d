// Bad checkpoints get the documented errors: random bytes, a truncated file, a newer format
// version, another model (a variable missing, a shape differs), another optimizer; a damaged
// newest checkpoint makes restore_or_initialize fall back to the previous one and log it.
#include "checkpoint_test_util.h"

namespace td = tandem;
using namespace tandem::checkpoint_testing;
using Catch::Matchers::Contains;

namespace {

/// An MLP on 8 features: Dense(hidden), Dense(4), and optionally a third Dense(3).
struct Mlp {
  explicit Mlp(int64_t hidden = 16, bool third_layer = false) {
    model.add(td::nn::Dense(hidden, td::nn::Activation::kRelu));
    model.add(td::nn::Dense(4));
    if (third_layer) model.add(td::nn::Dense(3));
    model.set_seed(5);
    model.build({8});
    optimizer.build(model.trainable_variables());
  }
  td::Checkpoint checkpoint() {
    return td::Checkpoint({{"model", &model}, {"optimizer", &optimizer}});
  }
  td::nn::Sequential model;
  td::optim::Adam optimizer;
};

std::string write_checkpoint(const TempDir& dir, const std::string& name) {
  Mlp mlp;
  const std::string path = dir.file(name);
  mlp.checkpoint().write(path);
  return path;
}

std::vector<float> values_of(const td::Variable& v) { return v.copy(0).to_vector<float>(); }

/// How often `what` occurs in `text`.
size_t count_of(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

}  // namespace

TEST_CASE("checkpoint errors: random bytes and a truncated file name the file",
          "[cpu][checkpoint]") {
  TempDir dir;
  Mlp mlp;
  const std::vector<float> before = values_of(mlp.model.weights()[0]);

  const std::string garbage = dir.file("ckpt-5.h5");
  fill_with_random_bytes(garbage, 4096, /*seed=*/1);
  CHECK_THROWS_WITH(mlp.checkpoint().restore(garbage),
                    Contains(garbage) && Contains("not an HDF5 file"));

  const std::string truncated = write_checkpoint(dir, "ckpt-6.h5");
  truncate_to_half(truncated);
  CHECK_THROWS_WITH(mlp.checkpoint().restore(truncated),
                    Contains(truncated) && Contains("truncated"));

  CHECK_THROWS_WITH(mlp.checkpoint().restore(dir.file("ckpt-404.h5")),
                    Contains(dir.file("ckpt-404.h5")) && Contains("missing"));
  CHECK(values_of(mlp.model.weights()[0]) == before);  // a failed restore changes nothing
}

TEST_CASE("checkpoint errors: a newer format version is refused naming both versions",
          "[cpu][checkpoint]") {
  TempDir dir;
  const std::string path = write_checkpoint(dir, "ckpt-1.h5");
  {
    td::h5::File file = td::h5::File::open_for_update(path);
    file.root().remove_attr("tandem_format_version");
    file.root().write_attr("tandem_format_version", int64_t{2});
    file.close();
  }
  Mlp mlp;
  CHECK_THROWS_AS(mlp.checkpoint().restore(path), td::CheckpointMismatchError);
  CHECK_THROWS_WITH(mlp.checkpoint().restore(path),
                    Contains(path) && Contains("format version 2") && Contains("up to 1"));
}

TEST_CASE("checkpoint errors: another model names the first variable that differs and both shapes",
          "[cpu][checkpoint]") {
  TempDir dir;
  const std::string path = write_checkpoint(dir, "ckpt-1.h5");  // Dense(16), Dense(4) on 8 inputs

  SECTION("a variable is missing from the file") {
    Mlp bigger(16, /*third_layer=*/true);
    CHECK_THROWS_AS(bigger.checkpoint().restore(path), td::CheckpointMismatchError);
    CHECK_THROWS_WITH(bigger.checkpoint().restore(path),
                      Contains(path) && Contains("\"dense_2/kernel\"") && Contains("[4, 3]") &&
                          Contains("missing from the file"));
  }
  SECTION("a shape differs") {
    Mlp wider(32);
    const std::vector<float> before = values_of(wider.model.weights()[0]);
    CHECK_THROWS_AS(wider.checkpoint().restore(path), td::CheckpointMismatchError);
    CHECK_THROWS_WITH(wider.checkpoint().restore(path),
                      Contains(path) && Contains("\"dense/kernel\"") && Contains("[8, 16]") &&
                          Contains("[8, 32]"));
    CHECK(values_of(wider.model.weights()[0]) == before);
  }
  SECTION("the file has a variable the model lacks") {
    const std::string three = dir.file("ckpt-2.h5");
    Mlp(16, /*third_layer=*/true).checkpoint().write(three);
    Mlp smaller;
    CHECK_THROWS_WITH(smaller.checkpoint().restore(three),
                      Contains(three) && Contains("\"dense_2/kernel\"") && Contains("lacks"));
  }
  SECTION("another optimizer") {
    td::nn::Sequential model({td::nn::Dense(16, td::nn::Activation::kRelu), td::nn::Dense(4)});
    model.build({8});
    td::optim::SGD sgd;
    td::Checkpoint checkpoint({{"model", &model}, {"optimizer", &sgd}});
    CHECK_THROWS_WITH(checkpoint.restore(path),
                      Contains(path) && Contains("\"adam\"") && Contains("\"sgd\""));
  }
  SECTION("not a Tandem checkpoint, and a checkpoint without a group it needs") {
    const std::string foreign = dir.file("foreign.h5");
    {
      td::h5::File file = td::h5::File::create(foreign);
      file.root().create_group("model_weights");
      file.close();
    }
    Mlp mlp;
    CHECK_THROWS_WITH(mlp.checkpoint().restore(foreign),
                      Contains(foreign) && Contains("not a Tandem checkpoint"));
    const std::string model_only = dir.file("model_only.h5");
    Mlp writer;
    td::Checkpoint({{"model", &writer.model}}).write(model_only);
    CHECK_THROWS_WITH(
        mlp.checkpoint().restore(model_only),
        Contains(model_only) && Contains("holds no optimizer state (no /optimizer_weights)"));
  }
}

TEST_CASE(
    "checkpoint errors: a damaged newest checkpoint falls back to the previous one and logs it",
    "[cpu][checkpoint]") {
  TempDir dir;
  std::map<int64_t, std::vector<float>> kernels;  // step -> the first kernel at that step
  {
    Mlp mlp;
    int64_t step = 0;
    td::Checkpoint checkpoint(
        {{"model", &mlp.model}, {"optimizer", &mlp.optimizer}, {"global_step", &step}});
    td::CheckpointManager manager(checkpoint, dir.str(), {.max_to_keep = 3});
    for (step = 1; step <= 3; ++step) {
      fill_model(mlp.model, static_cast<float>(step));
      kernels[step] = values_of(mlp.model.weights()[0]);
      manager.save();
    }
  }

  SECTION("truncated newest") { truncate_to_half(dir.file("ckpt-3.h5")); }
  SECTION("newest replaced by random bytes") {
    fill_with_random_bytes(dir.file("ckpt-3.h5"), 10000, /*seed=*/7);
  }
  Mlp mlp;
  int64_t step = 0;
  td::Checkpoint checkpoint(
      {{"model", &mlp.model}, {"optimizer", &mlp.optimizer}, {"global_step", &step}});
  td::CheckpointManager manager(checkpoint, dir.str(), {.max_to_keep = 3});
  std::optional<std::string> restored;
  std::string log;
  {
    CaptureStderr capture;
    restored = manager.restore_or_initialize();
    log = capture.text();
  }
  INFO("log:\n" << log);
  CHECK(restored == dir.file("ckpt-2.h5"));
  CHECK(step == 2);
  CHECK(values_of(mlp.model.weights()[0]) == kernels[2]);
  CHECK_THAT(log, Contains("restored " + dir.file("ckpt-2.h5") + ", the newest checkpoint in") &&
                      Contains("newer ones could not:\n  cannot restore " + dir.file("ckpt-3.h5")));
  // One message: the damaged file is named once, in the warning of the restore that passed it.
  CHECK(count_of(log, "cannot restore") == 1);
  CHECK(count_of(log, "[warning]") == 1);
  CHECK(td::latest_checkpoint(dir.str()) == dir.file("ckpt-2.h5"));
  // The next save at step 3 replaces the damaged file.
  step = 3;
  const std::optional<std::string> saved = manager.save();
  REQUIRE(saved == dir.file("ckpt-3.h5"));
  Mlp reader;
  CHECK_NOTHROW(reader.checkpoint().restore(*saved));
  CHECK(parse_state_file(dir.str()).second ==
        std::vector<std::string>{"ckpt-1.h5", "ckpt-2.h5", "ckpt-3.h5"});
}

TEST_CASE("checkpoint errors: without a state file the newest complete checkpoint is used",
          "[cpu][checkpoint]") {
  TempDir dir;
  {
    Mlp mlp;
    td::CheckpointManager manager(mlp.checkpoint(), dir.str());
    manager.save(10);
    manager.save(20);
  }
  fs::remove(dir.file("checkpoint"));
  Mlp mlp;
  td::CheckpointManager manager(mlp.checkpoint(), dir.str());
  std::string log;
  std::optional<std::string> restored;
  {
    CaptureStderr capture;
    restored = manager.restore_or_initialize();
    log = capture.text();
  }
  CHECK(restored == dir.file("ckpt-20.h5"));
  CHECK_THAT(log, Contains("no state file") && Contains("restored " + dir.file("ckpt-20.h5")));
}

TEST_CASE("checkpoint errors: restore_or_initialize does not fall back past another model",
          "[cpu][checkpoint]") {
  TempDir dir;
  {
    Mlp mlp;
    td::CheckpointManager manager(mlp.checkpoint(), dir.str());
    manager.save(1);
  }
  Mlp wider(32);
  td::CheckpointManager manager(wider.checkpoint(), dir.str());
  {
    // One message: the error. No warning before it repeats its text or promises a fallback
    // that does not exist.
    CaptureStderr capture;
    CHECK_THROWS_AS(manager.restore_or_initialize(), td::CheckpointMismatchError);
    const std::string log = capture.text();
    INFO("log:\n" << log);
    CHECK(log.find("[warning]") == std::string::npos);
    CHECK(log.find("falling back") == std::string::npos);
  }

  TempDir empty;
  td::CheckpointManager fresh(wider.checkpoint(), empty.str());
  CHECK(fresh.restore_or_initialize() == std::nullopt);

  // Every checkpoint damaged: an error listing them, not a silent fresh start.
  TempDir broken;
  {
    td::CheckpointManager manager_b(wider.checkpoint(), broken.str());
    manager_b.save(1);
    manager_b.save(2);
  }
  truncate_to_half(broken.file("ckpt-1.h5"));
  truncate_to_half(broken.file("ckpt-2.h5"));
  td::CheckpointManager all_broken(wider.checkpoint(), broken.str());
  CaptureStderr capture;
  CHECK_THROWS_WITH(all_broken.restore_or_initialize(),
                    Contains("no checkpoint in " + broken.str() + " can be restored") &&
                        Contains(broken.file("ckpt-1.h5")) && Contains(broken.file("ckpt-2.h5")));
  CHECK(capture.text().find("[warning]") == std::string::npos);
}

TEST_CASE("checkpoint errors: bad Checkpoint arguments", "[cpu][checkpoint]") {
  Mlp a, b;
  td::nn::Sequential* null_model = nullptr;
  CHECK_THROWS_WITH(td::Checkpoint({{"model", &a.model}, {"other", &b.model}}),
                    Contains("second model"));
  CHECK_THROWS_WITH(td::Checkpoint({{"model", &a.model}, {"model", &a.optimizer}}),
                    Contains("used twice"));
  CHECK_THROWS_WITH(td::Checkpoint({{"model", null_model}}), Contains("null model"));
  td::nn::Sequential unbuilt({td::nn::Dense(2)});
  TempDir dir;
  CHECK_THROWS_WITH(td::Checkpoint({{"model", &unbuilt}}).write(dir.file("x.h5")),
                    Contains("not built"));
  CHECK_FALSE(fs::exists(dir.file("x.h5")));
  CHECK_FALSE(has_temp_files(dir.str()));
}
