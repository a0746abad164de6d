// The instruction-set class Tandem's dispatched CPU loops run (ops/cpu/cpu_dispatch.h):
// cpu_isa(), or lower while a test holds a LoopIsaOverride, so that one process can run every
// build of a loop that its CPU has and compare their bits. oneDNN is not affected.
#pragma once

#include "tandem/core/cpu_isa.h"

namespace tandem::detail {

/// min(cpu_isa(), the innermost LoopIsaOverride's class).
CpuIsa cpu_loop_isa();

/// Runs the dispatched loops at `isa` (at most cpu_isa()) on every thread until destroyed. For
/// tests: not for concurrent use with loops another thread runs.
class LoopIsaOverride {
 public:
  explicit LoopIsaOverride(CpuIsa isa);
  ~LoopIsaOverride();
  LoopIsaOverride(const LoopIsaOverride&) = delete;
  LoopIsaOverride& operator=(const LoopIsaOverride&) = delete;

 private:
  int saved_;
};

}  // namespace tandem::detail
