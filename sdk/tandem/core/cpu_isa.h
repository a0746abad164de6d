// The x86 instruction-set class the CPU kernels run: the CPU's own best, or less where the
// environment variable TANDEM_MAX_CPU_ISA caps it (for measuring and testing the kernels of a
// smaller class on a bigger machine, as oneDNN's ONEDNN_MAX_CPU_ISA does for its own). The cap
// reaches Tandem's dispatched loops (ops/cpu/cpu_dispatch.h) and oneDNN alike.
#pragma once

#include <string>
#include <string_view>

namespace tandem {

/// The classes, in increasing order: each runs everything the ones below it run.
enum class CpuIsa {
  kBaseline = 0,        ///< x86-64 (SSE2), or a CPU that is not x86-64
  kAvx2 = 1,            ///< x86-64-v3: AVX2, FMA, F16C
  kAvx512Core = 2,      ///< x86-64-v4: AVX-512 F, BW, DQ, VL (oneDNN's avx512_core)
  kAvx512CoreBf16 = 3,  ///< and AVX512-BF16
  kAvx512CoreAmx = 4,   ///< and AMX (tiles, BF16, INT8)
};

/// The class the CPU kernels use: min(cpu_isa_detected(), the cap). The cap is read once, from
/// TANDEM_MAX_CPU_ISA: avx2, avx512_core, avx512_core_bf16 or avx512_core_amx (unset or empty:
/// no cap; another value is reported once, naming it and the accepted values, and ignored).
CpuIsa cpu_isa();
/// The CPU's own class (cpuid, with the operating system's support of the vector state).
CpuIsa cpu_isa_detected();
/// Whether TANDEM_MAX_CPU_ISA lowered cpu_isa() below the CPU's class.
bool cpu_isa_capped();
/// "baseline", "avx2", "avx512_core", "avx512_core_bf16", "avx512_core_amx".
std::string_view cpu_isa_name(CpuIsa isa);
/// For the start-up log: "avx2" or "avx2 (TANDEM_MAX_CPU_ISA; the CPU has avx512_core_bf16)".
std::string cpu_isa_description();

}  // namespace tandem
