// Telling, from one worker process, whether another on the same machine still runs: the
// shared-memory world and the MPI world name a worker that died instead of waiting for it
// until the collective timeout, and the MPI world names one that is stopped (SIGSTOP).
#pragma once

#include <cstdint>
#include <string>

namespace tandem::collectives {

/// Field 22 of /proc/PID/stat (the start time, in clock ticks since boot), and whether the
/// process is still running (not gone, not a zombie waiting for its parent).
bool process_state(int pid, uint64_t* start_time);

/// True when process `pid`, which started at `start_time` (field 22), has ended: its /proc entry
/// is gone, it is a zombie, or the pid now belongs to a process started later. A /proc entry
/// that cannot be read for another reason (no descriptors left, hidepid) is not an end.
bool process_gone(int pid, uint64_t start_time);

/// "dev:inode" of /proc/self/ns/<kind> ("pid", "ipc", "net"); "?" without procfs.
std::string namespace_id(const char* kind);

/// A process, as other processes see it: fixed-size, so that workers can exchange it as bytes.
struct ProcessIdentity {
  int32_t pid = 0;
  uint64_t start_time = 0;
  uint64_t machine = 0;  // a hash of the kernel's boot id and the pid namespace
  char host[64] = {};    // the host name, for messages
};

/// This process.
ProcessIdentity this_process();

/// True when `other` is a process of this machine and pid namespace that has ended (a process
/// elsewhere, or one this process cannot see, is never "ended").
bool process_ended(const ProcessIdentity& other);

/// True when `other` is a process of this machine and pid namespace that is stopped: by a
/// signal (SIGSTOP, SIGTSTP, state "T" in /proc/PID/stat) or by a tracer (state "t"). It runs
/// nothing until continued, so a collective waiting for it cannot complete.
bool process_stopped(const ProcessIdentity& other);

}  // namespace tandem::collectives
