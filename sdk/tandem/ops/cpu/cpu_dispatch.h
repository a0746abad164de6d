// TANDEM_CPU_DISPATCH: defines a CPU function whose loop is built three times, for x86-64-v4
// (AVX-512), x86-64-v3 (AVX2, FMA, F16C) and the baseline, and that runs the build cpu_isa()
// names on each call, so TANDEM_MAX_CPU_ISA caps it (core/cpu_isa.h; tests lower it further
// with detail::LoopIsaOverride to compare the builds). The loop is a
// TANDEM_CPU_LOOP function (always inlined, so each build compiles it, and the always-inlined
// helpers it calls, for its own instruction set). Only for loops that give the same bits in
// every build: no multiply-add contraction in their files (CMakeLists.txt), lanes that do not
// depend on the vector width. Off x86-64 the function runs the loop as the compiler built it.
#pragma once

#include "tandem/core/internal/cpu_loop_isa.h"

/// Marks the loop a TANDEM_CPU_DISPATCH function runs.
#define TANDEM_CPU_LOOP [[gnu::always_inline]] inline

#if defined(__x86_64__)
/// Defines `void name params` running `loop args` in the build for cpu_isa(): for example
/// TANDEM_CPU_DISPATCH(gelu, gelu_loop, (const float* x, float* y, int64_t n), (x, y, n)).
#define TANDEM_CPU_DISPATCH(name, loop, params, args)                               \
  [[gnu::target("arch=x86-64-v4")]] static void name##_avx512 params { loop args; } \
  [[gnu::target("arch=x86-64-v3")]] static void name##_avx2 params { loop args; }   \
  static void name##_baseline params { loop args; }                                 \
  void name params {                                                                \
    const ::tandem::CpuIsa isa = ::tandem::detail::cpu_loop_isa();                  \
    if (isa >= ::tandem::CpuIsa::kAvx512Core) return name##_avx512 args;            \
    if (isa >= ::tandem::CpuIsa::kAvx2) return name##_avx2 args;                    \
    return name##_baseline args;                                                    \
  }
#else
#define TANDEM_CPU_DISPATCH(name, loop, params, args) \
  void name params { loop args; }
#endif
