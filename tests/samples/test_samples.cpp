// Smoke tests of the built sample programs: fashion_mnist_mlp trains a few steps on 2 replicas,
// writes its --metrics-json line and a checkpoint, resumes from it; --help names every flag; a
// bad flag value exits 2 naming the flag and the value. (Building the tests builds the sample:
// see the add_dependencies at the end of the top-level CMakeLists.txt.)
#include <sys/wait.h>

#include <catch2/catch.hpp>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "samples/run_program.h"
#include "support/hdf5_datasets.h"
#include "tandem/core/build_info.h"
#include "tandem/tandem.h"

namespace fs = std::filesystem;

namespace {

const std::string kMlp =
    std::string(TANDEM_BINARY_DIR) + "/samples/fashion_mnist_mlp/fashion_mnist_mlp";
const std::string kCnn =
    std::string(TANDEM_BINARY_DIR) + "/samples/fashion_mnist_cnn/fashion_mnist_cnn";
const std::string kResnet =
    std::string(TANDEM_BINARY_DIR) + "/samples/fashion_mnist_resnet/fashion_mnist_resnet";
const std::string kApiTour = std::string(TANDEM_BINARY_DIR) + "/samples/api_tour/api_tour";

using tandem::testing::Result;
using tandem::testing::run;

/// A fresh directory under the system's temporary directory, removed at scope exit.
struct TempDir {
  TempDir() {
    std::string pattern = (fs::temp_directory_path() / "tandem_samples_XXXXXX").string();
    REQUIRE(mkdtemp(pattern.data()) != nullptr);
    path = pattern;
  }
  ~TempDir() {
    std::error_code ignored;
    fs::remove_all(path, ignored);
  }
  fs::path path;
};

/// Parses one flat JSON object whose values are numbers ({"a": 1, "b": 0.5}); fails the test on
/// anything else.
std::map<std::string, double> parse_json_object(const std::string& text) {
  std::map<std::string, double> out;
  size_t i = 0;
  auto skip_space = [&] {
    while (i < text.size() && std::isspace(static_cast<unsigned char>(text[i]))) ++i;
  };
  auto expect = [&](char c) {
    skip_space();
    INFO("JSON: " << text << " (at offset " << i << ")");
    REQUIRE(i < text.size());
    REQUIRE(text[i] == c);
    ++i;
  };
  expect('{');
  skip_space();
  if (i < text.size() && text[i] == '}') return out;
  while (true) {
    expect('"');
    const size_t end = text.find('"', i);
    REQUIRE(end != std::string::npos);
    const std::string key = text.substr(i, end - i);
    i = end + 1;
    expect(':');
    skip_space();
    const char* begin = text.c_str() + i;
    char* stop = nullptr;
    const double value = std::strtod(begin, &stop);
    INFO("JSON: " << text << " (value of \"" << key << "\")");
    REQUIRE(stop != begin);
    i += static_cast<size_t>(stop - begin);
    REQUIRE(out.emplace(key, value).second);
    skip_space();
    REQUIRE(i < text.size());
    if (text[i] == '}') break;
    expect(',');
  }
  ++i;
  skip_space();
  REQUIRE(i == text.size());
  return out;
}

std::vector<std::string> read_lines(const fs::path& path) {
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) {
    if (!line.empty()) lines.push_back(line);
  }
  return lines;
}

/// False (with a warning) when the sample was not built (TANDEM_BUILD_SAMPLES=OFF).
bool sample_built() {
  if (fs::exists(kMlp)) return true;
  WARN("skipped: " << kMlp << " was not built (configure with -DTANDEM_BUILD_SAMPLES=ON)");
  return false;
}

}  // namespace

TEST_CASE("fashion_mnist_mlp trains 30 steps on 2 replicas, reports them and resumes",
          "[cpu][samples]") {
  if (!sample_built()) return;
  TempDir dir;
  const fs::path metrics = dir.path / "m.json";
  const std::string common_flags = " --max-steps 30 --checkpoint-dir '" + dir.path.string() +
                                   "' --metrics-json '" + metrics.string() + "' --replicas 2";

  const Result first = run(kMlp + " --epochs 1 --fresh" + common_flags);
  INFO(first.output);
  REQUIRE(first.exit_code == 0);
  CHECK(first.output.find("2 replicas (cpu:0, cpu:1") != std::string::npos);
  CHECK(first.output.find("final test accuracy: ") != std::string::npos);

  std::vector<std::string> lines = read_lines(metrics);
  REQUIRE(lines.size() == 1);
  std::map<std::string, double> epoch1 = parse_json_object(lines[0]);
  for (const char* key :
       {"epoch", "loss", "train_accuracy", "test_accuracy", "samples_per_sec", "replicas"}) {
    INFO("key " << key << " in " << lines[0]);
    CHECK(epoch1.count(key) == 1);
  }
  CHECK(epoch1["epoch"] == 1);
  CHECK(epoch1["replicas"] == 2);
  CHECK(epoch1["test_accuracy"] > 0.3);  // chance is 0.1
  CHECK(epoch1["test_accuracy"] <= 1.0);
  CHECK(epoch1["train_accuracy"] > 0.1);
  CHECK(std::isfinite(epoch1["loss"]));
  CHECK(epoch1["loss"] > 0.0);
  CHECK(epoch1["samples_per_sec"] > 0.0);
  // One checkpoint, numbered by the optimizer's 30 updates.
  CHECK(fs::exists(dir.path / "ckpt-30.h5"));
  CHECK(fs::exists(dir.path / "checkpoint"));

  // Without --fresh the next run resumes after epoch 1 and trains only epoch 2.
  const Result second = run(kMlp + " --epochs 2" + common_flags);
  INFO(second.output);
  REQUIRE(second.exit_code == 0);
  CHECK(second.output.find("resumed from ") != std::string::npos);
  lines = read_lines(metrics);
  REQUIRE(lines.size() == 2);
  std::map<std::string, double> epoch2 = parse_json_object(lines[1]);
  CHECK(epoch2["epoch"] == 2);
  CHECK(epoch2["test_accuracy"] > 0.3);
  CHECK(fs::exists(dir.path / "ckpt-60.h5"));
}

TEST_CASE(
    "fashion_mnist_mlp --accumulation-steps 4: effective batch, updates, mid-accumulation "
    "resume",
    "[cpu][samples][accumulation]") {
  if (!sample_built()) return;
  TempDir dir;
  // 10 steps per epoch with N = 4: epoch 1 ends at micro-step 2 of the third update.
  const std::string common_flags =
      " --accumulation-steps 4 --per-replica-batch 32 --replicas 2"
      " --checkpoint-dir '" +
      dir.path.string() + "'";
  const Result first = run(kMlp + " --epochs 1 --max-steps 10 --fresh" + common_flags);
  INFO(first.output);
  REQUIRE(first.exit_code == 0);
  CHECK(first.output.find("effective batch 256 = 2 x 32 x 4") != std::string::npos);
  // Checkpoints are numbered by updates: 2 after 10 micro-steps (8 of them made 2 updates).
  CHECK(fs::exists(dir.path / "ckpt-2.h5"));
  const Result second = run(kMlp + " --epochs 2 --max-steps 9" + common_flags);
  INFO(second.output);
  REQUIRE(second.exit_code == 0);
  CHECK(second.output.find("resumed from ") != std::string::npos);
  // 19 micro-steps in all = 4 updates and 3 micro-steps: the resumed run finished the open
  // accumulation (2 + 2 micro-steps) and made two more updates.
  CHECK(fs::exists(dir.path / "ckpt-4.h5"));
  // Another N cannot continue a checkpoint taken in the middle of an accumulation.
  const Result other = run(kMlp +
                           " --epochs 3 --max-steps 9 --accumulation-steps 3 --replicas 2"
                           " --per-replica-batch 32 --checkpoint-dir '" +
                           dir.path.string() + "'");
  INFO(other.output);
  CHECK(other.exit_code != 0);
  CHECK(other.output.find("gradient_accumulation_steps = 4") != std::string::npos);
}

TEST_CASE("fashion_mnist_mlp under mpirun -np 2: one report, the chief alone writes, it resumes",
          "[cpu][samples][mpi]") {
  if (!sample_built()) return;
  if (!tandem::build_info().mpi) {
    WARN("skipped: this build has no MPI");
    return;
  }
  TempDir dir;
  const fs::path metrics = dir.path / "m.json";
  const std::string mpirun =
      "env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 "
      "OMPI_MCA_rmaps_base_oversubscribe=1 OMP_NUM_THREADS=1 mpirun -np 2 ";
  const std::string common_flags = " --max-steps 40 --checkpoint-dir '" + dir.path.string() +
                                   "' --metrics-json '" + metrics.string() + "'";
  const Result first = run(mpirun + kMlp + " --epochs 1 --fresh" + common_flags);
  INFO(first.output);
  REQUIRE(first.exit_code == 0);
  // Two workers of one CPU replica each: 2 replicas in sync, this worker's device cpu:0.
  CHECK(first.output.find("fashion_mnist_mlp: 2 replicas (cpu:0;") != std::string::npos);
  // One report: the chief prints, the other worker is silent.
  size_t finals = 0;
  for (size_t at = first.output.find("final test accuracy"); at != std::string::npos;
       at = first.output.find("final test accuracy", at + 1))
    ++finals;
  CHECK(finals == 1);
  CHECK(read_lines(metrics).size() == 1);
  CHECK(fs::exists(dir.path / "ckpt-40.h5"));
  const Result second = run(mpirun + kMlp + " --epochs 2" + common_flags);
  INFO(second.output);
  REQUIRE(second.exit_code == 0);
  CHECK(second.output.find("resumed from ") != std::string::npos);
  CHECK(read_lines(metrics).size() == 2);
  CHECK(fs::exists(dir.path / "ckpt-80.h5"));
  const std::map<std::string, double> epoch2 = parse_json_object(read_lines(metrics)[1]);
  CHECK(epoch2.at("replicas") == 2);
  CHECK(epoch2.at("test_accuracy") > 0.5);
}

TEST_CASE(
    "fashion_mnist_mlp --precision mixed_bfloat16 --gradient-compression bfloat16 trains on 2 "
    "replicas and resumes from its "
    "float32 checkpoint",
    "[cpu][samples]") {
  if (!sample_built()) return;
  TempDir dir;
  const fs::path metrics = dir.path / "m.json";
  const std::string common_flags = " --max-steps 40 --replicas 2 --precision mixed_bfloat16" +
                                   std::string(" --gradient-compression bfloat16") +
                                   std::string(" --checkpoint-dir '") + dir.path.string() +
                                   "' --metrics-json '" + metrics.string() + "'";
  const Result first = run(kMlp + " --epochs 1 --fresh" + common_flags);
  INFO(first.output);
  REQUIRE(first.exit_code == 0);
  CHECK(first.output.find("precision mixed_bfloat16: float32 variables, bfloat16 computation") !=
        std::string::npos);
  CHECK(first.output.find("gradients travel between replicas as bfloat16") != std::string::npos);
  std::map<std::string, double> epoch1 = parse_json_object(read_lines(metrics).at(0));
  CHECK(epoch1["test_accuracy"] > 0.5);  // 40 steps of 128 examples; chance is 0.1
  CHECK(std::isfinite(epoch1["loss"]));
  CHECK(fs::exists(dir.path / "ckpt-40.h5"));
  // The checkpoint holds the float32 masters: the next run resumes from it.
  const Result second = run(kMlp + " --epochs 2" + common_flags);
  INFO(second.output);
  REQUIRE(second.exit_code == 0);
  CHECK(second.output.find("resumed from ") != std::string::npos);
  CHECK(fs::exists(dir.path / "ckpt-80.h5"));
}

TEST_CASE("fashion_mnist_mlp --precision mixed_float16 scales the loss and reports the scale",
          "[cpu][samples]") {
  if (!sample_built()) return;
  TempDir dir;
  const fs::path metrics = dir.path / "m.json";
  const Result run_result =
      run(kMlp + " --epochs 1 --max-steps 20 --fresh --precision mixed_float16 --checkpoint-dir '" +
          dir.path.string() + "' --metrics-json '" + metrics.string() + "'");
  INFO(run_result.output);
  REQUIRE(run_result.exit_code == 0);
  CHECK(run_result.output.find("loss scale 32768 (0 updates skipped)") != std::string::npos);
  std::map<std::string, double> epoch1 = parse_json_object(read_lines(metrics).at(0));
  CHECK(epoch1["loss_scale"] == 32768.0);
  CHECK(epoch1["skipped_updates"] == 0.0);
  CHECK(epoch1["test_accuracy"] > 0.3);
  CHECK(fs::exists(dir.path / "ckpt-20.h5"));  // with the scale (tests/checkpoint checks it)
}

TEST_CASE("fashion_mnist_mlp --shard-optimizer-state 2 reports its memory and trains the same bits",
          "[cpu][samples]") {
  if (!sample_built()) return;
  std::vector<std::map<std::string, double>> epochs;
  for (const char* stage : {"0", "2"}) {
    TempDir dir;
    const fs::path metrics = dir.path / "m.json";
    const Result result =
        // The profiler's lines are info messages (ctest runs the tests at warning level).
        run("TANDEM_LOG_LEVEL=info " + kMlp +
            " --replicas 2 --epochs 1 --max-steps 20 --fresh --shard-optimizer-state " + stage +
            " --profile '" + (dir.path / "trace.json").string() + "' --checkpoint-dir '" +
            dir.path.string() + "' --metrics-json '" + metrics.string() + "'");
    INFO(result.output);
    REQUIRE(result.exit_code == 0);
    CHECK(result.output.find("memory per replica (the most any holds): parameters 918.5 KiB") !=
          std::string::npos);
    CHECK(result.output.find(std::string("(shard_optimizer_state ") + stage + ")") !=
          std::string::npos);
    epochs.push_back(parse_json_object(read_lines(metrics).at(0)));
  }
  // Stage 2 trained to the same loss and accuracies, to the bit.
  for (const char* key : {"loss", "train_accuracy", "test_accuracy"}) {
    INFO(key);
    REQUIRE(epochs[0].count(key) == 1);
    REQUIRE(epochs[1].count(key) == 1);
    CHECK(epochs[0][key] == epochs[1][key]);
  }
  CHECK(epochs[0]["test_accuracy"] > 0.3);
}

TEST_CASE("fashion_mnist_mlp --help names every flag", "[cpu][samples]") {
  if (!sample_built()) return;
  const Result help = run(kMlp + " --help");
  INFO(help.output);
  REQUIRE(help.exit_code == 0);
  for (const char* flag :
       {"--epochs", "--per-replica-batch", "--replicas", "--learning-rate", "--seed",
        "--lr-scaling", "--checkpoint-dir", "--fresh", "--metrics-json", "--max-steps",
        "--accumulation-steps", "--precision", "--gradient-compression", "--tensorboard",
        "--shard-optimizer-state", "--help"}) {
    INFO("flag " << flag);
    CHECK(help.output.find(flag) != std::string::npos);
  }
}

TEST_CASE("fashion_mnist_mlp: a bad flag value exits 2 naming the flag and the value",
          "[cpu][samples]") {
  if (!sample_built()) return;
  struct BadFlag {
    std::string arguments;
    std::string flag;
    std::string value;
  };
  for (const BadFlag& bad :
       std::vector<BadFlag>{{"--epochs abc", "--epochs", "abc"},
                            {"--replicas 0", "--replicas", "0"},
                            {"--gradient-compression int8", "--gradient-compression", "int8"},
                            {"--per-replica-batch=-4", "--per-replica-batch", "-4"},
                            {"--learning-rate 0", "--learning-rate", "0"},
                            {"--lr-scaling cubic", "--lr-scaling", "cubic"},
                            {"--max-steps 1.5", "--max-steps", "1.5"},
                            {"--accumulation-steps 0", "--accumulation-steps", "0"},
                            {"--shard-optimizer-state 3", "--shard-optimizer-state", "3"},
                            {"--precision bfloat16", "--precision", "bfloat16"},
                            {"--no-such-flag", "--no-such-flag", ""}}) {
    const Result result = run(kMlp + " " + bad.arguments);
    INFO(bad.arguments << " -> " << result.output);
    CHECK(result.exit_code == 2);
    CHECK(result.output.find(bad.flag) != std::string::npos);
    CHECK(result.output.find("\"" + bad.value) != std::string::npos);
  }
}

TEST_CASE("fashion_mnist_mlp with TANDEM_CHECK_NUMERICS=1 stops at the first NaN loss",
          "[cpu][samples]") {
  if (!sample_built()) return;
  TempDir dir;
  // A learning rate of 1e30 overflows the weights in one update. Without the check the run
  // trains the whole epoch on NaN weights, and only the checkpoint's save, which refuses
  // non-finite weights, stops it; with the check it stops at once naming the replica.
  const std::string arguments =
      " --learning-rate 1e30 --epochs 1 --max-steps 20 --fresh "
      "--checkpoint-dir " +
      (dir.path / "ckpt").string();
  const Result unchecked = run("TANDEM_CHECK_NUMERICS=0 " + kMlp + arguments);
  INFO(unchecked.output);
  CHECK(unchecked.output.find("epoch 1/1: loss ") != std::string::npos);
  CHECK(unchecked.output.find("nan  train acc") != std::string::npos);  // "nan" or "-nan"
  CHECK(unchecked.output.find("non-finite values") != std::string::npos);
  CHECK(unchecked.exit_code != 0);
  const Result checked = run("TANDEM_CHECK_NUMERICS=1 " + kMlp + arguments);
  INFO(checked.output);
  CHECK(checked.exit_code != 0);
  CHECK(checked.output.find("TANDEM_CHECK_NUMERICS: non-finite loss in compute_average_loss on "
                            "replica 0 in strategy.run #2") != std::string::npos);
}

TEST_CASE(
    "fashion_mnist_resnet --sync-bn --shard-optimizer-state 2 writes the unsharded checkpoint's "
    "bits, on 2 and 4 replicas",
    "[cpu][samples]") {
  if (!sample_built()) return;
  for (const char* replicas : {"2", "4"}) {
    INFO(replicas << " replicas");
    std::vector<std::map<std::string, std::string>> files;
    for (const char* stage : {"0", "2"}) {
      TempDir dir;
      const Result result =
          run(kResnet + " --replicas " + replicas + " --sync-bn --epochs 1 --max-steps 6 --fresh " +
              "--shard-optimizer-state " + stage + " --checkpoint-dir '" + dir.path.string() + "'");
      INFO(result.output);
      REQUIRE(result.exit_code == 0);
      files.push_back(tandem::testing::datasets_of((dir.path / "ckpt-6.h5").string()));
    }
    // Weights, batch-norm statistics, Adam's slots, counters and data positions, to the bit.
    CHECK(files[0].size() > 20);
    CHECK(files[0].contains("/optimizer_weights/iteration:0"));
    REQUIRE(files[0].size() == files[1].size());
    for (const auto& [name, bytes] : files[0]) {
      INFO(name);
      REQUIRE(files[1].contains(name));
      CHECK(files[1].at(name) == bytes);
    }
  }
}

TEST_CASE(
    "fashion_mnist_resnet --sync-bn trains on 2 replicas, checkpoints its batch norm statistics "
    "and resumes, and fashion_mnist_cnn trains through the same loop",
    "[cpu][samples]") {
  if (!sample_built()) return;
  TempDir dir;
  const std::string common_flags =
      " --max-steps 15 --replicas 2 --sync-bn --checkpoint-dir '" + dir.path.string() + "'";
  const Result first = run(kResnet + " --epochs 1 --fresh" + common_flags);
  INFO(first.output);
  REQUIRE(first.exit_code == 0);
  CHECK(first.output.find("final test accuracy: ") != std::string::npos);
  CHECK(fs::exists(dir.path / "ckpt-15.h5"));
  const Result second = run(kResnet + " --epochs 2" + common_flags);
  INFO(second.output);
  REQUIRE(second.exit_code == 0);
  CHECK(second.output.find("resumed from ") != std::string::npos);
  CHECK(fs::exists(dir.path / "ckpt-30.h5"));
  TempDir cnn_dir;
  const Result cnn = run(kCnn + " --epochs 1 --max-steps 5 --fresh --checkpoint-dir '" +
                         cnn_dir.path.string() + "'");
  INFO(cnn.output);
  REQUIRE(cnn.exit_code == 0);
  CHECK(fs::exists(cnn_dir.path / "ckpt-5.h5"));
}

TEST_CASE("the --sync-bn flag: listed by the ResNet sample, refused by a model without batch norm",
          "[cpu][samples]") {
  if (!sample_built()) return;
  const Result help = run(kResnet + " --help");
  REQUIRE(help.exit_code == 0);
  CHECK(help.output.find("--sync-bn") != std::string::npos);
  const Result mlp_help = run(kMlp + " --help");
  CHECK(mlp_help.output.find("--sync-bn") == std::string::npos);
  const Result refused = run(kMlp + " --sync-bn");
  INFO(refused.output);
  CHECK(refused.exit_code == 2);
  CHECK(refused.output.find("--sync-bn") != std::string::npos);
}

TEST_CASE("api_tour fits its synthetic regression and a longer run resumes where it stopped",
          "[cpu][samples]") {
  if (!fs::exists(kApiTour)) {
    WARN("skipped: " << kApiTour << " was not built (configure with -DTANDEM_BUILD_SAMPLES=ON)");
    return;
  }
  TempDir dir;
  const std::string flags = " --checkpoint-dir '" + dir.path.string() + "'";
  const Result first = run(kApiTour + " --epochs 10" + flags);
  INFO(first.output);
  REQUIRE(first.exit_code == 0);
  CHECK(first.output.find("epoch 10/10") != std::string::npos);
  CHECK(first.output.find("api_tour: OK") != std::string::npos);
  if (first.output.find("resumed from") != std::string::npos) FAIL("a fresh folder resumed");

  const Result second = run(kApiTour + " --epochs 15" + flags);
  INFO(second.output);
  REQUIRE(second.exit_code == 0);
  CHECK(second.output.find("resumed from") != std::string::npos);
  // Epochs 11 to 15 only: the counter came back with the weights.
  CHECK(second.output.find("epoch 1/15") == std::string::npos);
  CHECK(second.output.find("epoch 15/15") != std::string::npos);
  CHECK(second.output.find("api_tour: OK") != std::string::npos);
}

TEST_CASE(
    "fashion_mnist_cnn --tfrecords writes Fashion-MNIST as PNG Examples where there are "
    "none, trains from them on 2 replicas and resumes",
    "[cpu][samples][tfrecord]") {
  if (!sample_built()) return;
  TempDir records, checkpoints;
  const std::string flags = " --max-steps 5 --replicas 2 --tfrecords '" + records.path.string() +
                            "' --checkpoint-dir '" + checkpoints.path.string() + "'";
  const Result first = run(kCnn + " --epochs 1 --fresh" + flags);
  INFO(first.output);
  REQUIRE(first.exit_code == 0);
  CHECK(first.output.find("writing Fashion-MNIST's 60000 training images") != std::string::npos);
  CHECK(fs::exists(checkpoints.path / "ckpt-5.h5"));
  const std::vector<std::string> files =
      tandem::data::list_files((records.path / "*.tfrecord").string());
  CHECK(files.size() == 8);

  // The first record is the first training image, as PNG bytes, with its label.
  const tandem::data::FeatureSpec spec = {
      {"image", tandem::data::FixedLenFeature{{}, tandem::DType::kUInt8}},
      {"label", tandem::data::FixedLenFeature{{}, tandem::DType::kInt64}}};
  tandem::io::TFRecordReader reader(files[0]);
  std::string record;
  REQUIRE(reader.next(record));
  const tandem::data::Element example = tandem::data::parse_example(record, spec);
  const tandem::data::Element original =
      *tandem::data::fashion_mnist(tandem::data::Split::kTrain).begin();
  const std::vector<uint8_t> pixels =
      tandem::data::decode_image(example[0], 1).to_vector<uint8_t>();
  const std::vector<float> expected = original[0].to_vector<float>();
  REQUIRE(pixels.size() == expected.size());
  size_t differing = 0;
  for (size_t p = 0; p < pixels.size(); ++p)
    differing += std::lround(expected[p] * 255.0f) != pixels[p] ? 1 : 0;
  CHECK(differing == 0);
  CHECK(example[1].item<int64_t>() == original[1].item<int64_t>());

  const Result second = run(kCnn + " --epochs 2" + flags);
  INFO(second.output);
  REQUIRE(second.exit_code == 0);
  CHECK(second.output.find("resumed from ") != std::string::npos);
  CHECK(second.output.find("writing Fashion-MNIST") == std::string::npos);
  CHECK(fs::exists(checkpoints.path / "ckpt-10.h5"));

  const Result refused = run(kMlp + " --tfrecords '" + records.path.string() + "'");
  CHECK(refused.exit_code == 2);
  CHECK(refused.output.find("--tfrecords") != std::string::npos);
}
