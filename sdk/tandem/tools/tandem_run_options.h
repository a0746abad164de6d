// tandem-run's command line (tandem_run.cpp): the options and their parsing.
#pragma once

#include <cstdio>
#include <optional>
#include <string>
#include <vector>

namespace tandem::run {

inline constexpr int kExitUsage = 2;

struct Options {
  int workers = 0;
  int min_workers = 0;  // 0: --workers
  int max_restarts = 3;
  double grace_seconds = 10;
  double start_window_seconds = 60;
  std::vector<std::string> command;
};

/// Prints the usage to `out`; returns `status`.
int usage(FILE* out, int status);
/// The options, or std::nullopt after saying on stderr what is wrong (-h prints the usage and
/// exits 0).
std::optional<Options> parse(int argc, char** argv);

}  // namespace tandem::run
