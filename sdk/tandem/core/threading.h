// The CPU thread budget: how many compute threads (OpenMP/oneDNN) the calling thread may use.
// Each replica thread sets its own share so that replicas x threads never exceed the cores.
// And the floating-point mode replicas compute in: subnormal floats flushed to zero.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tandem {

/// Cores available to this process (sched_getaffinity), at least 1; after
/// bind_process_to_cores, the cores it was bound to.
int hardware_cores();
/// The CPU numbers this process may run on (its affinity), in increasing order.
std::vector<int> process_cores();
/// Restricts every thread of the process (and the threads it starts later) to `cores`, as
/// mpirun's --bind-to core does before a program starts; hardware_cores() then counts them.
/// Raises naming the cores when the kernel refuses.
void bind_process_to_cores(const std::vector<int>& cores);
/// `cpus` grouped by the physical core they belong to (hyperthread siblings together, from
/// /sys/devices/system/cpu/cpuN/topology: package and core id), groups in the order of their
/// first CPU; each CPU its own group where the topology is not readable.
std::vector<std::vector<int>> physical_cores(const std::vector<int>& cpus);
/// "0-3,8" for {0, 1, 2, 3, 8}.
std::string format_cores(const std::vector<int>& cores);
/// What tells processes on one machine apart from those on another: the running kernel's boot
/// id (the same for every process and container on one host, whose CPU numbers are then the
/// same CPUs).
std::string kernel_identity();
/// Sets the compute-thread count for parallel loops started from the calling thread. Called
/// in a task of a CPU replica (strategy.run), it sets that replica's count for the runs after
/// too (by default each replica has cores / replicas).
void set_compute_threads(int threads);
/// The calling thread's compute-thread count (default: all cores).
int compute_threads();

/// The cores of this process (hardware_cores) that other processes left free lately: each core's
/// worth of CPU time that other processes used over the last quarter second or so (read from
/// /proc/stat, less this process's own CPU time), counted once it reaches 0.6 of a core, is taken
/// off; at least 1. A compute team as wide as the cores loses whole time slices whenever one of
/// its threads is descheduled for another process's, while its partners wait at the next
/// barrier: on a machine shared with other work, fewer threads finish sooner. Sampled at most
/// every 250 ms (calls in between return the last figure). TANDEM_SHARE_CORES=0 turns the
/// sampling off: every core counts as free.
int free_cores();
/// False when TANDEM_SHARE_CORES=0: free_cores() is then every core, and
/// request_short_time_slices() does nothing.
bool core_sharing();
/// Sets the calling thread's compute threads to `budget`, or to its share of free_cores() when
/// `sharers` threads split them and that is fewer (at least 1); returns the count set. Replica
/// threads call it as each run starts.
int adapt_compute_threads(int budget, int sharers);
/// Asks the kernel for short time slices (0.1 ms) for the calling thread, keeping its policy and
/// nice value: a thread that sleeps at every hand-off of a step (the training loop's thread, a
/// replica thread) then gets a core as soon as it wakes, instead of after the slice of whatever
/// other process holds it (milliseconds). Linux 6.12 and later (EEVDF's requested slice,
/// sched_setattr's sched_runtime for SCHED_OTHER); no effect on a quiet machine, where each
/// thread has a core. Returns whether the kernel took the request: false on older kernels, for
/// threads with another scheduling policy, and with TANDEM_SHARE_CORES=0.
bool request_short_time_slices();

/// Whether replicas compute with subnormal floats flushed to zero (flush-to-zero and
/// denormals-are-zero on the CPU), as TensorFlow's CPU thread pools run every op. On by default:
/// an Adam slot of a unit that no longer learns decays through the subnormal range, where each
/// operation takes up to a hundred times longer, and a training step slowed down 2-4x. The
/// environment variable TANDEM_FLUSH_DENORMALS=0 keeps IEEE subnormals; set_flush_denormals
/// changes it for runs that start afterwards.
bool flush_denormals();
/// Sets flush_denormals(); returns the previous setting.
bool set_flush_denormals(bool enabled);

/// The calling thread's floating-point control bits that flush subnormals (x86: MXCSR's FTZ and
/// DAZ; AArch64: FPCR's FZ); 0 where the CPU has none. Parallel loops give their team the
/// mode of the thread that starts them.
uint32_t float_mode();
/// Sets the calling thread's flush bits to `mode`, a value float_mode() returned.
void set_float_mode(uint32_t mode);

/// Flushes subnormals on the calling thread while it lives when flush_denormals() says so, and
/// restores the thread's previous mode.
class ScopedFloatMode {
 public:
  ScopedFloatMode();
  ~ScopedFloatMode();
  ScopedFloatMode(const ScopedFloatMode&) = delete;
  ScopedFloatMode& operator=(const ScopedFloatMode&) = delete;

 private:
  uint32_t saved_;
};

}  // namespace tandem
