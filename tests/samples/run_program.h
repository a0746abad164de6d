// Running a built program from a test: its exit code and everything it printed.
#pragma once

#include <sys/wait.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <string>

namespace tandem::testing {

struct Result {
  int exit_code = -1;
  std::string output;  // stdout and stderr
};

/// Runs `command` through the shell and returns its exit code and output.
inline Result run(const std::string& command) {
  Result result;
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  REQUIRE(pipe != nullptr);
  char buffer[4096];
  size_t n = 0;
  while ((n = fread(buffer, 1, sizeof(buffer), pipe)) > 0) result.output.append(buffer, n);
  const int status = pclose(pipe);
  REQUIRE(WIFEXITED(status));
  result.exit_code = WEXITSTATUS(status);
  return result;
}

}  // namespace tandem::testing
