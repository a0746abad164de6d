// Device parsing and printing. Discovery itself lives in device_discovery.cpp (a dispatch point).
#include "tandem/core/device.h"

#include <charconv>

#include "tandem/core/error.h"

namespace tandem {

Device Device::parse(std::string_view text) {
  std::string_view t = text;
  if (!t.empty() && t.front() == '/') t.remove_prefix(1);
  // Accept TF's "/device:GPU:0" and "/job:.../device:GPU:0" by keeping the last two fields.
  if (auto pos = t.rfind("device:"); pos != std::string_view::npos) t.remove_prefix(pos + 7);
  std::string kind(t.substr(0, t.find(':')));
  for (auto& c : kind) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  int index = 0;
  if (auto colon = t.find(':'); colon != std::string_view::npos) {
    std::string_view digits = t.substr(colon + 1);
    auto [ptr, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), index);
    TANDEM_CHECK(ec == std::errc() && ptr == digits.data() + digits.size() && index >= 0,
                 "device \"", text, "\": the index must be a non-negative integer");
  }
  if (kind == "cpu") return cpu(index);
  if (kind == "cuda" || kind == "gpu") return cuda(index);
  TANDEM_THROW("device \"", text, "\": unknown kind \"", kind, "\" (expected cpu:N or cuda:N)");
}

std::string Device::to_string() const {
  return std::string(is_cpu() ? "cpu:" : "cuda:") + std::to_string(index);
}

std::ostream& operator<<(std::ostream& out, const Device& device) {
  return out << device.to_string();
}

int cuda_device_count() { return static_cast<int>(cuda_availability().devices.size()); }

}  // namespace tandem
