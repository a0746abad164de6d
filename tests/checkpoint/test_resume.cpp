// Exact resume, bitwise on the CPU with 2 replicas: 2K steps straight == K steps, save, a NEW
// PROCESS restores and runs K more steps — the same weights (every replica copy), optimizer slots
// and iterations, and the same remaining batch sequence.
#include "checkpoint_test_util.h"

namespace td = tandem;
using namespace tandem::checkpoint_testing;

namespace {

constexpr int kReplicas = 2;
constexpr int64_t kHalf = 8;  // an epoch has 11 steps: save mid-epoch, resume across its end
constexpr const char* kChildTest = "checkpoint resume: the second half in a new process";

}  // namespace

TEST_CASE(
    "checkpoint resume: 2K steps straight == K steps + save + new process + restore + K steps",
    "[cpu][checkpoint]") {
  // The reference: 2K steps in one go.
  TrainingRun straight(kReplicas);
  straight.train(2 * kHalf);
  const std::map<std::string, std::string> expected = straight.state();
  const std::vector<uint64_t> expected_batches(straight.batch_hashes.begin() + kHalf * kReplicas,
                                               straight.batch_hashes.end());

  // K steps and a checkpoint.
  TempDir dir;
  {
    TrainingRun first(kReplicas);
    first.train(kHalf);
    td::CheckpointManager manager(first.checkpoint(), dir.str(), {.max_to_keep = 2});
    const std::optional<std::string> saved = manager.save();
    REQUIRE(saved == dir.file("ckpt-8.h5"));
  }

  // The rest in a new process (this binary, re-executed on the hidden test case below).
  run_child(kChildTest, {{"TANDEM_CKPT_TEST_DIR", dir.str()}}, dir.file("child.log"));
  const std::map<std::string, std::string> resumed = load_state(dir.file("resumed.state"));
  const std::string batches_text = read_text(dir.file("resumed.batches"));

  REQUIRE(resumed.size() == expected.size());
  for (const auto& [name, bytes] : expected) {
    INFO("state entry " << name);
    REQUIRE(resumed.count(name) == 1);
    CHECK(resumed.at(name) == bytes);  // bitwise
  }
  std::ostringstream expected_text;
  for (uint64_t h : expected_batches) expected_text << h << "\n";
  CHECK(batches_text == expected_text.str());
  // The comparison covered both replicas' copies, optimizer slots and the step counter.
  CHECK(expected.count("dense/kernel@1") == 1);
  CHECK(expected.count("m/dense/kernel@1") == 1);
  CHECK(expected.count("iteration@1") == 1);
}

TEST_CASE("checkpoint resume: Lion's slot and decay continue bitwise after a restore",
          "[cpu][checkpoint]") {
  TrainingRun straight(kReplicas, 1, TrainingRun::Rule::kLion);
  straight.train(2 * kHalf);
  const std::map<std::string, std::string> expected = straight.state();

  TempDir dir;
  {
    TrainingRun first(kReplicas, 1, TrainingRun::Rule::kLion);
    first.train(kHalf);
    td::CheckpointManager manager(first.checkpoint(), dir.str(), {.max_to_keep = 2});
    REQUIRE(manager.save() == dir.file("ckpt-8.h5"));
  }
  TrainingRun second(kReplicas, 1, TrainingRun::Rule::kLion);
  second.checkpoint().restore(dir.file("ckpt-8.h5"));
  CHECK(second.optimizer->iterations() == kHalf);
  second.train(kHalf);
  const std::map<std::string, std::string> resumed = second.state();
  REQUIRE(resumed.size() == expected.size());
  for (const auto& [name, bytes] : expected) {
    INFO("state entry " << name);
    REQUIRE(resumed.count(name) == 1);
    CHECK(resumed.at(name) == bytes);  // bitwise
  }
  CHECK(expected.count("m/dense/kernel@1") == 1);  // Lion's one slot, on both replicas
  CHECK(expected.count("v/dense/kernel@1") == 0);
}

TEST_CASE("checkpoint resume: the second half in a new process", "[.child]") {
  const std::string dir = env_or_empty("TANDEM_CKPT_TEST_DIR");
  if (dir.empty()) return;  // only meaningful as the child of the test above
  TrainingRun run(kReplicas);
  td::CheckpointManager manager(run.checkpoint(), dir, {.max_to_keep = 2});
  const std::optional<std::string> restored = manager.restore_or_initialize();
  REQUIRE(restored == dir + "/ckpt-8.h5");
  REQUIRE(run.optimizer->iterations() == kHalf);
  run.train(kHalf);
  save_state(dir + "/resumed.state", run.state());
  std::ostringstream batches;
  for (uint64_t h : run.batch_hashes) batches << h << "\n";
  write_text(dir + "/resumed.batches", batches.str());
}
