// Out-of-line error construction, so the check macros stay small at every call site.
#include "tandem/core/error.h"

#include <cstring>

#include "tandem/core/logging.h"

namespace tandem::detail {

void throw_error(const char* file, int line, const char* condition, const std::string& message) {
  const char* base = std::strrchr(file, '/');
  std::string location = str_cat(base ? base + 1 : file, ":", line);
  if (condition != nullptr) location += str_cat(", check failed: ", condition);
  // The library's file and condition help whoever debugs the library, not the caller: the
  // message says what was wrong; the location joins it at TANDEM_LOG_LEVEL=debug.
  if (log_enabled(LogLevel::kDebug)) throw Error(str_cat(message, " [", location, "]"), location);
  throw Error(message, std::move(location));
}

}  // namespace tandem::detail
