// The TANDEM_CHECK_NUMERICS switch: the environment once, then whatever set_check_numerics says.
#include "tandem/core/check_numerics.h"

#include <atomic>
#include <cstdlib>
#include <cstring>

namespace tandem {
namespace {

bool from_environment() {
  const char* value = std::getenv("TANDEM_CHECK_NUMERICS");
  return value != nullptr && value[0] != '\0' && std::strcmp(value, "0") != 0 &&
         std::strcmp(value, "false") != 0;
}

std::atomic<bool>& flag() {
  static std::atomic<bool> enabled{from_environment()};
  return enabled;
}

}  // namespace

bool check_numerics_enabled() { return flag().load(std::memory_order_relaxed); }

bool set_check_numerics(bool enabled) { return flag().exchange(enabled); }

}  // namespace tandem
