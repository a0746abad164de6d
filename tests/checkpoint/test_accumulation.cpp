// Checkpoints in the middle of gradient accumulation: the file stores micro_step and the SUM over
// replicas of the accumulators; a new process that restores it continues the accumulation and
// ends where the uninterrupted run ends.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "checkpoint_test_util.h"
#include "support/compare.h"

namespace td = tandem;
using namespace tandem::checkpoint_testing;

namespace {

constexpr int kReplicas = 2;
constexpr int kSteps = 4;          // gradient_accumulation_steps
constexpr int64_t kSaveAfter = 6;  // micro-steps: one update, then micro_step 2 of 4
constexpr int64_t kTotal = 16;     // micro-steps of the whole run: four updates
constexpr const char* kChildTest = "checkpoint accumulation: the rest in a new process";

/// max |a - b| / max |a| over the float32 values held in two byte strings.
double relative_difference(const std::string& a, const std::string& b) {
  REQUIRE(a.size() == b.size());
  REQUIRE(a.size() % sizeof(float) == 0);
  std::vector<float> x(a.size() / sizeof(float)), y(b.size() / sizeof(float));
  std::memcpy(x.data(), a.data(), a.size());
  std::memcpy(y.data(), b.data(), b.size());
  return tandem::testing::relative_difference(x, y);
}

}  // namespace

TEST_CASE("checkpoint accumulation: saved at micro_step 2 of 4, resumed in a new process",
          "[cpu][checkpoint][accumulation]") {
  // The reference: every micro-step in one go.
  TrainingRun straight(kReplicas, kSteps);
  straight.train(kTotal);
  REQUIRE(straight.optimizer->iterations() == kTotal / kSteps);
  REQUIRE(straight.optimizer->micro_step() == 0);
  const std::map<std::string, std::string> expected = straight.state();

  TempDir dir;
  std::map<std::string, std::string> at_save;
  {
    TrainingRun first(kReplicas, kSteps);
    first.train(kSaveAfter);
    REQUIRE(first.optimizer->iterations() == 1);
    REQUIRE(first.optimizer->micro_step() == 2);
    at_save = first.state();
    td::CheckpointManager manager(first.checkpoint(), dir.str(), {.max_to_keep = 2});
    REQUIRE(manager.save() == dir.file("ckpt-1.h5"));  // numbered by updates
  }

  // What the file holds: micro_step 2 and, per variable, the sum of both replicas' accumulators.
  {
    const td::h5::File file = td::h5::File::open(dir.file("ckpt-1.h5"));
    const td::h5::Group accumulation = file.root().open_group("training_state/grad_accum");
    CHECK(accumulation.read_tensor("micro_step").item<int64_t>() == 2);
    CHECK(accumulation.read_attr_int64("gradient_accumulation_steps") == kSteps);
    const td::Tensor stored = accumulation.read_tensor("dense/kernel:0");
    const std::vector<float> got = stored.to_vector<float>();
    std::vector<float> sum(got.size(), 0.0f);
    for (int r = 0; r < kReplicas; ++r) {
      const std::string& bytes = at_save.at("grad_accum/dense/kernel@" + std::to_string(r));
      std::vector<float> copy(got.size());
      REQUIRE(bytes.size() == got.size() * sizeof(float));
      std::memcpy(copy.data(), bytes.data(), bytes.size());
      for (size_t i = 0; i < sum.size(); ++i) sum[i] += copy[i];
    }
    CHECK(got == sum);
    // Replica-local accumulators differ (different data); their sum is not replica 0's.
    CHECK(at_save.at("grad_accum/dense/kernel@0") != at_save.at("grad_accum/dense/kernel@1"));
  }

  run_child(kChildTest, {{"TANDEM_CKPT_TEST_DIR", dir.str()}}, dir.file("child.log"));
  const std::map<std::string, std::string> resumed = load_state(dir.file("resumed.state"));

  REQUIRE(resumed.size() == expected.size());
  int compared = 0;
  for (const auto& [name, bytes] : expected) {
    INFO("state entry " << name);
    REQUIRE(resumed.count(name) == 1);
    const bool is_float = name.find('@') != std::string::npos && name.rfind("iteration", 0) != 0;
    if (is_float) {
      const double difference = relative_difference(bytes, resumed.at(name));
      INFO("relative difference " << difference);
      CHECK(difference <= 1e-6);
      ++compared;
    } else {
      CHECK(resumed.at(name) == bytes);  // counters, metrics, data position: exact
    }
  }
  CHECK(compared > 0);
  CHECK(expected.at("micro_step") == "0");
  CHECK(expected.count("m/dense/kernel@1") == 1);
  // Training moved the weights after the save, so agreeing is not trivial.
  CHECK(relative_difference(at_save.at("dense/kernel@0"), expected.at("dense/kernel@0")) > 1e-4);
}

TEST_CASE("checkpoint accumulation: the rest in a new process", "[.child]") {
  const std::string dir = env_or_empty("TANDEM_CKPT_TEST_DIR");
  if (dir.empty()) return;  // only meaningful as the child of the test above
  TrainingRun run(kReplicas, kSteps);
  td::CheckpointManager manager(run.checkpoint(), dir, {.max_to_keep = 2});
  REQUIRE(manager.restore_or_initialize() == dir + "/ckpt-1.h5");
  REQUIRE(run.optimizer->iterations() == 1);
  REQUIRE(run.optimizer->micro_step() == 2);
  run.train(kTotal - kSaveAfter);
  save_state(dir + "/resumed.state", run.state());
}

TEST_CASE("checkpoint accumulation: a mid-accumulation checkpoint refuses another N",
          "[cpu][checkpoint][accumulation]") {
  TempDir dir;
  {
    TrainingRun first(1, kSteps);
    first.train(3);
    REQUIRE(first.optimizer->micro_step() == 3);
    first.checkpoint().write(dir.file("mid.h5"));
    first.train(1);
    REQUIRE(first.optimizer->micro_step() == 0);
    first.checkpoint().write(dir.file("boundary.h5"));
  }
  TrainingRun other(1, 2);
  CHECK_THROWS_WITH(
      other.checkpoint().restore(dir.file("mid.h5")),
      Catch::Contains("micro_step 3 of 4") && Catch::Contains("gradient_accumulation_steps = 4"));
  TrainingRun plain(1);
  CHECK_THROWS_AS(plain.checkpoint().restore(dir.file("mid.h5")), td::CheckpointMismatchError);
  // At an update boundary any N resumes (the accumulators start from zero).
  other.checkpoint().restore(dir.file("boundary.h5"));
  CHECK(other.optimizer->micro_step() == 0);
  CHECK(other.optimizer->iterations() == 1);
  plain.checkpoint().restore(dir.file("boundary.h5"));
  CHECK(plain.optimizer->iterations() == 1);
}
