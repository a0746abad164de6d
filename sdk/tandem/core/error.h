// Tandem's exception types and the check macros that raise them with the failing values.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace tandem {

/// Every error Tandem raises derives from this. what() says what went wrong and what to do;
/// where the library noticed it (file:line and the failed condition) is location(), added to
/// what() only when TANDEM_LOG_LEVEL=debug, since it names the library's sources, not the
/// caller's.
class Error : public std::runtime_error {
 public:
  /// An error whose what() is `message` (no location).
  explicit Error(const std::string& message) : std::runtime_error(message) {}
  /// `location`: "file.cpp:57, check failed: condition" (empty when unknown).
  Error(const std::string& message, std::string location)
      : std::runtime_error(message), location_(std::move(location)) {}

  /// Where in the library the error was raised ("variable.cpp:57, check failed: ..."), or "".
  const std::string& location() const { return location_; }

 private:
  std::string location_;
};

/// A feature that was not compiled in; the message names the CMake option that builds it.
class NotBuiltError : public Error {
 public:
  /// `message` names the missing feature and the option that builds it.
  explicit NotBuiltError(const std::string& message) : Error(message) {}
  /// With where the library raised it (see Error::location()).
  NotBuiltError(const std::string& message, std::string location)
      : Error(message, std::move(location)) {}
};

/// A collective did not complete in time (peers diverged or died).
class TimeoutError : public Error {
 public:
  /// `message` names the call, the peers it waited for and the timeout.
  explicit TimeoutError(const std::string& message) : Error(message) {}
  /// With where the library raised it (see Error::location()).
  TimeoutError(const std::string& message, std::string location)
      : Error(message, std::move(location)) {}
};

namespace detail {

/// Concatenates every argument with operator<< (used by the check macros).
template <typename... Args>
std::string str_cat(Args&&... args) {
  std::ostringstream out;
  (out << ... << std::forward<Args>(args));
  return out.str();
}

[[noreturn]] void throw_error(const char* file, int line, const char* condition,
                              const std::string& message);

}  // namespace detail
}  // namespace tandem

/// Throws tandem::Error with file:line, the failed condition and the message parts.
#define TANDEM_CHECK(cond, ...)                                              \
  do {                                                                       \
    if (!(cond)) [[unlikely]] {                                              \
      ::tandem::detail::throw_error(__FILE__, __LINE__, #cond,               \
                                    ::tandem::detail::str_cat(__VA_ARGS__)); \
    }                                                                        \
  } while (0)

/// Unconditionally throws tandem::Error with the message parts.
#define TANDEM_THROW(...) \
  ::tandem::detail::throw_error(__FILE__, __LINE__, nullptr, ::tandem::detail::str_cat(__VA_ARGS__))
