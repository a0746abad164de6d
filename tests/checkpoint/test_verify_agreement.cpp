// verify_checkpoint (`tandem-ckpt verify`) and Checkpoint::restore share one validation: over a
// corpus of damaged copies of one checkpoint (fixtures/make_mutations.py: every object and
// attribute deleted or changed, every value made impossible, links added, bits flipped), each
// file is either verified and restored, or refused by both. And a damaged group is damage, never
// "not in the checkpoint".
#include <cstdio>
#include <functional>

#include "checkpoint_test_util.h"
#include "tandem/checkpoint/inspect.h"

namespace td = tandem;
using namespace tandem::checkpoint_testing;
using Catch::Matchers::Contains;

namespace {

/// A checkpoint of a run with everything a checkpoint holds: model (with dropout streams), Adam
/// slots, a gradient accumulation saved mid-way, a data position, a metric, a counter.
void write_base(const std::string& path) {
  TrainingRun run(/*replicas=*/2, /*accumulation_steps=*/2);
  run.train(3);
  REQUIRE(run.optimizer->micro_step() == 1);
  run.checkpoint().write(path);
}

std::string python() { return fs::exists("/usr/bin/python3") ? "/usr/bin/python3" : "python3"; }

/// Lines "<file> <what was changed>" of the corpus made in `dir`.
std::vector<std::pair<std::string, std::string>> make_corpus(const std::string& base,
                                                             const std::string& dir) {
  const std::string list = dir + "/corpus.txt";
  const std::string command = python() + " " + TANDEM_SOURCE_DIR +
                              "/tests/checkpoint/fixtures/make_mutations.py " + base + " " + dir +
                              " >" + list + " 2>" + dir + "/corpus.err";
  const int status = std::system(command.c_str());
  INFO(command << "\n" << read_text(dir + "/corpus.err"));
  REQUIRE(status == 0);
  std::vector<std::pair<std::string, std::string>> files;
  std::istringstream in(read_text(list));
  std::string line;
  while (std::getline(in, line)) {
    const size_t space = line.find(' ');
    REQUIRE(space != std::string::npos);
    files.emplace_back(dir + "/" + line.substr(0, space), line.substr(space + 1));
  }
  return files;
}

}  // namespace

TEST_CASE("verify and restore agree on every file of a corpus of damaged checkpoints",
          "[cpu][checkpoint]") {
  TempDir dir;
  const std::string base = dir.file("base.h5");
  write_base(base);
  INFO(td::verify_checkpoint(base));
  REQUIRE(td::verify_checkpoint(base).empty());
  const auto corpus = make_corpus(base, dir.str());
  REQUIRE(corpus.size() >= 500);

  TrainingRun reader(/*replicas=*/2, /*accumulation_steps=*/2);
  td::Checkpoint checkpoint = reader.checkpoint();
  REQUIRE_NOTHROW(checkpoint.restore(base));
  // A restore refuses a file as damaged (tandem::Error), or as a checkpoint of another program
  // (CheckpointMismatchError: a sound file whose optimizer, metric kind or accumulation steps
  // differ from this run's, which verify cannot know; or one of a newer format, which verify
  // refuses too), or accepts it. Every file verify refuses, restore refuses; every file verify
  // passes, restore accepts or finds another program's.
  int damaged = 0, accepted = 0, another_program = 0;
  std::vector<std::string> disagreements;
  for (const auto& [path, what] : corpus) {
    const std::string verify = td::verify_checkpoint(path);
    std::string restore = "accepts";
    bool restore_damaged = false, restore_accepts = false;
    try {
      checkpoint.restore(path);
      restore_accepts = true;
      ++accepted;
    } catch (const td::CheckpointMismatchError& e) {
      restore = std::string("refuses as another program's (") + e.what() + ")";
      ++another_program;
    } catch (const std::exception& e) {
      restore = std::string("refuses as damaged (") + e.what() + ")";
      restore_damaged = true;
      ++damaged;
    }
    if (verify.empty() ? restore_damaged : restore_accepts)
      disagreements.push_back(what + ": verify " +
                              (verify.empty() ? "passes" : "refuses (" + verify + ")") +
                              ", restore " + restore);
  }
  std::string all;
  for (const std::string& d : disagreements) all += "\n  " + d;
  INFO(disagreements.size() << " of " << corpus.size() << " files disagree:" << all);
  CHECK(disagreements.empty());
  // Most changes are damage; some (a bit flipped in unused space, a value that is possible)
  // leave a checkpoint that restores, and a few make a sound file of another program.
  INFO(damaged << " damaged, " << accepted << " accepted, " << another_program
               << " of another program");
  CHECK(damaged > static_cast<int>(corpus.size()) / 2);
  CHECK(accepted > 0);
  CHECK(another_program < 20);
}

TEST_CASE("a group that cannot be read is damage, not an entry missing from the checkpoint",
          "[cpu][checkpoint]") {
  TempDir dir;
  const std::string path = dir.file("ckpt-1.h5");
  write_base(path);
  // The metric's group /training_state/metrics/train_accuracy: its object header gets a flipped
  // byte (found by its signature "OHDR" after the link's name), so that looking up a link in it
  // fails. Before, that read as "metric not in the checkpoint" and the metric restarted at 0.
  // Every object of the file, by its path.
  std::vector<std::string> objects;
  {
    const td::h5::File file = td::h5::File::open(path);
    std::function<void(const td::h5::Group&, const std::string&)> walk =
        [&](const td::h5::Group& group, const std::string& prefix) {
          for (const std::string& child : group.children()) {
            objects.push_back(prefix + child);
            if (!group.is_dataset(child)) walk(group.open_group(child), prefix + child + "/");
          }
        };
    walk(file.root(), "");
  }
  REQUIRE(objects.size() > 20);
  std::string bytes = read_text(path);
  std::vector<size_t> headers;
  for (size_t at = bytes.find("OHDR"); at != std::string::npos; at = bytes.find("OHDR", at + 1))
    headers.push_back(at);
  REQUIRE(headers.size() > 5);
  int refused_everywhere = 0;
  for (size_t header : headers) {
    std::string damaged = bytes;
    damaged[header + 5] ^= 0x40;  // the header's flags: its checksum no longer matches
    const std::string copy = dir.file("damaged.h5");
    write_text(copy, damaged);
    const std::string verify = td::verify_checkpoint(copy);
    TrainingRun reader(/*replicas=*/2, /*accumulation_steps=*/2);
    CaptureStderr captured;
    std::string restore;
    try {
      reader.checkpoint().restore(copy);
    } catch (const std::exception& e) {
      restore = e.what();
    }
    const std::string log = captured.text();
    // Below the damaged header, every object of the file is either found or an error: never
    // "absent".
    std::vector<std::string> absent;
    try {
      const td::h5::File file = td::h5::File::open(copy);
      for (const std::string& name : objects) {
        try {
          if (!file.root().exists(name)) absent.push_back(name);
        } catch (const std::exception&) {
          // damage raises
        }
      }
    } catch (const std::exception&) {
      // a damaged root or superblock: the file does not open
    }
    INFO("object header at byte " << header << "\nverify: " << verify << "\nrestore: " << restore
                                  << "\nlog: " << log);
    CHECK(verify.empty() == restore.empty());
    CHECK_THAT(log, !Contains("is not in the checkpoint"));
    CHECK(absent == std::vector<std::string>{});
    if (!restore.empty()) ++refused_everywhere;
  }
  CHECK(refused_everywhere == static_cast<int>(headers.size()));
}
