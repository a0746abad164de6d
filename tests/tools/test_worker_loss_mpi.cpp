// Under mpirun, a worker killed mid-epoch is named with its host and pid by every survivor
// within 5 s (a survivor waiting in an exchange, in a blocking MPI call with it, or busy between
// exchanges, such as the chief saving the epoch's checkpoint, sees that its process has ended),
// before mpirun ends the job. Workers on other machines are not watched this way: there
// mpirun's own message names the rank and the node.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cctype>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "tandem/tandem.h"
#include "tools/launcher_test_util.h"

using namespace tandem::launcher_testing;  // NOLINT: the tests' own helpers

namespace {

/// The children of `parent`, oldest first (the ranks mpirun started on this machine).
std::vector<pid_t> children_of(pid_t parent) {
  std::vector<std::pair<unsigned long long, pid_t>> found;
  for (const auto& entry : fs::directory_iterator("/proc")) {
    const std::string name = entry.path().filename().string();
    if (name.empty() || !std::isdigit(static_cast<unsigned char>(name[0]))) continue;
    std::ifstream in(entry.path() / "stat");
    std::string text;
    if (!std::getline(in, text)) continue;
    const size_t close = text.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream fields(text.substr(close + 2));
    std::string state, skip;
    long ppid = 0;
    unsigned long long start = 0;
    fields >> state >> ppid;
    for (int field = 5; field < 22 && fields >> skip; ++field) {
    }
    fields >> start;
    if (ppid == parent) found.emplace_back(start, static_cast<pid_t>(std::stol(name)));
  }
  std::sort(found.begin(), found.end());
  std::vector<pid_t> out;
  for (const auto& [start, pid] : found) out.push_back(pid);
  return out;
}

}  // namespace

TEST_CASE("under mpirun a killed worker is named by every survivor within 5 s",
          "[cpu][tools][mpi]") {
#if !TANDEM_WITH_MPI
  WARN("this build has no Open MPI; skipped");
  return;
#endif
  if (!have_fashion_mnist()) {
    WARN("Fashion-MNIST is not installed; skipped");
    return;
  }
  TempDir dir;
  pid_t victim = 0;
  std::chrono::steady_clock::time_point killed{};
  // Seconds from the kill to each survivor's first message, by the survivor's rank (a survivor
  // may name it twice: while busy outside the exchanges, then in the exchange that fails).
  std::map<int, double> named_after;
  const Run r =
      run({"/usr/bin/env", "OMPI_ALLOW_RUN_AS_ROOT=1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1",
           "OMPI_MCA_rmaps_base_oversubscribe=1", "mpirun", "-np", "3", kMlp, "--epochs", "20",
           "--checkpoint-dir", dir.path},
          [&](const std::string& line, pid_t mpirun) {
            // After the first epoch (progress lines end in \r without a terminal).
            if (!victim && line.find("epoch 1/20: ") != std::string::npos) {
              const std::vector<pid_t> ranks = children_of(mpirun);
              if (ranks.size() == 3 && kill(ranks[1], SIGKILL) == 0) {
                victim = ranks[1];
                killed = std::chrono::steady_clock::now();
              }
            }
            if (!victim) return;
            // "... on worker R: worker P (host, pid V) is gone: its process ended ..."
            const size_t at =
                line.find(", pid " + std::to_string(victim) + ") is gone: its process ended");
            const size_t on = at == std::string::npos ? at : line.rfind("on worker ", at);
            if (on == std::string::npos) return;
            const long rank = leading_number(std::string_view(line).substr(on + 10));
            if (rank >= 0)
              named_after.emplace(
                  static_cast<int>(rank),
                  std::chrono::duration<double>(std::chrono::steady_clock::now() - killed).count());
          });
  INFO(r.text());
  REQUIRE(victim > 0);
  CHECK(r.status != 0);
  REQUIRE(named_after.size() == 2);
  for (const auto& [rank, seconds] : named_after) {
    INFO("worker " << rank);
    CHECK(seconds < 5.0);
  }
}

TEST_CASE("under mpirun a worker that arrived and died is named by one waiting and one busy",
          "[cpu][tools][mpi]") {
#if !TANDEM_WITH_MPI
  WARN("this build has no Open MPI; skipped");
  return;
#endif
  // tests/mpi/test_gone_worker.cpp: worker 1 dies after arriving in an all-reduce; worker 2
  // waits there for worker 0, which sleeps outside any exchange past mpirun's SIGKILL.
  const Run r =
      run({"/usr/bin/env", "OMPI_ALLOW_RUN_AS_ROOT=1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1",
           "OMPI_MCA_rmaps_base_oversubscribe=1", "TANDEM_LOG_LEVEL=warning", "mpirun", "-np", "3",
           std::string(TANDEM_BINARY_DIR) + "/tests/tandem_tests_mpi", "[.gonefault]"});
  INFO(r.text());
  CHECK(r.status != 0);
  REQUIRE(r.has("worker 1 dies"));
  // Worker 2 names it in the exchange worker 1 had arrived in, waiting on for worker 0 (the
  // missing one is what it would raise); worker 0 says it while busy.
  CHECK(std::regex_search(r.text(), std::regex("across 3 workers, on worker 2: worker 1 "
                                               "\\([^)]*\\) is gone: its process ended during "
                                               "the exchange .*; worker 0 not arrived yet")));
  CHECK(std::regex_search(r.text(), std::regex("mpi: across 3 workers, on worker 0: worker 1 "
                                               "\\([^)]*\\) is gone: its process ended")));
  CHECK_FALSE(r.has("worker 0 raised"));  // killed while busy: only the watch could say it
}
