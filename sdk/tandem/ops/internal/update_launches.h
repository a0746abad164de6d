// A count of the CUDA kernel launches of the fused optimizer updates (ops/optimizer_updates.h),
// kept so that tests can check that one optimizer step updates all its variables in one launch.
#pragma once

#include <cstdint>

namespace tandem::ops::internal {

/// Launches issued so far in this process, on every GPU (0 without CUDA or a GPU).
uint64_t optimizer_update_launches();

}  // namespace tandem::ops::internal
