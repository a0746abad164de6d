// The samples' --tensorboard logs across a resume: a run stopped between training a step and
// saving the checkpoint that covers it (here the save fails: a folder stands where the
// checkpoint file goes) and then resumed logs every step of every tag exactly once, because the
// samples write a step's figures only after that save. The event files are read back here:
// TFRecord framing around tensorflow.Event messages, decoded as far as tag and step.
#include <catch2/catch.hpp>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "samples/run_program.h"
#include "tandem/core/build_info.h"

namespace fs = std::filesystem;

namespace {

const std::string kMlp =
    std::string(TANDEM_BINARY_DIR) + "/samples/fashion_mnist_mlp/fashion_mnist_mlp";
const std::string kGpt =
    std::string(TANDEM_BINARY_DIR) + "/samples/shakespeare_gpt/shakespeare_gpt";

using tandem::testing::Result;
using tandem::testing::run;

/// A fresh directory under the system's temporary directory, removed at scope exit.
struct TempDir {
  TempDir() {
    std::string pattern = (fs::temp_directory_path() / "tandem_tb_resume_XXXXXX").string();
    REQUIRE(mkdtemp(pattern.data()) != nullptr);
    path = pattern;
  }
  ~TempDir() {
    std::error_code ignored;
    fs::remove_all(path, ignored);
  }
  fs::path path;
};

/// A protocol buffer message read field by field (only what tensorflow.Event needs).
struct Fields {
  std::string_view data;
  size_t at = 0;

  uint64_t varint() {
    uint64_t value = 0;
    for (int shift = 0; at < data.size(); shift += 7) {
      const auto byte = static_cast<uint8_t>(data[at++]);
      value |= uint64_t{byte & 0x7fu} << shift;
      if ((byte & 0x80u) == 0) return value;
    }
    FAIL("a varint runs past the end of its message");
    return 0;
  }
  /// The next field's number and wire type; false at the end.
  bool next(int& number, int& wire) {
    if (at >= data.size()) return false;
    const uint64_t key = varint();
    number = static_cast<int>(key >> 3);
    wire = static_cast<int>(key & 7);
    return true;
  }
  std::string_view bytes() {
    const auto size = static_cast<size_t>(varint());
    REQUIRE(at + size <= data.size());
    const std::string_view out = data.substr(at, size);
    at += size;
    return out;
  }
  void skip(int wire) {
    if (wire == 0) {
      varint();
    } else if (wire == 1) {
      at += 8;
    } else if (wire == 2) {
      bytes();
    } else if (wire == 5) {
      at += 4;
    } else {
      FAIL("wire type " << wire << " in an event");
    }
  }
};

/// How many times each (tag, step) appears in every event file of `logdir`.
std::map<std::pair<std::string, int64_t>, int> logged_points(const fs::path& logdir) {
  std::map<std::pair<std::string, int64_t>, int> points;
  for (const auto& entry : fs::directory_iterator(logdir)) {
    if (entry.path().filename().string().rfind("events.out.tfevents.", 0) != 0) continue;
    std::ifstream in(entry.path(), std::ios::binary);
    const std::string file((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    size_t at = 0;
    while (at < file.size()) {
      // uint64 length, uint32 its CRC, the data, uint32 the data's CRC (all little-endian).
      REQUIRE(at + 12 <= file.size());
      uint64_t length = 0;
      for (int i = 7; i >= 0; --i) length = (length << 8) | static_cast<uint8_t>(file[at + i]);
      REQUIRE(at + 12 + length + 4 <= file.size());
      Fields event{.data = std::string_view(file).substr(at + 12, length), .at = 0};
      at += 12 + length + 4;
      int64_t step = 0;
      std::vector<std::string> tags;
      int number = 0;
      int wire = 0;
      while (event.next(number, wire)) {
        if (number == 2 && wire == 0) {
          step = static_cast<int64_t>(event.varint());
        } else if (number == 5 && wire == 2) {  // Summary
          Fields summary{.data = event.bytes(), .at = 0};
          while (summary.next(number, wire)) {
            if (number != 1 || wire != 2) {
              summary.skip(wire);
              continue;
            }
            Fields value{.data = summary.bytes(), .at = 0};  // Summary.Value
            while (value.next(number, wire)) {
              if (number == 1 && wire == 2) {
                tags.emplace_back(value.bytes());
              } else {
                value.skip(wire);
              }
            }
          }
        } else {
          event.skip(wire);
        }
      }
      for (const std::string& tag : tags) ++points[{tag, step}];
    }
  }
  return points;
}

/// Fails for each (tag, step) logged more than once; returns the steps logged per tag.
std::map<std::string, std::set<int64_t>> steps_logged_once(const fs::path& logdir) {
  std::map<std::string, std::set<int64_t>> steps;
  for (const auto& [point, count] : logged_points(logdir)) {
    INFO(point.first << " at step " << point.second);
    CHECK(count == 1);
    steps[point.first].insert(point.second);
  }
  return steps;
}

/// Puts a folder where the checkpoint file `name` goes, so that saving it fails.
void block_checkpoint(const fs::path& checkpoint_dir, const std::string& name) {
  fs::create_directories(checkpoint_dir / name / "blocked");
}

}  // namespace

TEST_CASE(
    "fashion_mnist_mlp --tensorboard: a run stopped before its epoch's save and resumed logs "
    "each epoch once",
    "[cpu][samples][tensorboard]") {
  if (!fs::exists(kMlp)) {
    WARN("skipped: " << kMlp << " was not built");
    return;
  }
  if (!tandem::build_info().hdf5) {
    WARN("skipped: this build writes no checkpoints (no HDF5)");
    return;
  }
  TempDir dir;
  const fs::path checkpoints = dir.path / "ckpt";
  const fs::path logs = dir.path / "logs";
  const fs::path metrics = dir.path / "m.json";
  const std::string common = kMlp + " --max-steps 4 --per-replica-batch 16 --replicas 1" +
                             " --checkpoint-dir '" + checkpoints.string() + "' --tensorboard '" +
                             logs.string() + "' --metrics-json '" + metrics.string() + "'";
  const Result first = run(common + " --epochs 1 --fresh");
  INFO(first.output);
  REQUIRE(first.exit_code == 0);
  REQUIRE(fs::exists(checkpoints / "ckpt-4.h5"));

  // Epoch 2 trains and evaluates, then its save fails: the run stops before the checkpoint
  // that would cover epoch 2, as a run killed at that moment does.
  block_checkpoint(checkpoints, "ckpt-8.h5");
  const Result stopped = run(common + " --epochs 2");
  INFO(stopped.output);
  REQUIRE(stopped.exit_code != 0);
  CHECK(stopped.output.find("resumed from ") != std::string::npos);
  CHECK(stopped.output.find("epoch 2/2: loss") != std::string::npos);  // it trained epoch 2

  // The next run resumes from epoch 1's checkpoint and trains epoch 2 again.
  fs::remove_all(checkpoints / "ckpt-8.h5");
  const Result resumed = run(common + " --epochs 2");
  INFO(resumed.output);
  REQUIRE(resumed.exit_code == 0);
  CHECK(resumed.output.find("(epoch 2, step 4)") != std::string::npos);
  CHECK(fs::exists(checkpoints / "ckpt-8.h5"));

  const std::map<std::string, std::set<int64_t>> steps = steps_logged_once(logs);
  const std::set<int64_t> both = {1, 2};
  for (const char* tag : {"epoch/loss", "epoch/test_accuracy", "profile/step_ms"}) {
    INFO(tag);
    REQUIRE(steps.count(tag) == 1);
    CHECK(steps.at(tag) == both);
  }
  // The --metrics-json file likewise: one line per epoch.
  std::ifstream in(metrics);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  REQUIRE(lines.size() == 2);
  CHECK(lines[0].rfind("{\"epoch\": 1,", 0) == 0);
  CHECK(lines[1].rfind("{\"epoch\": 2,", 0) == 0);
}

TEST_CASE(
    "shakespeare_gpt --tensorboard: updates logged between saves are written once across a "
    "resume",
    "[cpu][samples][tensorboard]") {
  if (!fs::exists(kGpt)) {
    WARN("skipped: " << kGpt << " was not built");
    return;
  }
  if (!tandem::build_info().hdf5) {
    WARN("skipped: this build writes no checkpoints (no HDF5)");
    return;
  }
  TempDir dir;
  const fs::path text = dir.path / "text.txt";
  {
    std::ofstream out(text);
    for (int i = 0; i < 100; ++i)
      out << "To be, or not to be, that is the question " << i % 7 << ".\n";
  }
  const fs::path checkpoints = dir.path / "ckpt";
  const fs::path logs = dir.path / "logs";
  // A training point every update, a save every 3: updates 4 to 6 are logged before the save
  // that covers them, which fails; the next run resumes at update 3 and trains them again.
  const std::string common = kGpt + " --data '" + text.string() +
                             "' --steps 6 --block 8 --layers 1 --heads 1 --embed 8 --batch 2"
                             " --warmup 1 --eval-interval 3 --eval-batches 1 --log-interval 1"
                             " --replicas 1 --checkpoint-dir '" +
                             checkpoints.string() + "' --tensorboard '" + logs.string() + "'";
  block_checkpoint(checkpoints, "ckpt-6.h5");
  const Result stopped = run(common + " --fresh");
  INFO(stopped.output);
  REQUIRE(stopped.exit_code != 0);
  CHECK(stopped.output.find("update 6: validation loss") != std::string::npos);

  fs::remove_all(checkpoints / "ckpt-6.h5");
  const Result resumed = run(common);
  INFO(resumed.output);
  REQUIRE(resumed.exit_code == 0);
  CHECK(resumed.output.find("at update 3 of 6") != std::string::npos);

  const std::map<std::string, std::set<int64_t>> steps = steps_logged_once(logs);
  REQUIRE(steps.count("train/loss") == 1);
  CHECK(steps.at("train/loss") == std::set<int64_t>{1, 2, 3, 4, 5, 6});
  REQUIRE(steps.count("validation/loss") == 1);
  CHECK(steps.at("validation/loss") == std::set<int64_t>{3, 6});
  // The profile of the resumed run's updates, at its last update.
  REQUIRE(steps.count("profile/step_ms") == 1);
  CHECK(steps.at("profile/step_ms") == std::set<int64_t>{6});
}
