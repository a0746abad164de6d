// Out-of-line error construction, so the check macros stay small at every call site.
#include "tandem/core/error.h"

#include <cstring>

namespace tandem::detail {

void throw_error(const char* file, int line, const char* condition, const std::string& message) {
  const char* base = std::strrchr(file, '/');
  std::ostringstream out;
  out << message;
  out << " [" << (base ? base + 1 : file) << ":" << line;
  if (condition != nullptr) out << ", check failed: " << condition;
  out << "]";
  throw Error(out.str());
}

}  // namespace tandem::detail
