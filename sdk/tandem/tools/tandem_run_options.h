// tandem-run's command line (tandem_run.cpp): the options and their parsing.
#pragma once

#include <cstdio>
#include <optional>
#include <string>
#include <vector>

namespace tandem::run {

inline constexpr int kExitUsage = 2;
/// With --nodes A:B, seconds the rendezvous waits for more machines once A have come.
inline constexpr double kLastCallSeconds = 5;

struct Options {
  int workers = 0;
  int min_workers = 0;  // 0: --workers
  int max_restarts = 3;
  double grace_seconds = 10;
  double start_window_seconds = 60;
  std::vector<std::string> command;
  // Several machines (tandem_run_nodes.h): "" on one machine.
  std::string rendezvous;  // --rdzv HOST:PORT, node 0 serving it
  std::string rendezvous_host;
  int rendezvous_port = 0;
  int min_nodes = 0, max_nodes = 0;  // --nodes A:B (or N)
  int node_rank = -1;
  double join_timeout_seconds = 600;
};

/// Prints the usage to `out`; returns `status`.
int usage(FILE* out, int status);
/// The options, or std::nullopt after saying on stderr what is wrong (-h prints the usage and
/// exits 0).
std::optional<Options> parse(int argc, char** argv);

}  // namespace tandem::run
