// TensorBoard summaries: the file format's pieces (CRC-32C, TFRecord framing, protocol buffer
// fields) against known values; every tag, step and value read back by TensorBoard's own reader
// (EventAccumulator, from the build folder's tensorboard-venv); damaged and truncated files
// skipped by it, not fatal; only worker 0's replica 0 writes.
#include <sys/wait.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include "tandem/io/internal/proto_wire.h"
#include "tandem/io/tfrecord.h"
#include "tandem/summary/internal/event_file.h"
#include "tandem/tandem.h"

namespace td = tandem;
namespace fs = std::filesystem;
namespace ev = tandem::summary::detail;

namespace {

struct TempDir {
  TempDir() {
    std::string pattern = (fs::temp_directory_path() / "tandem_summary_XXXXXX").string();
    path = mkdtemp(pattern.data());
  }
  ~TempDir() {
    std::error_code ignored;
    fs::remove_all(path, ignored);
  }
  std::string path;
};

std::string hex(const std::string& bytes) {
  std::string out;
  char two[3];
  for (const unsigned char c : bytes) {
    std::snprintf(two, sizeof(two), "%02x", c);
    out += two;
  }
  return out;
}

std::vector<std::string> event_files(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& entry : fs::directory_iterator(dir))
    if (entry.path().filename().string().starts_with("events.out.tfevents."))
      out.push_back(entry.path().string());
  std::sort(out.begin(), out.end());
  return out;
}

/// TensorBoard's Python, or "" (the test then skips): $TANDEM_TENSORBOARD_PYTHON, else the
/// build folder's tensorboard-venv (scripts/tensorboard-venv, run by scripts/test).
std::string tensorboard_python() {
  if (const char* chosen = std::getenv("TANDEM_TENSORBOARD_PYTHON")) return chosen;
  const std::string venv = std::string(TANDEM_BINARY_DIR) + "/tensorboard-venv/bin/python";
  return fs::exists(venv) ? venv : "";
}

struct Read {
  int status = -1;
  std::vector<std::string> lines;
};

/// What TensorBoard's reader finds in `dir` (tests/summary/read_events.py).
Read read_with_tensorboard(const std::string& python, const std::string& dir) {
  const std::string command =
      python + " " + TANDEM_SOURCE_DIR + "/tests/summary/read_events.py " + dir + " 2>/dev/null";
  Read out;
  FILE* pipe = popen(command.c_str(), "r");
  REQUIRE(pipe != nullptr);
  char buffer[65536];
  while (std::fgets(buffer, sizeof(buffer), pipe)) {
    std::string line(buffer);
    if (!line.empty() && line.back() == '\n') line.pop_back();
    out.lines.push_back(line);
  }
  const int status = pclose(pipe);
  out.status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return out;
}

/// Python's repr of a float (what read_events.py prints): the shortest text that reads back
/// to the same double.
std::string py_repr(double value) {
  char text[64];
  for (int digits = 1; digits <= 17; ++digits) {
    std::snprintf(text, sizeof(text), "%.*g", digits, value);
    if (std::strtod(text, nullptr) == value) break;
  }
  std::string out = text;
  if (out.find_first_of(".en") == std::string::npos) out += ".0";  // 3 -> 3.0
  return out;
}

}  // namespace

TEST_CASE("CRC-32C, TFRecord framing and protocol buffer fields", "[cpu][summary]") {
  // The CRC-32C check value, and RFC 3720's 32 zero bytes.
  CHECK(tandem::io::crc32c("123456789") == 0xE3069283u);
  CHECK(tandem::io::crc32c(std::string(32, '\0')) == 0x8A9136AAu);
  const uint32_t crc = tandem::io::crc32c("abc");
  CHECK(tandem::io::masked_crc32c("abc") == ((crc >> 15) | (crc << 17)) + 0xa282ead8u);
  const std::string record = ev::tfrecord("hello");
  REQUIRE(record.size() == 8 + 4 + 5 + 4);
  CHECK(hex(record.substr(0, 8)) == "0500000000000000");
  CHECK(record.substr(12, 5) == "hello");
  // Field 1 varint 150 (the protocol buffer documentation's example), field 2 string "testing".
  tandem::io::detail::ProtoWriter p;
  p.varint(1, 150).bytes(2, "testing");
  CHECK(hex(p.data()) == "089601120774657374696e67");
  tandem::io::detail::ProtoWriter f;
  f.fixed32_float(2, 1.0f).fixed64_double(1, 2.0);
  CHECK(hex(f.data()) == "150000803f090000000000000040");
}

TEST_CASE("TensorBoard's reader finds every tag, step and value", "[cpu][summary]") {
  const std::string python = tensorboard_python();
  if (python.empty()) {
    WARN("no tensorboard-venv in the build folder (scripts/tensorboard-venv); skipped");
    return;
  }
  TempDir dir;
  std::vector<std::string> expected;
  {
    // Small files: the writer rotates to a new one every ~300 bytes.
    td::summary::Writer writer(dir.path, {.max_file_bytes = 300});
    for (int step = 0; step < 12; ++step) {
      const double loss = 2.0 / (step + 1), accuracy = 0.1 * step;
      writer.scalar("loss", step, loss);
      writer.scalar("train/accuracy", step, accuracy);
      expected.push_back("scalar loss " + std::to_string(step) + " " +
                         py_repr(static_cast<float>(loss)));
      expected.push_back("scalar train/accuracy " + std::to_string(step) + " " +
                         py_repr(static_cast<float>(accuracy)));
    }
    writer.histogram("weights", 3, td::Tensor::from_vector<float>({0, 1, 1, 2, 3, 5, 8, 9}, {2, 4}),
                     3);
    expected.push_back("histogram weights 3 0.0 9.0 8.0 29.0 185.0 3.0,6.0,9.0 4.0,2.0,2.0");
    writer.histogram("constant", 4, std::vector<double>{0.5, 0.5});
    expected.push_back("histogram constant 4 0.5 0.5 2.0 1.0 0.5 0.5 2.0");
    writer.text("notes", 0, "batch **128**, \"Adam\"\nline 2 é");
    expected.push_back("text notes 0 \"batch **128**, \\\"Adam\\\"\\nline 2 \\u00e9\"");
    writer.flush();
    CHECK(writer.current_file().starts_with(dir.path + "/events.out.tfevents."));
  }
  CHECK(event_files(dir.path).size() >= 3);
  const Read read = read_with_tensorboard(python, dir.path);
  REQUIRE(read.status == 0);
  std::vector<std::string> got = read.lines;
  std::sort(got.begin(), got.end());
  std::sort(expected.begin(), expected.end());
  CHECK(got == expected);
}

TEST_CASE("TensorBoard skips damaged and truncated event files", "[cpu][summary]") {
  const std::string python = tensorboard_python();
  if (python.empty()) {
    WARN("no tensorboard-venv in the build folder (scripts/tensorboard-venv); skipped");
    return;
  }
  TempDir dir;
  {
    td::summary::Writer writer(dir.path);
    for (int step = 0; step < 3; ++step) writer.scalar("loss", step, 1.0 + step);
  }
  const std::vector<std::string> files = event_files(dir.path);
  REQUIRE(files.size() == 1);
  // A record cut short at the end, as a crash mid-write leaves it.
  const std::string cut = ev::tfrecord(ev::scalar_event(0, 3, "loss", 4.0f));
  {
    std::ofstream out(files[0], std::ios::binary | std::ios::app);
    out.write(cut.data(), static_cast<std::streamsize>(cut.size() / 2));
  }
  // Another file whose only record has a damaged byte (its data's CRC no longer matches), and
  // one that is not an event file at all.
  std::string damaged = ev::tfrecord(ev::scalar_event(0, 9, "other", 5.0f));
  damaged[14] = static_cast<char>(damaged[14] ^ 0x40);
  std::ofstream(dir.path + "/events.out.tfevents.1.damaged", std::ios::binary) << damaged;
  std::ofstream(dir.path + "/events.out.tfevents.2.garbage", std::ios::binary) << "not a record";
  const Read read = read_with_tensorboard(python, dir.path);
  INFO("TensorBoard's reader printed:\n"
       << [&] {
            std::string all;
            for (const std::string& line : read.lines) all += line + "\n";
            return all;
          }());
  REQUIRE(read.status == 0);
  // The three whole records are read; nothing of the damaged ones.
  std::vector<std::string> got = read.lines;
  std::sort(got.begin(), got.end());
  CHECK(got ==
        std::vector<std::string>{"scalar loss 0 1.0", "scalar loss 1 2.0", "scalar loss 2 3.0"});
}

TEST_CASE("two writers of one folder never share a file", "[cpu][summary]") {
  TempDir dir;
  td::summary::Writer train(dir.path), eval(dir.path);
  train.scalar("loss", 1, 0.5);
  eval.scalar("accuracy", 1, 0.9);
  train.flush();
  eval.flush();
  REQUIRE(!train.current_file().empty());
  CHECK(train.current_file() != eval.current_file());
  CHECK(event_files(dir.path).size() == 2);
}

TEST_CASE("only worker 0's replica 0 writes", "[cpu][summary]") {
  TempDir dir;
  {
    td::summary::Writer writer(dir.path);
    td::MirroredStrategy strategy = td::MirroredStrategy::cpu(2);
    for (int step = 0; step < 3; ++step) {
      strategy.run([&](td::ReplicaContext& ctx) {
        writer.scalar("replica", step, ctx.replica_id_in_sync_group() + 10);
      });
    }
    CHECK(td::summary::Writer::writes_here());
  }
  const std::vector<std::string> files = event_files(dir.path);
  REQUIRE(files.size() == 1);
  std::ifstream in(files[0], std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), {});
  // The file-version record and one scalar per step, each replica 0's (value 10).
  size_t records = 0;
  for (size_t at = 0; at + 12 <= bytes.size(); ++records) {
    uint64_t length = 0;
    std::memcpy(&length, bytes.data() + at, sizeof(length));
    const std::string payload = bytes.substr(at + 12, length);
    if (records > 0)
      CHECK(payload.find(std::string("\x15\x00\x00\x20\x41", 5)) != std::string::npos);
    at += 12 + length + 4;
  }
  CHECK(records == 4);

  // Another worker (its replicas' global ids start above 0) writes nothing, not even a file.
  TempDir other;
  const int offset = td::process_replica_offset();
  td::set_process_replica_offset(2);
  {
    td::summary::Writer writer(other.path + "/logs");
    CHECK_FALSE(td::summary::Writer::writes_here());
    writer.scalar("loss", 0, 1.0);
    writer.text("notes", 0, "x");
    CHECK(writer.current_file().empty());
  }
  td::set_process_replica_offset(offset);
  CHECK_FALSE(fs::exists(other.path + "/logs"));
}

TEST_CASE("the samples' --tensorboard: each epoch's figures and the profiler's breakdown",
          "[cpu][summary][samples]") {
  const std::string python = tensorboard_python();
  const std::string mlp =
      std::string(TANDEM_BINARY_DIR) + "/samples/fashion_mnist_mlp/fashion_mnist_mlp";
  if (python.empty() || !fs::exists(mlp) ||
      !fs::exists(std::string(td::data::kFashionMnistDirectory) + "/train-images-idx3-ubyte.gz")) {
    WARN("needs the tensorboard-venv, the MLP sample and Fashion-MNIST; skipped");
    return;
  }
  TempDir dir;
  const std::string command = mlp + " --epochs 2 --max-steps 30 --replicas 2 --fresh" +
                              " --checkpoint-dir " + dir.path + "/ckpt --metrics-json " + dir.path +
                              "/metrics.json --tensorboard " + dir.path + "/logs > " + dir.path +
                              "/out.txt 2>&1";
  REQUIRE(std::system(command.c_str()) == 0);
  const Read read = read_with_tensorboard(python, dir.path + "/logs");
  REQUIRE(read.status == 0);
  std::string all;
  for (const std::string& line : read.lines) all += line + "\n";
  INFO(all);
  auto value_of = [&](const std::string& kind, const std::string& tag, int step) {
    const std::string head = kind + " " + tag + " " + std::to_string(step) + " ";
    for (const std::string& line : read.lines)
      if (line.starts_with(head)) return line.substr(head.size());
    return std::string("(missing)");
  };
  std::ifstream metrics(dir.path + "/metrics.json");
  for (int epoch = 1; epoch <= 2; ++epoch) {
    INFO("epoch " << epoch);
    for (const char* tag : {"epoch/loss", "epoch/train_accuracy", "epoch/test_accuracy",
                            "epoch/learning_rate", "epoch/samples_per_sec", "profile/step_ms",
                            "profile/share/compute", "profile/share/comm_data", "profile/speedup",
                            "profile/efficiency", "profile/replica_0/compute_ms",
                            "profile/replica_1/compute_ms", "profile/replica_1/comm_wait_ms"}) {
      INFO(tag);
      CHECK(value_of("scalar", tag, epoch) != "(missing)");
    }
    CHECK(value_of("text", "profile/advice", epoch) != "(missing)");
    CHECK(value_of("scalar", "epoch/learning_rate", epoch) == py_repr(0.001f));
    // The loss TensorBoard shows is the one --metrics-json has (as a float).
    std::string line;
    REQUIRE(std::getline(metrics, line));
    const size_t at = line.find("\"loss\": ");
    REQUIRE(at != std::string::npos);
    const double loss = std::strtod(line.c_str() + at + 8, nullptr);
    CHECK(std::fabs(std::strtod(value_of("scalar", "epoch/loss", epoch).c_str(), nullptr) - loss) <=
          1e-6 * std::fabs(loss) + 1e-6);
  }
}
