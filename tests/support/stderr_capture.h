// stderr_of: what a piece of test code (and the threads it starts) wrote to stderr, for tests
// that check Tandem's log lines.
#pragma once

#include <unistd.h>

#include <cstdio>
#include <string>

namespace tandem::testing {

/// Runs `fn` with file descriptor 2 sent to a temporary file and returns what was written.
template <typename Fn>
std::string stderr_of(Fn&& fn) {
  std::fflush(stderr);
  const int saved = ::dup(2);
  std::FILE* file = std::tmpfile();
  ::dup2(::fileno(file), 2);
  fn();
  std::fflush(stderr);
  ::dup2(saved, 2);
  ::close(saved);
  std::rewind(file);
  std::string text;
  char buffer[4096];
  for (size_t n; (n = std::fread(buffer, 1, sizeof buffer, file)) > 0;) text.append(buffer, n);
  std::fclose(file);
  return text;
}

}  // namespace tandem::testing
