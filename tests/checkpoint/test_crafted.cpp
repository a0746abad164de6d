// Crafted and damaged files, checked in under tests/checkpoint/fixtures/crafted/ (made by
// make_crafted.py from base.h5, a genuine checkpoint this file's "[.make_fixtures]" case
// writes): links that lead elsewhere, data stored outside the file or through a lossy filter,
// data without its checksum, a cycle of hard links, a damaged chunk index, damaged global heaps
// (the libhdf5 1.10.8 inputs of fuzz/regressions), and Keras files with foreign or non-finite
// weights. Every one ends in a clear error naming the file and the object, within seconds, in
// restore, the manager, inspect, verify and latest; none loads other bytes than its own.
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <functional>

#include "checkpoint_test_util.h"
#include "tandem/checkpoint/inspect.h"

namespace td = tandem;
using namespace tandem::checkpoint_testing;
using Catch::Matchers::Contains;

namespace {

std::string crafted(const std::string& name) {
  return (fs::path(TANDEM_SOURCE_DIR) / "tests/checkpoint/fixtures/crafted" / name).string();
}

/// The crafted checkpoints are of the fixtures' model (checkpoint_test_util.h).
using Model = FixtureModel;

/// Runs `body` in a child process that has `seconds` to finish: a hang or a crash in libhdf5
/// fails the test instead of stopping the test program. Returns what the body printed and
/// whether it exited 0.
struct ChildResult {
  bool ok = false;
  bool timed_out = false;
  int signal = 0;
  std::string output;
};
ChildResult in_child(const std::function<std::string()>& body, int seconds = 10) {
  TempDir dir;
  const std::string out = dir.file("out.txt");
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::alarm(static_cast<unsigned>(seconds));
    std::string text;
    int code = 0;
    try {
      text = body();
    } catch (const std::exception& e) {
      text = std::string("raised: ") + e.what();
      code = 3;
    }
    std::ofstream(out) << text;
    std::_Exit(code);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  ChildResult result;
  result.output = read_text(out);
  result.ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
  result.signal = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
  result.timed_out = result.signal == SIGALRM;
  return result;
}

/// A copy of crafted/`name` as `dir`/ckpt-9.h5, the newest checkpoint beside a good ckpt-7.h5,
/// with the state file naming it.
void checkpoint_dir_with(const TempDir& dir, const std::string& name) {
  fs::copy_file(crafted("base.h5"), dir.file("ckpt-7.h5"));
  fs::copy_file(crafted(name), dir.file("ckpt-9.h5"));
  std::ofstream(dir.file("checkpoint"))
      << "model_checkpoint_path: \"ckpt-9.h5\"\nall_model_checkpoint_paths: \"ckpt-7.h5\"\n"
      << "all_model_checkpoint_paths: \"ckpt-9.h5\"\n";
}

/// Every tool on the crafted checkpoint `name`: restore raises `why` naming the file, verify
/// says it, inspect raises or says nothing wrong, latest and the manager fall back to ckpt-7;
/// each within seconds, none crashing.
void check_every_tool(const std::string& name, const std::string& why,
                      const std::function<void(const TempDir&)>& prepare = nullptr) {
  INFO("crafted/" << name);
  TempDir dir;
  checkpoint_dir_with(dir, name);
  if (prepare) prepare(dir);
  const std::string path = dir.file("ckpt-9.h5");
  const ChildResult restore = in_child([&] {
    Model reader;
    reader.checkpoint().restore(path);
    return std::string("restored");
  });
  INFO("restore: " << restore.output);
  CHECK_FALSE(restore.timed_out);
  CHECK(restore.signal == 0);
  CHECK_THAT(restore.output, Contains("raised: ") && Contains(path) && Contains(why));
  const ChildResult verify = in_child([&] { return td::verify_checkpoint(path); });
  INFO("verify: " << verify.output);
  CHECK(verify.ok);
  CHECK_THAT(verify.output, Contains(path) && Contains(why));
  const ChildResult inspect = in_child([&] { return td::inspect_checkpoint(path); });
  INFO("inspect: " << inspect.output);
  CHECK_FALSE(inspect.timed_out);
  CHECK(inspect.signal == 0);
  const ChildResult latest =
      in_child([&] { return td::latest_checkpoint(dir.str()).value_or("none"); });
  INFO("latest: " << latest.output);
  CHECK(latest.ok);
  CHECK(latest.output == dir.file("ckpt-7.h5"));
  const ChildResult manager = in_child([&] {
    Model reader;
    td::CheckpointManager m(reader.checkpoint(), dir.str());
    const std::optional<std::string> restored = m.restore_or_initialize();
    return restored.value_or("none") + " step " + std::to_string(reader.step);
  });
  INFO("manager: " << manager.output);
  CHECK(manager.ok);
  CHECK(manager.output == dir.file("ckpt-7.h5") + " step 7");
}

}  // namespace

TEST_CASE("crafted checkpoints: base.h5, the genuine file they are made from", "[.make_fixtures]") {
  // Writes tests/checkpoint/fixtures/crafted/base.h5; then make_crafted.py makes the rest.
  Model m;
  const std::vector<td::Variable> weights = m.model.weights();
  for (size_t i = 0; i < weights.size(); ++i) {
    td::Tensor copy = weights[i].copy(0);
    copy.copy_from(td::Tensor::from_vector(
        fixture_values(static_cast<int>(i), weights[i].shape().numel()), weights[i].shape()));
  }
  m.optimizer.build(m.model.trainable_variables());
  m.step = 7;
  const std::string path = crafted("base.h5");
  fs::create_directories(fs::path(path).parent_path());
  fs::remove(path);
  m.checkpoint().write(path);
}

TEST_CASE("crafted checkpoints: the genuine one restores, verifies and is the latest",
          "[cpu][checkpoint][crafted]") {
  Model reader;
  reader.checkpoint().restore(crafted("base.h5"));
  CHECK(reader.step == 7);
  CHECK(reader.model.weights()[1].copy(0).to_vector<float>()[12] == 2.012f);
  CHECK(td::verify_checkpoint(crafted("base.h5")).empty());
}

TEST_CASE("crafted checkpoints: links to elsewhere are never followed",
          "[cpu][checkpoint][crafted]") {
  check_every_tool("external_link.h5", "model_weights/dense/dense/kernel:0 is an external link");
  check_every_tool("soft_link.h5", "model_weights/dense/dense/kernel:0 is a soft link");
  // An external link to a FIFO beside the file would block whoever opened it.
  check_every_tool("external_link_fifo.h5", "is an external link", [](const TempDir& dir) {
    REQUIRE(::mkfifo(dir.file("fifo").c_str(), 0600) == 0);
  });
}

TEST_CASE("crafted checkpoints: data outside the file, lossy or without its checksum is refused",
          "[cpu][checkpoint][crafted]") {
  check_every_tool("external_storage_zero.h5", "stored in 1 external file(s), outside the file");
  check_every_tool(
      "external_storage_fifo.h5", "stored in 1 external file(s)",
      [](const TempDir& dir) { REQUIRE(::mkfifo(dir.file("fifo").c_str(), 0600) == 0); });
  check_every_tool("contiguous_kernel.h5", "carries no checksum (contiguous layout)");
  check_every_tool("scaleoffset_kernel.h5", "scaleoffset");
  check_every_tool("chunk_without_filters.h5", "without its filters");
  // A virtual dataset whose unlimited mapping names a FIFO: libhdf5 opens the source (and
  // blocks) as soon as the extent is asked for, so it is refused before.
  check_every_tool(
      "virtual_kernel_fifo.h5", "a virtual dataset (its data comes from other files)",
      [](const TempDir& dir) { REQUIRE(::mkfifo(dir.file("fifo").c_str(), 0600) == 0); });
}

TEST_CASE("crafted checkpoints: a damaged chunk index is caught, not read as zeros",
          "[cpu][checkpoint][crafted]") {
  // A file in the HDF5 1.8 format (as Tandem wrote them before), whose chunk index (a v1
  // B-tree, without a checksum) has one flipped byte: the kernel's one chunk moved from [0, 0]
  // outside the dataset. Read without the check, the kernel was all zeros.
  check_every_tool("v18_chunk_moved.h5", "outside its shape or off the chunk grid");
  // Files Tandem writes now are in the HDF5 1.10 format (superblock 3), whose chunk indexes
  // are checksummed: the kernel's one chunk has its address in the layout message of its
  // (checksummed) object header. Flipping a bit of that address is caught, not followed.
  CHECK(td::h5::File::open(crafted("base.h5")).superblock_version() == 3);
  TempDir dir;
  const std::string path = dir.file("ckpt-7.h5");
  std::string bytes = read_text(crafted("base.h5"));
  // The kernel's data: element j of weight 0 is 1 + j / 1000, so it starts 1.0f, 1.001f.
  const float first[2] = {1.0f, 1.001f};
  const size_t data = bytes.find(std::string(reinterpret_cast<const char*>(first), sizeof(first)));
  REQUIRE(data != std::string::npos);
  const uint64_t address = data;
  const size_t at =
      bytes.find(std::string(reinterpret_cast<const char*>(&address), sizeof(address)));
  REQUIRE(at != std::string::npos);
  bytes[at] = static_cast<char>(bytes[at] ^ 0x40);
  std::ofstream(path, std::ios::binary) << bytes;
  const ChildResult restore = in_child([&] {
    Model reader;
    reader.checkpoint().restore(path);
    return std::string("restored");
  });
  INFO(restore.output);
  CHECK_THAT(restore.output, Contains("raised: ") && Contains(path) && Contains("checksum"));
}

TEST_CASE("crafted checkpoints: a cycle of hard links ends every walk",
          "[cpu][checkpoint][crafted]") {
  // model_weights/dense/loop is a hard link back to model_weights: restore follows the layout,
  // not every link, and restores it; verify and latest walk every group and must stop.
  TempDir dir;
  checkpoint_dir_with(dir, "hard_link_cycle.h5");
  const std::string path = dir.file("ckpt-9.h5");
  const ChildResult verify = in_child([&] { return td::verify_checkpoint(path); });
  INFO(verify.output);
  CHECK(verify.ok);
  CHECK_THAT(verify.output, Contains(path) && Contains("cycle of links"));
  const ChildResult latest =
      in_child([&] { return td::latest_checkpoint(dir.str()).value_or("none"); });
  INFO(latest.output);
  CHECK(latest.ok);
  CHECK(latest.output == dir.file("ckpt-7.h5"));
}

TEST_CASE("crafted checkpoints: libhdf5 1.10.8's global-heap bugs are not reached",
          "[cpu][checkpoint][crafted]") {
  // Old-format checkpoints (variable-length string attributes) whose global heap collection is
  // damaged: libhdf5 loops forever on one, copies past the collection on the other. The heaps
  // are checked before any variable-length read.
  for (const std::string name : {"libhdf5-H5HG-protect-hang", "libhdf5-H5HG_read-memcpy-overlap"}) {
    const std::string input =
        (fs::path(TANDEM_SOURCE_DIR) / "fuzz/regressions/fuzz_checkpoint_restore" / name).string();
    TempDir dir;
    const std::string path = dir.file("ckpt-3.h5");
    fs::copy_file(input, path);
    INFO(name);
    const ChildResult restore = in_child([&] {
      Model reader;
      reader.checkpoint().restore(path);
      return std::string("restored");
    });
    INFO(restore.output);
    CHECK_FALSE(restore.timed_out);
    CHECK(restore.signal == 0);
    CHECK_THAT(restore.output, Contains("global heap collection at offset") && Contains(path));
    for (const auto& tool : std::vector<std::function<std::string()>>{
             [&] { return td::verify_checkpoint(path); },
             [&] { return td::inspect_checkpoint(path); },
             [&] { return td::latest_checkpoint(dir.str()).value_or("none"); }}) {
      const ChildResult result = in_child(tool);
      INFO(result.output);
      CHECK_FALSE(result.timed_out);
      CHECK(result.signal == 0);
    }
  }
}
