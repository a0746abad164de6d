// Minimal leveled logging to stderr. TANDEM_LOG_LEVEL=debug|info|warning|error (default info).
#pragma once

#include <string>

#include "tandem/core/error.h"

/// \file
/// Leveled logging to stderr: log_message() and the TANDEM_LOG_* macros; the threshold is
/// TANDEM_LOG_LEVEL=debug|info|warning|error (default info).

namespace tandem {

/// Message severity, lowest first; messages below the threshold (TANDEM_LOG_LEVEL, default
/// info) are dropped.
enum class LogLevel { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3 };

/// Writes "tandem [level] message" to stderr when level passes the threshold (thread safe).
void log_message(LogLevel level, const std::string& message);
/// True when `level` is at or above the threshold (what the TANDEM_LOG macros test first).
bool log_enabled(LogLevel level);

}  // namespace tandem

/// Logs the arguments, streamed one after another, at `level` (a LogLevel); they are only
/// evaluated when the level passes the threshold:
/// `TANDEM_LOG(tandem::LogLevel::kInfo, "step ", step)`.
#define TANDEM_LOG(level, ...)                                                         \
  do {                                                                                 \
    if (::tandem::log_enabled(level))                                                  \
      ::tandem::log_message(level, ::tandem::detail::str_cat(__VA_ARGS__));            \
  } while (0)
/// \name Logging at one level
///@{

/// TANDEM_LOG at LogLevel::kDebug, kInfo, kWarning or kError:
/// `TANDEM_LOG_WARNING("skipped ", n, " updates")`.
#define TANDEM_LOG_DEBUG(...) TANDEM_LOG(::tandem::LogLevel::kDebug, __VA_ARGS__)
#define TANDEM_LOG_INFO(...) TANDEM_LOG(::tandem::LogLevel::kInfo, __VA_ARGS__)
#define TANDEM_LOG_WARNING(...) TANDEM_LOG(::tandem::LogLevel::kWarning, __VA_ARGS__)
#define TANDEM_LOG_ERROR(...) TANDEM_LOG(::tandem::LogLevel::kError, __VA_ARGS__)
///@}
