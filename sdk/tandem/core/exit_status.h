// The exit statuses Tandem's programs and launcher agree on (docs/fault-tolerance.md).
#pragma once

namespace tandem {

/// The exit status of a worker that saved a checkpoint and stopped because it, or another
/// worker of its job, was asked to stop (SIGTERM, SIGINT): 75, EX_TEMPFAIL ("try again
/// later"). tandem-run restarts a job whose workers exit so without counting a failure.
inline constexpr int kPreemptedExitStatus = 75;

}  // namespace tandem
