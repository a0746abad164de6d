// The CPU's instruction-set class (cpuid) and TANDEM_MAX_CPU_ISA's cap (cpu_isa.h).
#include "tandem/core/cpu_isa.h"

#if defined(__x86_64__)
#include <cpuid.h>
#endif

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdlib>
#include <optional>

#include "tandem/core/internal/cpu_loop_isa.h"
#include "tandem/core/logging.h"

namespace tandem {

namespace {

constexpr std::array<std::string_view, 5> kNames = {"baseline", "avx2", "avx512_core",
                                                    "avx512_core_bf16", "avx512_core_amx"};

#if defined(__x86_64__)
bool bit(unsigned word, int index) { return ((word >> index) & 1u) != 0; }

/// XCR0: which register states the operating system saves (and so lets programs use).
uint64_t enabled_states() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx) || !bit(ecx, 27)) return 0;  // OSXSAVE
  uint32_t low = 0, high = 0;
  __asm__ volatile("xgetbv" : "=a"(low), "=d"(high) : "c"(0));
  return (static_cast<uint64_t>(high) << 32) | low;
}
#endif

CpuIsa detect() {
#if defined(__x86_64__)
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx)) return CpuIsa::kBaseline;
  const bool fma = bit(ecx, 12), f16c = bit(ecx, 29), avx = bit(ecx, 28);
  const uint64_t states = enabled_states();
  const bool ymm = (states & 0x6) == 0x6;            // SSE and AVX state
  const bool zmm = (states & 0xe6) == 0xe6;          // and the opmask and upper ZMM states
  const bool tiles = (states & 0x60000) == 0x60000;  // AMX tile config and data
  unsigned eax7 = 0, ebx7 = 0, ecx7 = 0, edx7 = 0;
  if (!__get_cpuid_count(7, 0, &eax7, &ebx7, &ecx7, &edx7)) return CpuIsa::kBaseline;
  const bool avx2 = bit(ebx7, 5), bmi1 = bit(ebx7, 3), bmi2 = bit(ebx7, 8);
  if (!(avx && avx2 && fma && f16c && bmi1 && bmi2 && ymm)) return CpuIsa::kBaseline;
  // AVX-512 F, DQ, BW, VL (x86-64-v4; CD comes with them on every such CPU).
  const bool avx512 = bit(ebx7, 16) && bit(ebx7, 17) && bit(ebx7, 30) && bit(ebx7, 31) && zmm;
  if (!avx512) return CpuIsa::kAvx2;
  unsigned eax71 = 0, ebx71 = 0, ecx71 = 0, edx71 = 0;
  const bool bf16 = __get_cpuid_count(7, 1, &eax71, &ebx71, &ecx71, &edx71) && bit(eax71, 5);
  if (!bf16) return CpuIsa::kAvx512Core;
  // AMX-BF16, AMX-TILE, AMX-INT8.
  const bool amx = bit(edx7, 22) && bit(edx7, 24) && bit(edx7, 25) && tiles;
  return amx ? CpuIsa::kAvx512CoreAmx : CpuIsa::kAvx512CoreBf16;
#else
  return CpuIsa::kBaseline;
#endif
}

/// TANDEM_MAX_CPU_ISA's class; nullopt when unset, empty or not a known name (said once).
std::optional<CpuIsa> cap() {
  const char* value = std::getenv("TANDEM_MAX_CPU_ISA");
  if (value == nullptr || value[0] == '\0') return std::nullopt;
  const std::string_view name(value);
  for (size_t i = 1; i < kNames.size(); ++i)
    if (name == kNames[i]) return static_cast<CpuIsa>(i);
  TANDEM_LOG_WARNING("TANDEM_MAX_CPU_ISA=\"", name,
                     "\" is not one of avx2, avx512_core, avx512_core_bf16, avx512_core_amx: "
                     "ignored (the CPU kernels use ",
                     kNames[static_cast<size_t>(detect())], ")");
  return std::nullopt;
}

struct Resolved {
  CpuIsa detected;
  CpuIsa used;
};

const Resolved& resolved() {
  static const Resolved isa = [] {
    const CpuIsa detected = detect();
    const std::optional<CpuIsa> limit = cap();
    return Resolved{detected, limit ? std::min(detected, *limit) : detected};
  }();
  return isa;
}

/// LoopIsaOverride's class, or -1 for none.
std::atomic<int> loop_override{-1};

}  // namespace

CpuIsa cpu_isa() { return resolved().used; }

namespace detail {

CpuIsa cpu_loop_isa() {
  const int limit = loop_override.load(std::memory_order_relaxed);
  const CpuIsa isa = cpu_isa();
  return limit >= 0 ? std::min(isa, static_cast<CpuIsa>(limit)) : isa;
}

LoopIsaOverride::LoopIsaOverride(CpuIsa isa)
    : saved_(loop_override.exchange(static_cast<int>(isa))) {}

LoopIsaOverride::~LoopIsaOverride() { loop_override.store(saved_); }

}  // namespace detail

CpuIsa cpu_isa_detected() { return resolved().detected; }

bool cpu_isa_capped() { return resolved().used != resolved().detected; }

std::string_view cpu_isa_name(CpuIsa isa) { return kNames[static_cast<size_t>(isa)]; }

std::string cpu_isa_description() {
  std::string text(cpu_isa_name(cpu_isa()));
  if (cpu_isa_capped())
    text +=
        " (TANDEM_MAX_CPU_ISA; the CPU has " + std::string(cpu_isa_name(cpu_isa_detected())) + ")";
  return text;
}

}  // namespace tandem
