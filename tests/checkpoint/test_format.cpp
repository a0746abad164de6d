// The file layout of docs/checkpoint-format.md, read back through the HDF5 wrapper: root
// attributes, the Keras /model_weights, /optimizer_weights, /training_state; `tandem-ckpt`
// inspect, verify and latest.
#include "checkpoint_test_util.h"

namespace td = tandem;
using namespace tandem::checkpoint_testing;
using Catch::Matchers::Contains;

namespace {

int64_t scalar(const td::h5::Group& group, const std::string& name) {
  return group.read_tensor(name).to_vector<int64_t>()[0];
}

/// Runs `command`, its stdout and stderr into `output`; returns the exit status.
int run_command(const std::string& command, std::string& output, const std::string& scratch) {
  const int status = std::system((command + " >" + scratch + " 2>&1").c_str());
  output = read_text(scratch);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

/// True when `text` has the shape of `pattern`: 'd' stands for a digit, anything else for itself.
bool matches_digits_pattern(const std::string& text, const std::string& pattern) {
  if (text.size() != pattern.size()) return false;
  for (size_t i = 0; i < text.size(); ++i) {
    const bool ok = pattern[i] == 'd' ? (text[i] >= '0' && text[i] <= '9') : text[i] == pattern[i];
    if (!ok) return false;
  }
  return true;
}

}  // namespace

TEST_CASE("checkpoint format: the layout of docs/checkpoint-format.md", "[cpu][checkpoint]") {
  TempDir dir;
  TrainingRun run(/*replicas=*/2);
  run.train(5);
  td::CheckpointManager manager(run.checkpoint(), dir.str());
  const std::string path = *manager.save();
  REQUIRE(path == dir.file("ckpt-5.h5"));

  td::h5::File file = td::h5::File::open(path);
  const td::h5::Group& root = file.root();
  SECTION("root attributes; no layer_names at the root") {
    CHECK(root.read_attr_string("tandem_format") == "tandem.checkpoint");
    CHECK(root.read_attr_int64("tandem_format_version") == 1);
    CHECK(root.read_attr_string("tandem_version") == td::build_info().version);
    CHECK(matches_digits_pattern(root.read_attr_string("created_utc"), "dddd-dd-ddTdd:dd:ddZ"));
    CHECK(root.read_attr_int64("num_workers") == 1);
    CHECK(root.read_attr_int64("num_replicas") == 2);
    CHECK(root.read_attr_string("backend") == "cpu");
    CHECK(root.read_attr_string("model_signature") == run.checkpoint().model_signature());
    const std::string signature = root.read_attr_string("model_signature");
    CHECK(signature.size() == 16);
    CHECK(signature.find_first_not_of("0123456789abcdef") == std::string::npos);
    CHECK_FALSE(root.has_attr("layer_names"));
  }
  SECTION("/model_weights in the Keras legacy layout") {
    const td::h5::Group weights = root.open_group("model_weights");
    CHECK(weights.read_attr_strings("layer_names") ==
          std::vector<std::string>{"dense", "dropout", "dense_1"});
    CHECK(weights.read_attr_string("backend") == "tensorflow");
    CHECK(weights.read_attr_string("keras_version") == "2.15.0");
    const td::h5::Group dense = weights.open_group("dense");
    CHECK(dense.read_attr_strings("weight_names") ==
          std::vector<std::string>{"dense/kernel:0", "dense/bias:0"});
    CHECK(weights.open_group("dropout").read_attr_strings("weight_names").empty());
    CHECK(weights.dataset_type_name("dense/dense/kernel:0") == "float32");
    CHECK(weights.dataset_shape("dense/dense/kernel:0") == td::Shape({8, 16}));
    CHECK(weights.dataset_shape("dense_1/dense_1/bias:0") == td::Shape({4}));
    // Replica 0's values, bit for bit.
    CHECK(weights.read_tensor("dense/dense/kernel:0").to_vector<float>() ==
          run.model->weights()[0].copy(0).to_vector<float>());
  }
  SECTION("/optimizer_weights") {
    const td::h5::Group optimizer = root.open_group("optimizer_weights");
    CHECK(optimizer.read_attr_string("optimizer") == "adam");
    CHECK_THAT(optimizer.read_attr_string("config_json"), Contains("\"learning_rate\""));
    CHECK(optimizer.read_attr_strings("weight_names") ==
          std::vector<std::string>{"iteration:0", "m/dense/kernel:0", "v/dense/kernel:0",
                                   "m/dense/bias:0", "v/dense/bias:0", "m/dense_1/kernel:0",
                                   "v/dense_1/kernel:0", "m/dense_1/bias:0", "v/dense_1/bias:0"});
    CHECK(optimizer.dataset_type_name("iteration:0") == "int64");
    CHECK(optimizer.dataset_shape("iteration:0").rank() == 0);
    CHECK(scalar(optimizer, "iteration:0") == 5);
    CHECK(optimizer.dataset_shape("m/dense/kernel:0") == td::Shape({8, 16}));
    CHECK(optimizer.read_tensor("v/dense_1/bias:0").to_vector<float>() ==
          run.optimizer->slot(run.model->trainable_variables()[3], "v").copy(0).to_vector<float>());
  }
  SECTION("/training_state") {
    const td::h5::Group state = root.open_group("training_state");
    CHECK(scalar(state, "global_step") == 5);
    CHECK(scalar(state, "epoch") == 0);
    CHECK(scalar(state, "step_in_epoch") == 5);
    CHECK(scalar(state, "samples_seen") == 0);
    for (const char* name : {"global_step", "epoch", "step_in_epoch", "samples_seen"})
      CHECK(state.dataset_type_name(name) == "int64");
    const td::h5::Group data = state.open_group("data/train_data");
    CHECK(data.read_attr_string("kind") == "distributed_dataset");
    CHECK(data.read_attr_int64("num_replicas") == 2);
    const td::data::IteratorState saved = run.data.save();
    std::vector<std::string> names;
    for (const auto& [name, values] : saved.entries()) {
      names.push_back(name);
      CHECK(data.read_tensor(name).to_vector<int64_t>() == values);
    }
    CHECK(data.read_attr_strings("entry_names") == names);
    CHECK(state.dataset_type_name("rng/replica_state") == "uint64");
    CHECK(state.dataset_shape("rng/replica_state") == td::Shape({2, 4}));
    CHECK(state.read_attr_string_of("rng/replica_state", "algorithm") == "philox4x32-10");
    const std::vector<uint64_t> rng = state.read_u64("rng/replica_state");
    const auto streams = run.model->generators().states();
    CHECK(rng == std::vector<uint64_t>{streams[0][0], streams[0][1], streams[0][2], 0,
                                       streams[1][0], streams[1][1], streams[1][2], 0});
    CHECK(state.read_tensor("metrics/train_accuracy/count").to_vector<double>()[0] ==
          5 * TrainingRun::kGlobalBatch);
    CHECK(scalar(state, "grad_accum/micro_step") == 0);
  }
}

TEST_CASE("checkpoint format: tandem-ckpt inspect, verify and latest", "[cpu][checkpoint]") {
  TempDir dir;
  TrainingRun run(/*replicas=*/2);
  run.train(3);
  td::CheckpointManager manager(run.checkpoint(), dir.str());
  const std::string path = *manager.save();

  const std::string text = td::inspect_checkpoint(path);
  CHECK_THAT(text, Contains("tandem.checkpoint version 1") && Contains("step            3") &&
                       Contains("dense/kernel:0") && Contains("float32 [8, 16]") &&
                       Contains("(no weights)") && Contains("optimizer adam, iterations 3") &&
                       Contains("m/dense_1/bias:0") && Contains("global_step 3") &&
                       Contains("data/train_data") && Contains("uint64 [2, 4] philox4x32-10") &&
                       Contains("metrics/train_accuracy") && Contains("grad_accum/micro_step"));
#ifdef TANDEM_CKPT_TOOL
  const std::string tool = TANDEM_CKPT_TOOL;
  if (!fs::exists(tool)) {
    WARN("tandem-ckpt was not built (" << tool << "); skipping the command-line checks");
    return;
  }
  const std::string scratch = dir.file("tool.out");
  std::string output;
  CHECK(run_command(tool + " inspect " + path, output, scratch) == 0);
  CHECK(output == text);
  CHECK(run_command(tool + " latest " + dir.str(), output, scratch) == 0);
  CHECK(output == path + "\n");
  CHECK(run_command(tool + " verify " + path, output, scratch) == 0);
  CHECK(output == path + ": ok (every dataset read back and checked)\n");
  // A crafted one: a kernel stored in /dev/zero (tests/checkpoint/test_crafted.cpp has more).
  const std::string crafted =
      (fs::path(TANDEM_SOURCE_DIR) / "tests/checkpoint/fixtures/crafted/external_storage_zero.h5")
          .string();
  CHECK(run_command(tool + " verify " + crafted, output, scratch) == 1);
  CHECK_THAT(output, Contains("tandem-ckpt: " + crafted) &&
                         Contains("kernel:0: its data is stored in 1 external file(s)"));

  const std::string garbage = dir.file("garbage.h5");
  fill_with_random_bytes(garbage, 1000, 3);
  CHECK(run_command(tool + " inspect " + garbage, output, scratch) == 1);
  CHECK_THAT(output, Contains(garbage) && Contains("not an HDF5 file"));
  TempDir empty;
  CHECK(run_command(tool + " latest " + empty.str(), output, scratch) == 1);
  CHECK_THAT(output, Contains("no complete checkpoint in " + empty.str()));
  CHECK(run_command(tool + " frobnicate x", output, scratch) == 2);
  CHECK(run_command(tool, output, scratch) == 2);
  CHECK_THAT(output, Contains("usage: tandem-ckpt inspect FILE"));
#else
  WARN("TANDEM_CKPT_TOOL is not defined; skipping the command-line checks");
#endif
}
