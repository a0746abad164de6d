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
/// Sets the compute-thread count for parallel loops started from the calling thread.
void set_compute_threads(int threads);
/// The calling thread's compute-thread count (default: all cores).
int compute_threads();

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
