// Logging sink: one mutex-protected write per message so lines from replica threads never mix.
#include "tandem/core/logging.h"

#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string_view>

namespace tandem {

namespace {
LogLevel threshold_from_env() {
  const char* value = std::getenv("TANDEM_LOG_LEVEL");
  if (value == nullptr) return LogLevel::kInfo;
  std::string_view v(value);
  if (v == "debug") return LogLevel::kDebug;
  if (v == "warning") return LogLevel::kWarning;
  if (v == "error") return LogLevel::kError;
  return LogLevel::kInfo;
}

const char* level_name(LogLevel level) {
  switch (level) {
    case LogLevel::kDebug: return "debug";
    case LogLevel::kInfo: return "info";
    case LogLevel::kWarning: return "warning";
    case LogLevel::kError: return "error";
  }
  return "?";
}
}  // namespace

bool log_enabled(LogLevel level) {
  static const LogLevel threshold = threshold_from_env();
  return level >= threshold;
}

void log_message(LogLevel level, const std::string& message) {
  static std::mutex mutex;
  std::lock_guard<std::mutex> lock(mutex);
  std::fprintf(stderr, "tandem [%s] %s\n", level_name(level), message.c_str());
  std::fflush(stderr);
}

}  // namespace tandem
